"""Issue 38: the throughput gate bypassed by one failed benchmark round.

Before: rounds of 100, 0, 100, 100 tok/s against a bar of ~1200 made ``rounds_of`` drop all four
(one round was not positive) for the single median figure, and a 12x slowdown was "inconclusive",
exit 0; ``Output token throughput: 0.00`` was "internal error: ValueError: decide needs at least one
round". Now a round with no output is that round's harness failure, dropped on its own; too few
usable rounds is a BenchmarkHarnessFailed (exit 1, never inconclusive, never quarantined); no
benchmark output is an internal error. Generated over where the failed rounds fall, how many there
are, what they hold, and how slow the good ones are.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

from deploy.base.errors import BenchmarkHarnessFailed, ExitCode, Regression
from deploy.config.models import Host, Run
from deploy.local.throughput_gate import MIN_ROUNDS, TooFewRounds, decide, rounds_needed, usable_rounds
from deploy.steps import benchmark, regression_gate
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory
from deploy.host.records import BenchMeasurement, ControlMeasurement
from tests.recording import RecordingTransport, Reply
from tests.fixtures import measured  # noqa: E402

HOST = Host(name="kimi-a", address="10.1.230.174", gpus=2, state_dir="/s")
RUN = Run(name="r", hosts=["kimi-a"], base_model="/m", drafter="/d")
BAR = [1195.0, 1210.0, 1188.0, 1202.0, 1199.0, 1215.0, 1190.0, 1205.0]
NIGHTLY = {"num_prompts": 16, "input_len": 512, "output_len": 256, "max_concurrency": 4, "dataset": "builtin",
           "dataset_sha256": "b" * 64}
#: what a failed round can hold (as measured, or as a hand edit left it)
FAILED = {"zero": 0.0, "int-zero": 0, "negative": -5.0, "nan": math.nan, "inf": math.inf, "none": None,
          "text": "fast", "bool": True}


def _rounds(asked: int, failed_at: tuple[int, ...], failed: object, good: float) -> list:
    return [failed if i in failed_at else good + i for i in range(asked)]


CASES = [(asked, failed_at) for asked in (1, 2, 3, 4, 5, 6, 8, 12)
         for count in range(0, min(asked, 3) + 1)
         for failed_at in itertools.islice(itertools.combinations(range(asked), count), 3)]


#: every placement, each with one kind of failed round (in turn: every kind is met many times)
PLACED = [(asked, failed_at, sorted(FAILED)[i % len(FAILED)]) for i, (asked, failed_at) in enumerate(CASES)]


@pytest.mark.parametrize("speed", [100.0, 600.0, 1190.0], ids=["12x-slower", "2x-slower", "as-fast"])
@pytest.mark.parametrize("asked,failed_at,kind", PLACED, ids=[f"{a}rounds-failed{list(f)}-{k}" for a, f, k in PLACED])
def test_a_failed_round_is_dropped_alone_and_too_few_is_a_harness_failure(asked, failed_at, kind, speed):
    rounds = _rounds(asked, failed_at, FAILED[kind], speed)
    usable = asked - len(failed_at)
    if usable < rounds_needed(asked):
        with pytest.raises(TooFewRounds) as refused:
            decide(rounds, BAR, 0.9)
        message = str(refused.value)
        assert f"{usable} of {asked} benchmark round(s)" in message and "harness failure" in message
        assert f"round {failed_at[0] + 1}:" in message
        return
    verdict = decide(rounds, BAR, 0.9)
    assert len(verdict.now_rounds) == usable  # the failed rounds only, never the good ones
    if speed < 1000 and usable >= MIN_ROUNDS:
        assert verdict.outcome == "regression", verdict.line()  # 12x or 2x slower: conclusive
    if speed == 1190.0:
        assert verdict.outcome == "pass"


@pytest.mark.parametrize("kind", sorted(FAILED))
def test_the_issues_night_100_x_100_100_against_1200_is_never_inconclusive(kind):
    with pytest.raises(TooFewRounds, match=r"3 of 4 benchmark round\(s\).*round 2: "):
        decide([100.0, FAILED[kind], 100.0, 100.0], BAR, 0.9)
    # one more round, the same night: four usable, a conclusive regression
    assert decide([100.0, 0.0, 100.0, 100.0, 101.0], BAR, 0.9).outcome == "regression"


@pytest.mark.parametrize("values,valid,failed", [
    ([1.0, 0, 2.0], [1.0, 2.0], ["round 2: no output (0 tok/s)"]),
    ([False, 3], [3.0], ["round 1: 'False'"]),
    ([], [], []),
    (["1e3"], [], ["round 1: '1e3'"]),
])
def test_usable_rounds_says_which_round_failed_and_how(values, valid, failed):
    assert usable_rounds(values) == (valid, failed)


# --- the regression-gate step: a typed harness failure, exit 1, never inconclusive -------------------


def _gate_ctx(bench_rounds: list, figure: object = None) -> StepContext:
    good = {"draft_tokens": 16, "output_tok_s": 1200.0, "output_tok_s_rounds": BAR, "bench_settings": NIGHTLY}
    record = {"run": "r", "drafter_path": "/s/d", "metrics": good, "argv": ["x"]}
    conn = RecordingTransport(HOST, [Reply("last-good.json", stdout=json.dumps(record))])
    bench = measured(bench_rounds, NIGHTLY, figure)
    return StepContext(host=HOST, run=RUN, settings=regression_gate.Settings(step="regression-gate"), conn=conn,
                       launch_stamp="x", memory=StepMemory(bench=bench))


@pytest.mark.parametrize("rounds", [[100.0, 0.0, 100.0, 100.0], [0.0], [0.0, 0.0, 0.0, 0.0], [0.0] * 12,
                                    [100.0, None, 100.0, 100.0], [100.0, math.nan, 100.0, 100.0],
                                    [100.0, 100.0, 100.0, -1.0], ["x", 100.0, 100.0, 100.0], [True, 0, None, "y"]])
def test_the_gate_step_fails_as_the_harness_never_passes_inconclusive(rounds):
    ctx = _gate_ctx(rounds, figure=100.0)
    with pytest.raises(BenchmarkHarnessFailed) as failed:
        regression_gate.run(ctx)
    assert failed.value.exit_code == ExitCode.FAILED and "kimi-a: throughput gate:" in str(failed.value)
    assert "harness failure" in str(failed.value) and ctx.memory.gate is None


@pytest.mark.parametrize("figure", [0.0, 0, -1.0, math.nan])
def test_no_rounds_recorded_and_a_zero_figure_is_a_harness_failure_not_an_internal_error(figure):
    ctx = _gate_ctx([figure], figure=figure)
    ctx.memory.bench = measured([], NIGHTLY, figure)  # no rounds: the figure alone
    with pytest.raises(BenchmarkHarnessFailed):
        regression_gate.run(ctx)


def test_enough_good_rounds_around_a_failed_one_is_a_conclusive_regression():
    ctx = _gate_ctx([100.0, 0.0, 100.0, 100.0, 99.0, 101.0])
    # the last good deployment measured the same night at the bar's speed (issue 39: a regression needs it)
    ctx.memory.control = ControlMeasurement(settings=NIGHTLY, output_tok_s_rounds=BAR)
    with pytest.raises(Regression):
        regression_gate.run(ctx)
    assert ctx.memory.gate.outcome == "regression" and len(ctx.memory.gate.now_rounds) == 5


# --- the benchmark step: a round with no output ------------------------------------------------------


def _block(tok_s: str, tokens: int = 4096, requests: int = 16) -> str:
    return ("============ Serving Benchmark Result ============\n"
            f"Successful requests:                     {requests}\n"
            "Benchmark duration (s):                  10.00\n"
            f"Total generated tokens:                  {tokens}\n"
            "Request throughput (req/s):              1.60\n"
            f"Output token throughput (tok/s):         {tok_s}\n"
            "Accept length:                           3.10\n"
            "==================================================\n")


def _bench_ctx(outputs: list[str], rounds: int) -> StepContext:
    replies = [Reply("bench_serving", stdout=out, times=1) for out in outputs]
    conn = RecordingTransport(HOST, replies)
    settings = benchmark.Settings(step=benchmark.NAME, rounds=rounds, num_prompts=16, dataset="random-ids")
    return StepContext(host=HOST, run=RUN, settings=settings, conn=conn, launch_stamp="x", memory=StepMemory())


ZERO_ROUNDS = [("0.00", 4096), ("0", 4096), ("0.0", 0), ("1200.00", 0)]


@pytest.mark.parametrize("zero", ZERO_ROUNDS, ids=[f"{t}tok_s-{n}tokens" for t, n in ZERO_ROUNDS])
@pytest.mark.parametrize("rounds,failed_at", [(1, (0,)), (4, (1,)), (4, (0, 3)), (5, (2,)), (6, (0, 1)),
                                              (12, (3,)), (12, (0, 5, 11)), (4, (0, 1, 2, 3))])
def test_the_benchmark_step_drops_a_round_with_no_output_or_fails_as_the_harness(rounds, failed_at, zero):
    outputs = [_block(*zero) if i in failed_at else _block(f"{100.0 + i:.2f}") for i in range(rounds)]
    ctx = _bench_ctx(outputs, rounds)
    usable = rounds - len(failed_at)
    if usable < rounds_needed(rounds):
        with pytest.raises(BenchmarkHarnessFailed) as failed:
            benchmark.run(ctx)
        assert f"{usable} of {rounds} benchmark round(s)" in str(failed.value)
        assert f"round {failed_at[0] + 1}: no output" in str(failed.value)
        return
    outcome = benchmark.run(ctx)
    data = outcome.data
    assert len(data["output_tok_s_rounds"]) == usable and 0 not in data["output_tok_s_rounds"]
    assert data["failed_rounds"] == [f"round {i + 1}: no output (0 tok/s)" for i in failed_at]
    assert data["output_tok_s"] > 0
