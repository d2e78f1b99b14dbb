"""The canary's decision on live traffic: promote, roll back, or too little to tell. Pure, stdlib only.

Why paired intervals: speculative acceptance depends on what is being generated (the EAGLE-3 paper,
Li et al. 2025, arXiv:2503.01840, reports different acceptance lengths on MT-bench, HumanEval,
GSM8K, Alpaca and CNN/DM for one drafter), and live traffic comes in waves of one kind or another.
Comparing the canary's whole-window average with the others' would mix the drafter's effect with
the traffic's; comparing them interval by interval, both read at the same instants, lets a wave
of code prompts lift both sides of a pair alike, and the difference of the pair is the drafter's.

The test (``RULE``), per figure (``acceptance``: the accept length; ``speed``: the inverse of the
mean per-token latency, where the server reports it):

- each interval with traffic on both sides gives one paired difference
  ``d_i = log(canary_i) - log(others_i)`` (the others: the mean of every other replica's figure,
  weighted by the requests each finished in the interval);
- ``ratio``: exp of the one-sample Hodges-Lehmann estimate of the d_i (the median of their Walsh
  averages (d_i + d_j) / 2, i <= j): robust to an interval a single long request dominated, the
  one-sample form of the estimate the nightly gate uses (deploy/local/throughput_gate.py);
- ``low``..``high``: its distribution-free interval from the Wilcoxon signed-rank distribution
  (normal approximation of the rank sum), each bound one-sided at confidence 1 - alpha_look, where
  alpha_look = alpha / (2 x looks): the decision is looked at after every interval of the window
  (``looks`` = the window's intervals), and there are two figures, so the Bonferroni split keeps
  the chance of any wrong call over the whole window at most ``alpha`` (default 1%) when the
  drafter is unchanged;
- **roll back** (cause "canary: live acceptance" or "canary: live speed") when the whole interval
  lies below 1 AND the estimate is below 1 - ``tolerance`` (a real drop, and not a trivial one);
- **promote** when for every measured figure the interval's low end is at least 1 - ``tolerance``
  (the canary is no worse than the tolerance, at the same confidence);
- otherwise keep watching; at the end of the window, **inconclusive** (the run's setting says
  which way that goes; the default keeps the last good drafter).

No decision before the canary has finished ``min_requests`` requests and ``MIN_INTERVALS`` paired
intervals exist (the signed-rank interval needs a few pairs at this confidence).

``detectable_drop`` gives the smallest drop the rule catches with 95% probability for a given
number of intervals and per-interval spread (docs/fleets.md; tests/benchmarks/bench_canary.py
checks it by simulation).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["promote", "roll-back", "inconclusive", "watching"]
Figure = Literal["acceptance", "speed"]

#: fewer paired intervals than this: no interval at all, whatever the confidence (at the defaults' one-sided
#: 1 - 0.01 / 240 the signed-rank interval itself needs about 20 pairs: ``walsh_interval`` says None before)
MIN_INTERVALS = 8
#: the cause a quarantine records, per figure
CAUSES: dict[str, str] = {"acceptance": "canary: live acceptance", "speed": "canary: live speed"}

RULE = ("per interval with traffic on both sides, d = log(canary / others), both read at the same instant; "
        "ratio = exp(Hodges-Lehmann estimate of d) with its Wilcoxon signed-rank interval, one-sided "
        "{confidence:.3%} per bound (alpha {alpha:.0%} split over {looks} looks and 2 figures); "
        "roll back if the interval is wholly below 100% and ratio < {floor:.0%}; promote if every "
        "figure's low end >= {floor:.0%}; no decision before {min_requests} canary requests and "
        f"{MIN_INTERVALS} intervals; at the end of the window: inconclusive")


@dataclass(frozen=True)
class Side:
    """One side's figures over one interval: ``accept`` the accept length, ``token_s`` the mean
    per-token latency in seconds (None: not reported), ``requests`` finished in the interval."""

    accept: float | None
    requests: float
    token_s: float | None = None


@dataclass(frozen=True)
class Interval:
    #: seconds since the window started, at the interval's end
    at: float
    canary: Side
    others: Side


@dataclass(frozen=True)
class Settings:
    #: a drop smaller than this is not worth a rollback (and a canary within it is promoted)
    tolerance: float = 0.05
    #: the chance of any wrong call over one window on an unchanged drafter, at most
    alpha: float = 0.01
    #: the canary's finished requests before any decision
    min_requests: int = 200
    #: the window's intervals (the number of looks the alpha is split over)
    looks: int = 60

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < 0.5:
            raise ValueError("tolerance must be in (0, 0.5)")
        if not 0 < self.alpha < 0.5:
            raise ValueError("alpha must be in (0, 0.5)")
        if self.min_requests < 0 or self.looks < 1:
            raise ValueError("min_requests must be >= 0 and looks >= 1")

    @property
    def z(self) -> float:
        """The one-sided normal quantile of each bound at each look."""
        return statistics.NormalDist().inv_cdf(1 - self.alpha / (2 * self.looks))


@dataclass(frozen=True)
class Comparison:
    """One figure over the paired intervals."""

    figure: Figure
    pairs: int
    #: exp(HL estimate); None: no pair
    ratio: float | None
    low: float | None
    high: float | None
    canary_median: float | None
    others_median: float | None

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 5)
        return {"figure": self.figure, "pairs": self.pairs, "ratio": r(self.ratio), "low": r(self.low),
                "high": r(self.high), "canary_median": r(self.canary_median), "others_median": r(self.others_median)}


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    #: the figure that decided a rollback (its quarantine cause: ``CAUSES``)
    figure: Figure | None
    why: str
    comparisons: tuple[Comparison, ...]
    canary_requests: float
    others_requests: float
    intervals: int
    elapsed_s: float
    settings: Settings = field(default_factory=Settings)

    @property
    def cause(self) -> str | None:
        return CAUSES[self.figure] if self.outcome == "roll-back" and self.figure is not None else None

    @property
    def rule(self) -> str:
        s = self.settings
        return RULE.format(confidence=1 - s.alpha / (2 * s.looks), alpha=s.alpha, looks=s.looks,
                           floor=1 - s.tolerance, min_requests=s.min_requests)

    def line(self) -> str:
        shown = []
        for c in self.comparisons:
            if c.ratio is None:
                shown.append(f"{c.figure}: no paired interval")
                continue
            bounds = f" [{c.low:.1%}, {c.high:.1%}]" if c.low is not None and c.high is not None else " [no interval]"
            medians = (f" (canary median {c.canary_median:.3g}, others {c.others_median:.3g})"
                       if c.canary_median is not None and c.others_median is not None else "")
            shown.append(f"{c.figure} {c.ratio:.1%}{bounds}{medians}")
        return (f"{'; '.join(shown)} over {self.intervals} interval(s), {self.canary_requests:.0f} canary requests: "
                f"{self.outcome.upper()}: {self.why}")

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "figure": self.figure, "cause": self.cause, "why": self.why,
                "intervals": self.intervals, "canary_requests": round(self.canary_requests, 3),
                "others_requests": round(self.others_requests, 3), "elapsed_s": round(self.elapsed_s, 3),
                "comparisons": [c.to_dict() for c in self.comparisons],
                "tolerance": self.settings.tolerance, "alpha": self.settings.alpha, "rule": self.rule}


def walsh_interval(diffs: Sequence[float], z: float) -> tuple[float, float | None, float | None]:
    """(Hodges-Lehmann estimate, low, high) of the one-sample location of ``diffs``; the bounds are the
    C-th smallest and largest Walsh averages, C from the signed-rank statistic's normal approximation
    (tie-free); None when the pairs are too few for this z."""
    n = len(diffs)
    if n == 0:
        raise ValueError("walsh_interval needs at least one difference")
    walsh = sorted((diffs[i] + diffs[j]) / 2 for i in range(n) for j in range(i, n))
    estimate = statistics.median(walsh)
    total = len(walsh)
    c = math.floor(total / 2 - z * math.sqrt(n * (n + 1) * (2 * n + 1) / 24))
    if n < MIN_INTERVALS or c < 1:
        return estimate, None, None
    return estimate, walsh[c - 1], walsh[total - c]


def _figure_value(side: Side, figure: Figure) -> float | None:
    if figure == "acceptance":
        return side.accept
    return None if side.token_s is None or side.token_s <= 0 else 1.0 / side.token_s


def compare(intervals: Sequence[Interval], figure: Figure, z: float) -> Comparison:
    canary, others, diffs = [], [], []
    for interval in intervals:
        if interval.canary.requests <= 0 or interval.others.requests <= 0:
            continue  # no traffic on a side: nothing of the drafter's was measured in it
        a, b = _figure_value(interval.canary, figure), _figure_value(interval.others, figure)
        if a is None or b is None:
            continue
        if not (math.isfinite(a) and math.isfinite(b) and a > 0 and b > 0):
            raise ValueError(f"{figure}: figures must be finite numbers > 0, got {a!r} and {b!r}")
        canary.append(a)
        others.append(b)
        diffs.append(math.log(a) - math.log(b))
    if not diffs:
        return Comparison(figure, 0, None, None, None, None, None)
    estimate, low, high = walsh_interval(diffs, z)
    return Comparison(figure, len(diffs), math.exp(estimate), None if low is None else math.exp(low),
                      None if high is None else math.exp(high), statistics.median(canary), statistics.median(others))


def decide(intervals: Sequence[Interval], settings: Settings = Settings(), final: bool = False) -> Decision:
    """The decision after ``intervals`` (the window so far); ``final``: the window has ended."""
    canary_requests = sum(i.canary.requests for i in intervals)
    others_requests = sum(i.others.requests for i in intervals)
    elapsed = intervals[-1].at if intervals else 0.0
    z = settings.z
    comparisons = tuple(compare(intervals, figure, z) for figure in ("acceptance", "speed"))
    measured = [c for c in comparisons if c.pairs]
    floor = 1 - settings.tolerance

    def decision(outcome: Outcome, figure: Figure | None, why: str) -> Decision:
        return Decision(outcome, figure, why, comparisons, canary_requests, others_requests,
                        max((c.pairs for c in comparisons), default=0), elapsed, settings)

    acceptance = comparisons[0]
    if not acceptance.pairs:
        why = "no interval had traffic on the canary and the others both: nothing to compare"
        return decision("inconclusive" if final else "watching", None, why)
    if canary_requests < settings.min_requests:
        why = (f"{canary_requests:.0f} canary request(s), fewer than the {settings.min_requests} "
               "a decision needs")
        return decision("inconclusive" if final else "watching", None, why)
    for c in measured:
        if c.high is not None and c.ratio is not None and c.high < 1.0 and c.ratio < floor:
            return decision("roll-back", c.figure,
                            f"the canary's live {c.figure} is {c.ratio:.1%} of the others' and the whole "
                            f"interval is below 100%: a drop beyond the traffic's noise")
    if all(c.low is not None and c.low >= floor for c in measured):
        return decision("promote", None, f"no figure is below {floor:.0%} of the others' at this confidence")
    weakest = min(measured, key=lambda c: c.low if c.low is not None else -1.0)
    if weakest.low is None:
        why = f"{weakest.pairs} paired interval(s), too few for an interval (at least {MIN_INTERVALS})"
    else:
        why = (f"{weakest.figure}: the interval [{weakest.low:.1%}, {weakest.high:.1%}] reaches below "
               f"{floor:.0%} and above 100%: the window's traffic cannot tell")
    return decision("inconclusive" if final else "watching", None, why)


def detectable_drop(intervals: int, spread: float, settings: Settings = Settings(), power: float = 0.95) -> float:
    """The smallest relative drop of one figure the rule rolls back with probability ``power`` after
    ``intervals`` paired intervals whose differences have standard deviation ``spread`` (of the log
    ratio; ~ s * sqrt(1/r_canary + 1/r_others) for r requests per interval and a per-request spread s).
    Normal theory with the signed-rank interval's efficiency (3/pi relative to the mean's), and at
    least the tolerance: an approximation the benchmark checks."""
    if intervals < MIN_INTERVALS:
        return math.inf
    z_power = statistics.NormalDist().inv_cdf(power)
    se = spread * math.sqrt(math.pi / 3) / math.sqrt(intervals)
    significant = (settings.z + z_power) * se  # the interval's high end below 100%
    below_floor = -math.log(1 - settings.tolerance) + z_power * se  # the estimate below 1 - tolerance
    return 1 - math.exp(-max(significant, below_floor))
