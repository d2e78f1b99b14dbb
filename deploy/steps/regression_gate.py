"""regression-gate: nightly's comparison with the host's last good deployment of the same run.

Fails (exit 12, then the orchestrator rolls back) on a *conclusive* regression: the accept length
measured by verify-acceptance below the configured fraction of the last good record's, or the
output throughput of the benchmark's rounds judged a regression by deploy/local/throughput_gate.py (the
robust ratio below the fraction and its 95% interval wholly below 100%). A throughput ratio below
the fraction that the rounds cannot tell from noise is **inconclusive**: the step passes with that
verdict in its data and detail (no rollback, no quarantine) and record-good keeps the previous bar.

Only like with like: the accept length when both were measured on the same prompt set (sha256,
count, length), the throughput against the last good record's baseline for the same dataset
identity and load (record_good.throughput_baseline: one baseline per dataset, so ``bench --dataset
FILE`` never replaces nightly's); otherwise that number is "not compared", and the outcome says
when nothing was (no comparable baseline). No record yet for this run and draft-token count: this
deployment becomes the baseline (record-good runs next).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from deploy.base.errors import BenchmarkHarnessFailed, Regression
from deploy.facts.server import last_good_path, parse_record, read_record_command, same_deployment
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.host.records import ControlMeasurement, Metrics
from deploy.steps.record_good import measurements, rounds_of, throughput_baseline, throughput_baselines, usable_rounds_of
from deploy.local.throughput_gate import TooFewRounds
from deploy.local.same_night import NightVerdict, judge

NAME = "regression-gate"


class Settings(StepSettings):
    min_accept_fraction: float = Field(default=0.9, gt=0, le=1.0)
    min_throughput_fraction: float = Field(default=0.9, gt=0, le=1.0)


def read_action(ctx: StepContext) -> Command:
    s = ctx.settings
    return Command(description=f"read the last good record to compare: accept length >= {s.min_accept_fraction:g}x, "
                               f"output tok/s >= {s.min_throughput_fraction:g}x",
                   when="doctor did not read it in this run",
                   command=read_record_command(last_good_path(ctx.paths.root)))


def plan(ctx: StepContext) -> list[Command]:
    return [read_action(ctx)]


def _load(settings: dict | None) -> str:
    if not isinstance(settings, dict):
        return "unknown (recorded before deployctl named datasets: random ids)"
    dataset = settings.get("dataset") or settings.get("prompts") or "random-ids"
    digest = settings.get("dataset_sha256") or settings.get("prompts_sha256")
    rest = ", ".join(f"{k} {v}" for k, v in sorted(settings.items())
                     if k not in ("dataset", "dataset_sha256", "dataset_kind", "prompts", "prompts_sha256"))
    return f"{dataset}{f' (sha256 {digest[:12]})' if digest else ''}, {rest}"


@dataclass
class Comparison:
    """The gate's findings, pure: ``regressions`` conclusive (exit 12), ``lines`` every comparison as
    a person reads it, ``throughput`` the throughput verdict when one was made."""

    regressions: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    throughput: NightVerdict | None = None

    @property
    def inconclusive(self) -> bool:
        return self.throughput is not None and self.throughput.outcome == "inconclusive"

    @property
    def drift(self) -> bool:
        return self.throughput is not None and self.throughput.outcome == "drift"

    @property
    def compared(self) -> bool:
        return self.throughput is not None or any(" vs last good " in line for line in self.lines)


def _compare_accept(now: Metrics, good: Metrics, fraction: float, out: Comparison) -> None:
    if now.accept_length is None or good.accept_length is None:
        out.lines.append(f"accept length: not compared (not measured "
                         f"{'now' if now.accept_length is None else 'for the last good one'})")
        return
    if now.verify_settings != good.verify_settings:
        out.lines.append(f"accept length: not compared (no comparable baseline: the last good one was measured on "
                         f"{_load(good.verify_settings)}; now {_load(now.verify_settings)})")
        return
    ratio = now.accept_length / good.accept_length if good.accept_length else float("inf")
    line = (f"accept length {now.accept_length:.2f} vs last good {good.accept_length:.2f} "
            f"({ratio:.0%}, minimum {fraction:.0%})")
    out.lines.append(line)
    if ratio < fraction:
        out.regressions.append(line)


def _control_rounds(control: ControlMeasurement | None, now: Metrics) -> list[float] | None:
    """Tonight's rounds of the last good deployment, when measured at now's load (same-night-control)."""
    if control is None or not control.measured or control.settings != now.bench_settings:
        return None
    rounds = usable_rounds_of(control.output_tok_s_rounds, None)
    return rounds or None


def _compare_throughput(now: Metrics, good: Metrics, fraction: float, out: Comparison,
                        control: ControlMeasurement | None = None,
                        unchanged: bool = False) -> None:
    if now.output_tok_s is None or not throughput_baselines(good):
        out.lines.append(f"output tok/s: not compared (not measured "
                         f"{'now' if now.output_tok_s is None else 'for the last good one'})")
        return
    baseline = throughput_baseline(good, now.bench_settings)
    if baseline is None:
        # a manual `deployctl bench --dataset mine.json` (64 prompts, concurrency 8) measured other baselines,
        # nightly measures the built-in set, 16 at 4: different prompts or loads, not a regression
        known = "; ".join(_load(b.bench_settings) for b in throughput_baselines(good))
        out.lines.append(f"output tok/s: not compared (no comparable baseline: the last good one was measured on "
                         f"{known}; now {_load(now.bench_settings)})")
        return
    measured = now.output_tok_s_rounds
    # as measured, failed rounds included: decide drops each on its own and refuses too few (TooFewRounds;
    # rounds_of would swap a list with one failed round for the single median figure: issue 38)
    tonight = measured if isinstance(measured, list) and measured else [now.output_tok_s]
    # issue 39: judged against the last good deployment measured tonight; the stored bar tells the host's drift
    verdict = judge(tonight, rounds_of(baseline), fraction, control=_control_rounds(control, now),
                    unchanged=unchanged)
    out.throughput = verdict
    line = verdict.line()
    out.lines.append(line)
    if verdict.outcome == "regression":
        out.regressions.append(line)


def compare(now: Metrics, good: Metrics, accept_fraction: float, throughput_fraction: float,
            control: ControlMeasurement | None = None, unchanged: bool = False) -> Comparison:
    """Every comparison of this run's measurements with the last good record's metrics; pure. ``control``: the
    last good deployment's rounds tonight (same-night-control); ``unchanged``: the drafter fingerprint is the
    last good one's (never a slowdown of the checkpoint)."""
    out = Comparison()
    _compare_accept(now, good, accept_fraction, out)
    _compare_throughput(now, good, throughput_fraction, out, control, unchanged)
    return out


