"""Nightly's throughput verdict with a same-night control: the host's drift is not the checkpoint's. Pure.

The 12-round gate (deploy/local/throughput_gate.py) fixed the noise WITHIN a night, but it compared
tonight's rounds with a bar measured on another night, under another load on the machine, and blamed
the difference on the checkpoint. Issue 39: over a month of nightlies on three simulated hosts, 11 of 80
host-nights whose checkpoint was good or unchanged ended as "a real slowdown" (exit 12): 7 good
checkpoints rolled back and quarantined, 4 unchanged deployments reported as regressions; the same
unchanged deployment measured 1398, 1634 and 1406 output tok/s on three nights.

So the checkpoint is judged against the last good deployment measured TONIGHT (the control: nightly's
``same-night-control`` step benchmarks the running last good deployment, with the same load, before it
is stopped), and the stored bar only says whether the host drifted:

- **unchanged** (the drafter fingerprint is the last good one's): never a slowdown of the checkpoint.
  Below the bar it is **drift** (the host's speed moved); exit 0, the deployment stays.
- **changed, with a control**: ``decide(now, control)``. **regression** (exit 12, rollback, quarantine)
  only when that is conclusive: the last good deployment is clearly faster tonight. When the new one is
  not clearly slower than the control but below the stored bar, both are: **drift**, the verified new
  deployment stays and its rounds become the bar (annotated). Within the floor of the control: **pass**;
  otherwise **inconclusive** (no rollback, no quarantine, the previous bar kept).
- **changed, no control** (the last good deployment was not what ran, a harness failure, another
  load): a comparison with the stored bar alone cannot tell the host's drift from the checkpoint, so it
  is never a regression: below the floor it is **inconclusive**, saying why.

The control is measured unconditionally when the checkpoint changed (not only when the new rounds look
slow): a host that drifted UP hides a slower checkpoint above the stored bar (25% faster tonight x 15%
slower checkpoint = 106% of the bar). tests/benchmarks/bench_drift_gate.py replays this over nights whose
speed drifts by up to +-25% (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from deploy.host.records import GateVerdict
from deploy.local.throughput_gate import Verdict, decide

Outcome = Literal["pass", "regression", "inconclusive", "drift"]

RULE = ("the new deployment's rounds against the last good deployment's rounds measured tonight before the stop "
        "(Hodges-Lehmann ratio, 95% Mann-Whitney interval): regression only when below {floor:.0%} with the whole "
        "interval below 100%; the stored bar only tells the host's drift; an unchanged fingerprint is never a "
        "regression; without tonight's control, never a regression")


@dataclass(frozen=True)
class NightVerdict:
    outcome: Outcome
    floor: float
    #: the new rounds against the stored bar (what the gate judged before issue 39)
    against_bar: Verdict
    #: the new rounds against tonight's control, when there was one
    against_control: Verdict | None
    #: tonight's control against the stored bar: the host's drift since the bar was measured
    control_vs_bar: Verdict | None
    unchanged: bool
    why: str

    @property
    def rule(self) -> str:
        return RULE.format(floor=self.floor)

    @property
    def drift_ratio(self) -> float | None:
        """The host's speed tonight over the bar's night, as measured (the control; unchanged: the deployment)."""
        if self.control_vs_bar is not None:
            return self.control_vs_bar.ratio
        return self.against_bar.ratio if self.unchanged else None

    def line(self) -> str:
        parts = [f"output tok/s {self.outcome.upper()}: {self.why}"]
        if self.against_control is not None:
            parts.append(f"output tok/s {_figures(self.against_control, 'the last good deployment tonight')}")
        parts.append(f"output tok/s {_figures(self.against_bar, 'the stored bar')}")
        return "; ".join(parts)

    def verdict(self) -> GateVerdict:
        """The verdict as the record the gate hands on (deploy/host/records.py: record-good, history, reports)."""
        return GateVerdict.model_validate({
            "outcome": self.outcome, "floor": self.floor, "why": self.why, "unchanged": self.unchanged,
            "against": "the last good deployment tonight" if self.against_control is not None else "the stored bar",
            "rule": self.rule, "drift_ratio": None if self.drift_ratio is None else round(self.drift_ratio, 5),
            # the figures of the verdict that decided, as before issue 39 (history, reports)
            **{k: v for k, v in (self.against_control or self.against_bar).to_dict().items()
               if k not in ("outcome", "rule", "floor")},
            "against_bar": self.against_bar.to_dict(),
            "against_control": None if self.against_control is None else self.against_control.to_dict(),
            "control_vs_bar": None if self.control_vs_bar is None else self.control_vs_bar.to_dict()})


def _spread(rounds: Sequence[float]) -> str:
    return "1 round" if len(rounds) == 1 else f"{len(rounds)} rounds, {min(rounds):.2f}-{max(rounds):.2f}"


def _figures(verdict: Verdict, against: str) -> str:
    interval = f" [{verdict.low:.1%}, {verdict.high:.1%}]" if verdict.low is not None and verdict.high is not None \
        else " [no interval]"
    return (f"median {verdict.now_median:.2f} ({_spread(verdict.now_rounds)}) vs {against}, median "
            f"{verdict.baseline_median:.2f} ({_spread(verdict.baseline_rounds)}): {verdict.ratio:.1%}{interval}")


def judge(now: Sequence[object], bar: Sequence[float], floor: float, *, control: Sequence[float] | None = None,
          unchanged: bool = False) -> NightVerdict:
    """The night's throughput verdict: ``now`` the new deployment's rounds, ``bar`` the stored bar's, ``control``
    the last good deployment's rounds measured tonight (None: not measured), ``unchanged``: same fingerprint."""
    against_bar = decide(now, bar, floor)
    if unchanged:
        if against_bar.outcome == "pass":
            return NightVerdict("pass", floor, against_bar, None, None, True, f"at or above the minimum {floor:.0%}")
        return NightVerdict("drift", floor, against_bar, None, None, True,
                            f"the deployment is unchanged (same drafter fingerprint) and measures "
                            f"{against_bar.ratio:.1%} of its bar: the host's speed moved, not the checkpoint's")
    if not control:
        if against_bar.outcome == "pass":
            return NightVerdict("pass", floor, against_bar, None, None, False,
                                f"at or above the minimum {floor:.0%} of the stored bar (no same-night control)")
        return NightVerdict("inconclusive", floor, against_bar, None, None, False,
                            f"{against_bar.ratio:.1%} of the stored bar, but no same-night control was measured: "
                            "the host's drift cannot be told from the checkpoint's (no rollback, no quarantine)")
    against_control = decide(now, control, floor)
    control_vs_bar = decide(control, bar, floor)
    drifted = control_vs_bar.ratio < floor
    if against_control.outcome == "regression":
        return NightVerdict("regression", floor, against_bar, against_control, control_vs_bar, False,
                            f"the last good deployment is clearly faster tonight: the new one measures "
                            f"{against_control.ratio:.1%} of it, the whole interval below 100%: a real slowdown")
    if against_bar.ratio < floor and (drifted or against_control.outcome == "pass"):
        return NightVerdict("drift", floor, against_bar, against_control, control_vs_bar, False,
                            f"both are slower than the stored bar (the last good deployment {control_vs_bar.ratio:.1%}, "
                            f"the new one {against_bar.ratio:.1%}) and the new one measures "
                            f"{against_control.ratio:.1%} of the last good one tonight: the host drifted, "
                            "the verified new deployment stays")
    if against_control.outcome == "pass":
        return NightVerdict("pass", floor, against_bar, against_control, control_vs_bar, False,
                            f"{against_control.ratio:.1%} of the last good deployment measured tonight "
                            f"(minimum {floor:.0%})")
    return NightVerdict("inconclusive", floor, against_bar, against_control, control_vs_bar, False,
                        f"{against_control.ratio:.1%} of the last good deployment measured tonight, but the "
                        "interval reaches 100%: the rounds cannot tell it from noise")
