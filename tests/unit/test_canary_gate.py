"""The live canary's decision (issue 43): paired intervals, a conservative signed-rank interval,
promote / roll back / watching / inconclusive, and the causes a quarantine records."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from deploy.local.canary_gate import (CAUSES, MIN_INTERVALS, Interval, Settings, Side, decide, detectable_drop,
                                      walsh_interval)


def window(n: int, ratio: float, seed: int = 0, noise: float = 0.05, requests: int = 20, wave: float = 0.15,
           speed_ratio: float | None = None, interval_s: float = 5.0) -> list[Interval]:
    """n intervals of a canary at ``ratio`` of the others' accept length; a traffic wave moves both sides."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        level = 3.0 * (1 + wave * math.sin(i / 4))
        canary = level * ratio * math.exp(rng.gauss(0, noise))
        others = level * math.exp(rng.gauss(0, noise / 2))
        token = 0.02 / level
        s = ratio if speed_ratio is None else speed_ratio
        out.append(Interval((i + 1) * interval_s, Side(canary, requests, token / s * math.exp(rng.gauss(0, 0.02))),
                            Side(others, 2 * requests, token * math.exp(rng.gauss(0, 0.01)))))
    return out


def test_walsh_interval_is_the_brute_force_median_of_walsh_averages_and_brackets_it():
    diffs = [0.3, -0.1, 0.2, 0.05, 0.4, -0.2, 0.1, 0.0, 0.15, 0.25]
    walsh = sorted((a + b) / 2 for a, b in itertools.combinations_with_replacement(diffs, 2))
    estimate, low, high = walsh_interval(diffs, 1.96)
    assert estimate == statistics.median(walsh)
    assert low is not None and high is not None and low <= estimate <= high
    assert low in walsh and high in walsh


def test_too_few_pairs_give_no_interval():
    assert walsh_interval([0.1] * (MIN_INTERVALS - 1), 1.0)[1:] == (None, None)
    with pytest.raises(ValueError):
        walsh_interval([], 1.0)


@pytest.mark.parametrize("seed", range(40))
def test_an_unchanged_drafter_is_never_rolled_back_and_is_promoted_by_the_end(seed):
    intervals = window(120, 1.0, seed)
    settings = Settings(min_requests=200, looks=120)
    for end in range(1, len(intervals) + 1):
        decision = decide(intervals[:end], settings, final=end == len(intervals))
        assert decision.outcome != "roll-back", decision.line()
        if decision.outcome == "promote":
            break
    assert decision.outcome == "promote", decision.line()


@pytest.mark.parametrize("seed,drop", list(itertools.product(range(15), (0.10, 0.20, 0.40))))
def test_a_real_drop_on_live_traffic_is_rolled_back_with_the_acceptance_cause(seed, drop):
    intervals = window(120, 1 - drop, seed, speed_ratio=1.0)
    decision = decide(intervals, Settings(min_requests=200, looks=120))
    assert decision.outcome == "roll-back", decision.line()
    assert decision.figure == "acceptance" and decision.cause == "canary: live acceptance"
    assert decision.comparisons[0].ratio is not None and decision.comparisons[0].ratio < 0.95


def test_a_slower_canary_with_the_same_acceptance_is_rolled_back_for_speed():
    decision = decide(window(120, 1.0, 3, speed_ratio=0.8), Settings(min_requests=200, looks=120))
    assert (decision.outcome, decision.cause) == ("roll-back", CAUSES["speed"])


def test_a_traffic_wave_alone_is_not_a_drop():
    """Both sides move together by +-40%: paired, the difference stays ~0."""
    decision = decide(window(120, 1.0, 5, wave=0.4), Settings(min_requests=200, looks=120), final=True)
    assert decision.outcome == "promote", decision.line()


def test_no_decision_before_the_minimum_requests_then_inconclusive_at_the_end():
    intervals = window(60, 0.5, 1, requests=2)  # 120 canary requests in all
    decision = decide(intervals, Settings(min_requests=200, looks=60))
    assert decision.outcome == "watching" and "fewer than the 200" in decision.why
    final = decide(intervals, Settings(min_requests=200, looks=60), final=True)
    assert final.outcome == "inconclusive" and final.cause is None


def test_intervals_without_traffic_on_a_side_are_not_paired():
    quiet = [Interval(5.0 * i, Side(None, 0), Side(3.0, 40)) for i in range(1, 50)]
    decision = decide(quiet, Settings(min_requests=0, looks=50), final=True)
    assert decision.outcome == "inconclusive" and decision.intervals == 0
    assert "nothing to compare" in decision.why


def test_speed_is_optional_and_acceptance_alone_decides_without_it():
    intervals = [Interval(i.at, Side(i.canary.accept, i.canary.requests), Side(i.others.accept, i.others.requests))
                 for i in window(120, 1.0, 2)]
    decision = decide(intervals, Settings(min_requests=200, looks=120))
    assert decision.outcome == "promote"
    assert decision.comparisons[1].pairs == 0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_figures_must_be_finite_and_positive(bad):
    with pytest.raises(ValueError):
        decide([Interval(1.0, Side(bad, 5), Side(3.0, 5))] * 10, Settings(min_requests=0))


@pytest.mark.parametrize("kwargs", [{"tolerance": 0}, {"tolerance": 0.6}, {"alpha": 0}, {"alpha": 0.5},
                                    {"min_requests": -1}, {"looks": 0}])
def test_settings_are_checked(kwargs):
    with pytest.raises(ValueError):
        Settings(**kwargs)


def test_the_decision_says_its_rule_and_figures():
    decision = decide(window(120, 0.8, 7, speed_ratio=1.0), Settings(min_requests=200, looks=120))
    data = decision.to_dict()
    assert data["outcome"] == "roll-back" and data["cause"] == "canary: live acceptance"
    assert data["comparisons"][0]["figure"] == "acceptance" and data["comparisons"][0]["ratio"] < 0.9
    assert "Hodges-Lehmann" in data["rule"] and "signed-rank" in data["rule"]
    assert "ROLL-BACK" in decision.line() and "canary median" in decision.line()


def test_more_looks_or_fewer_intervals_only_make_the_detectable_drop_larger():
    assert detectable_drop(MIN_INTERVALS - 1, 0.05) == math.inf
    few, many = detectable_drop(20, 0.05), detectable_drop(120, 0.05)
    assert many < few
    assert detectable_drop(30, 0.2, Settings(looks=240)) > detectable_drop(30, 0.2, Settings(looks=60))
    assert many >= 0.05  # never below the tolerance