def run(ctx: StepContext) -> StepOutcome:
    snapshot = ctx.memory.snapshot
    if snapshot is not None:
        good = snapshot.last_good
    else:
        path = last_good_path(ctx.paths.root)
        good = parse_record(ctx.execute(read_action(ctx)).stdout, ctx.host.name, path)
    now = measurements(ctx)
    if good is None or good.run != ctx.run.name:
        return StepOutcome("ok", "no last good record of this run yet: this deployment becomes the baseline",
                           {"now": now.document()})
    metrics = good.metrics or Metrics()
    if metrics.draft_tokens != ctx.draft_tokens:
        return StepOutcome("ok", f"last good record was measured at {metrics.draft_tokens} draft tokens, "
                                 f"not {ctx.draft_tokens}: not compared", {"now": now.document()})
    deployment = ctx.memory.deployment
    fingerprint = (deployment.drafter_fingerprint if deployment else None) or ctx.memory.drafter_fingerprint
    unchanged = bool(fingerprint) and fingerprint == good.drafter_fingerprint
    try:
        found = compare(now, metrics, ctx.settings.min_accept_fraction, ctx.settings.min_throughput_fraction,
                        control=ctx.memory.control, unchanged=unchanged)
    except TooFewRounds as exc:
        raise BenchmarkHarnessFailed(f"{ctx.host.name}: throughput gate: {exc}") from None
    data = {"now": now.document(), "last_good": metrics.document(), "comparisons": found.lines,
            "same_as_last_good": same_deployment(good, ctx.memory.deployment)}
    if found.throughput is not None:
        # record-good keeps the previous bar after an inconclusive verdict; history and the report show it
        ctx.memory.gate = found.throughput.verdict()
        data["throughput_gate"] = ctx.memory.gate.document()
    if found.regressions:
        raise Regression(f"{ctx.host.name}: regression against the last good deployment "
                         f"({good.drafter_path}): {'; '.join(found.regressions)}")
    if not found.compared:
        return StepOutcome("ok", "no comparable baseline (nothing compared): " + "; ".join(found.lines), data)
    if found.inconclusive:
        return StepOutcome("ok", "INCONCLUSIVE (no rollback, no quarantine; the previous bar is kept): "
                                 + "; ".join(found.lines), data)
    if found.drift:
        return StepOutcome("ok", "HOST DRIFT, not the checkpoint (the deployment stays; the bar is measured again "
                                 "tonight): " + "; ".join(found.lines), data)
    return StepOutcome("ok", "; ".join(found.lines), data)
