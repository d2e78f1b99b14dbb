"""The throughput gate's decision: a regression, noise, or too little to tell. Pure, stdlib only.

The gate before issue 28 compared ONE benchmark sample with the last good deployment's ONE sample
at a 90% floor: over 60 host-nights 3 landed at 89.7-89.9% on deployments that had not changed (a
false exit 12, or on a new good checkpoint a rollback and a quarantine). One sample carries the
run-to-run noise of the benchmark (a noisy neighbour, a cold cache) straight into the verdict.

Now each side is several benchmark rounds (the ``rounds`` setting of the benchmark step; the last
good record keeps its rounds), and the verdict is decided on a robust statistic with its spread:

- ``ratio``: the two-sample Hodges-Lehmann estimate of now / baseline: exp of the median of every
  pairwise difference log(now_i) - log(base_j) (robust to an outlier round, ~95% as efficient as
  the mean on well-behaved samples);
- ``low``..``high``: its distribution-free 95% interval from the Mann-Whitney U distribution (the
  Moses interval: the k-th smallest and largest pairwise differences);
- the rule (``RULE``): **pass** when ratio >= floor; **regression** when ratio < floor AND the
  interval lies wholly below 1 (the slowdown is beyond the rounds' noise); otherwise
  **inconclusive** (ratio below the floor, but the rounds are too spread, or too few, to tell a
  slowdown from noise). Inconclusive neither rolls back nor quarantines; the report says so.

tests/benchmarks/bench_regression_gate.py replays this over 200 unchanged nights and 200 nights with
a 15% slowdown (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

Outcome = Literal["pass", "regression", "inconclusive"]

#: two-sided 95%
Z_95 = 1.959963984540054
#: fewer rounds than this on a side: no interval (the Mann-Whitney interval needs ~4 per side at 95%)
MIN_ROUNDS = 4

RULE = ("ratio = Hodges-Lehmann estimate of now/last good over the rounds, with its 95% Mann-Whitney "
        "interval; pass if ratio >= {floor:.0%}; regression if ratio < {floor:.0%} and the whole interval "
        "is below 100%; otherwise inconclusive (no rollback, no quarantine)")


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    floor: float
    ratio: float
    #: None: too few rounds on a side for an interval
    low: float | None
    high: float | None
    now_median: float
    baseline_median: float
    now_rounds: tuple[float, ...]
    baseline_rounds: tuple[float, ...]

    @property
    def rule(self) -> str:
        return RULE.format(floor=self.floor)

    def why(self) -> str:
        if self.outcome == "pass":
            return f"at or above the minimum {self.floor:.0%}"
        if self.outcome == "regression":
            return f"below the minimum {self.floor:.0%} and the whole interval below 100%: a real slowdown"
        if self.low is None:
            return (f"below the minimum {self.floor:.0%}, but {len(self.now_rounds)} round(s) now and "
                    f"{len(self.baseline_rounds)} for the last good one are too few to tell a slowdown from noise "
                    f"(at least {MIN_ROUNDS} each)")
        return f"below the minimum {self.floor:.0%}, but the interval reaches 100%: the rounds cannot tell it from noise"

    def line(self, label: str = "output tok/s") -> str:
        interval = f" [{self.low:.1%}, {self.high:.1%}]" if self.low is not None and self.high is not None else \
            " [no interval]"
        return (f"{label} median {self.now_median:.2f} ({_spread(self.now_rounds)}) vs last good median "
                f"{self.baseline_median:.2f} ({_spread(self.baseline_rounds)}): {self.ratio:.1%}{interval}, "
                f"{self.outcome.upper()}: {self.why()}")

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "ratio": round(self.ratio, 5),
                "low": None if self.low is None else round(self.low, 5),
                "high": None if self.high is None else round(self.high, 5), "floor": self.floor,
                "now_median": self.now_median, "baseline_median": self.baseline_median,
                "now_rounds": list(self.now_rounds), "baseline_rounds": list(self.baseline_rounds),
                "rule": self.rule}


def _spread(rounds: Sequence[float]) -> str:
    if len(rounds) == 1:
        return "1 round"
    return f"{len(rounds)} rounds, {min(rounds):.2f}-{max(rounds):.2f}"


def moses_rank(n: int, m: int, z: float = Z_95) -> int:
    """k: the interval is the k-th smallest .. k-th largest of the n*m pairwise differences; 0 when the
    samples are too few for an interval at this confidence (normal approximation of U, tie-free)."""
    k = math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))
    return max(0, k)


class TooFewRounds(ValueError):
    """Too few benchmark rounds measured a throughput: the harness failed, the gate cannot judge (issue 38:
    one 0.00 round used to discard the other three and a 12x slowdown passed as "inconclusive")."""


def _usable(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def usable_rounds(rounds: Sequence[object]) -> tuple[list[float], list[str]]:
    """(the rounds that measured a throughput, why each other one did not): a round with no output
    (0.00 tok/s), a negative, non-finite or non-numeric figure is that round's harness failure; it
    never takes the other rounds with it."""
    valid, failed = [], []
    for number, value in enumerate(rounds, 1):
        if _usable(value):
            valid.append(float(value))  # type: ignore[arg-type]
        else:
            what = "no output (0 tok/s)" if value == 0 and not isinstance(value, bool) else f"{str(value)[:40]!r}"
            failed.append(f"round {number}: {what}")
    return valid, failed


def rounds_needed(asked: int) -> int:
    """Usable rounds the gate needs of ``asked``: all of them up to MIN_ROUNDS, MIN_ROUNDS of more."""
    return max(1, min(asked, MIN_ROUNDS))


def require_rounds(rounds: Sequence[object]) -> list[float]:
    """The usable rounds, or TooFewRounds naming the failed ones when fewer than ``rounds_needed``."""
    valid, failed = usable_rounds(rounds)
    needed = rounds_needed(len(rounds))
    if len(valid) < needed:
        raise TooFewRounds(f"{len(valid)} of {len(rounds)} benchmark round(s) measured a throughput "
                           f"({'; '.join(failed[:8]) or 'none recorded'}); the gate needs {needed}: "
                           "a benchmark harness failure, not a verdict")
    return valid


def decide(now: Sequence[object], baseline: Sequence[object], floor: float) -> Verdict:
    """The verdict on throughput rounds ``now`` against the last good deployment's ``baseline`` rounds.

    ``now`` as measured, failed rounds included: a failed round is dropped on its own, and too few usable
    ones raise TooFewRounds (never "inconclusive"). ``baseline``: the last good record's usable rounds."""
    now = require_rounds(now)
    baseline, _ = usable_rounds(baseline)
    if not baseline:
        raise TooFewRounds("the last good record holds no usable throughput round")
    diffs = sorted(math.log(a) - math.log(b) for a in now for b in baseline)
    ratio = math.exp(statistics.median(diffs))
    k = moses_rank(len(now), len(baseline)) if min(len(now), len(baseline)) >= MIN_ROUNDS else 0
    low = math.exp(diffs[k - 1]) if k >= 1 else None
    high = math.exp(diffs[len(diffs) - k]) if k >= 1 else None
    if ratio >= floor:
        outcome: Outcome = "pass"
    elif high is not None and high < 1.0:
        outcome = "regression"
    else:
        outcome = "inconclusive"
    return Verdict(outcome, floor, ratio, low, high, statistics.median(now), statistics.median(baseline),
                   tuple(float(x) for x in now), tuple(float(x) for x in baseline))


def single_sample_rule(now: float, baseline: float, floor: float) -> bool:
    """The gate before issue 28 (one sample each, regression when below the floor): kept for the benchmark's
    comparison only."""
    return now / baseline < floor
