"""The throughput gate (issue 28): noise is not a regression, a real slowdown is, and too little to tell
is "inconclusive"; baselines are kept per dataset identity and load."""

from __future__ import annotations

import math

import pytest

from deploy.base.errors import Regression
from deploy.steps import record_good, regression_gate
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory
from deploy.local.throughput_gate import decide, moses_rank
from deploy.host.records import Baseline, BenchMeasurement, ControlMeasurement, Metrics
from deploy.steps import regression_gate as _gate
from tests.recording import RecordingTransport, Reply


def compare(now: dict, good: dict, *args, control: dict | None = None, **kwargs):
    """The gate's comparison of two records' metrics (and tonight's control), given as the JSON the steps write
    (deploy/host/records.py)."""
    return _gate.compare(Metrics.model_validate(now), Metrics.model_validate(good), *args,
                         control=None if control is None else ControlMeasurement.model_validate(control), **kwargs)


from tests.fixtures import GATE_HOST as HOST, GATE_RUN as RUN  # noqa: E402
from tests.fixtures import measured  # noqa: E402
BASE = [1000.0, 1012.0, 991.0, 1005.0, 998.0, 1020.0, 985.0, 1003.0, 996.0, 1009.0, 1001.0, 994.0]
NIGHTLY = {"num_prompts": 16, "input_len": 512, "output_len": 256, "max_concurrency": 4, "dataset": "builtin",
           "dataset_sha256": "b" * 64}
MINE = {"num_prompts": 64, "output_len": 512, "max_concurrency": 8, "dataset": "mine.json", "dataset_sha256": "c" * 64}


def scaled(rounds, factor):
    return [round(x * factor, 2) for x in rounds]


def test_the_issues_night_a_single_sample_at_89_8_percent_is_inconclusive_not_a_regression():
    verdict = decide([898.0], [1000.0], 0.9)
    assert verdict.outcome == "inconclusive" and verdict.low is None and "too few" in verdict.why()
    assert "INCONCLUSIVE" in verdict.line() and "89.8%" in verdict.line()


@pytest.mark.parametrize("factor, outcome", [(1.0, "pass"), (0.95, "pass"), (0.85, "regression"), (0.5, "regression"),
                                             (1.3, "pass")])
def test_rounds_decide_on_the_robust_ratio_and_its_interval(factor, outcome):
    verdict = decide(scaled(BASE, factor), BASE, 0.9)
    assert verdict.outcome == outcome and verdict.ratio == pytest.approx(factor, rel=0.02)
    assert verdict.low is not None and verdict.high is not None and verdict.low <= verdict.ratio <= verdict.high
    assert verdict.to_dict()["rule"].startswith("ratio = Hodges-Lehmann")


def test_one_noisy_round_does_not_move_the_verdict():
    noisy = scaled(BASE, 1.0)
    noisy[3] = 400.0  # a noisy neighbour during one round
    assert decide(noisy, BASE, 0.9).outcome == "pass"
    slow = scaled(BASE, 0.85)
    slow[0] = 2000.0
    assert decide(slow, BASE, 0.9).outcome == "regression"


def test_rounds_too_spread_to_tell_are_inconclusive():
    spread = [1000.0, 600.0, 1300.0, 700.0, 1200.0, 650.0]
    verdict = decide(spread, [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0], 0.9)
    assert verdict.outcome == "inconclusive" and verdict.ratio < 0.9 and verdict.high >= 1.0


# k = the exact two-sided 5% critical value of Mann-Whitney U + 1 (tables: 0 for 4x4, 2 for 5x5, 23 for 10x10,
# 37 for 12x12; none for 3x3)
@pytest.mark.parametrize("n, m, k", [(3, 3, 0), (4, 4, 1), (5, 5, 3), (10, 10, 24), (12, 12, 38)])
def test_moses_rank_matches_the_exact_mann_whitney_tables(n, m, k):
    assert moses_rank(n, m) == k


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0], [math.nan], [math.inf]])
def test_rounds_that_are_not_throughputs_are_refused(bad):
    with pytest.raises(ValueError):
        decide(bad, BASE, 0.9)


def test_the_verdict_is_the_same_for_the_same_rounds():
    assert decide(scaled(BASE, 0.88), BASE, 0.9) == decide(scaled(BASE, 0.88), BASE, 0.9)


# --- the step and the record ----------------------------------------------------------------------


def metrics(rounds, settings=NIGHTLY, **extra):
    """A record's metrics as JSON (the gate's tests); ``M`` reads them as record-good does."""
    return {"draft_tokens": 16, "output_tok_s": sorted(rounds)[len(rounds) // 2], "output_tok_s_rounds": rounds,
            "bench_settings": settings} | extra


M = Metrics.model_validate


def gate_ctx(bench_rounds, good_metrics, settings=NIGHTLY, control=None):
    """``control``: the last good deployment's rounds tonight (same-night-control, issue 39)."""
    import json

    record = {"run": "r", "drafter_path": "/s/d", "metrics": good_metrics, "argv": ["x"]}
    conn = RecordingTransport(HOST, [Reply("last-good.json", stdout=json.dumps(record))])
    memory = StepMemory(bench=measured(bench_rounds, settings),
                        control=None if control is None else ControlMeasurement(output_tok_s_rounds=control,
                                                                                settings=settings))
    return StepContext(host=HOST, run=RUN, settings=regression_gate.Settings(step="regression-gate"), conn=conn,
                       launch_stamp="x", memory=memory)


def test_the_step_passes_an_inconclusive_night_and_hands_the_verdict_on():
    ctx = gate_ctx([880.0], metrics(BASE))
    outcome = regression_gate.run(ctx)
    assert outcome.status == "ok" and outcome.detail.startswith("INCONCLUSIVE")
    assert outcome.data["throughput_gate"]["outcome"] == "inconclusive" == ctx.memory.gate.outcome


def test_the_step_fails_a_conclusive_regression_with_the_figures_and_the_rule():
    # issue 39: a regression needs the last good deployment measured tonight (here: at its bar's speed)
    ctx = gate_ctx(scaled(BASE, 0.85), metrics(BASE), control=scaled(BASE, 1.0))
    with pytest.raises(Regression, match=r"REGRESSION: the last good deployment is clearly faster tonight") as regressed:
        regression_gate.run(ctx)
    assert "12 rounds" in str(regressed.value) and ctx.memory.gate.outcome == "regression"
    # without tonight's control the same rounds cannot blame the checkpoint
    ctx = gate_ctx(scaled(BASE, 0.85), metrics(BASE))
    assert regression_gate.run(ctx).detail.startswith("INCONCLUSIVE") and "no same-night control" in ctx.memory.gate.why


def test_a_bench_on_another_dataset_never_replaces_the_gates_baseline():
    good = metrics(BASE) | {"throughput_baselines": [
        {"output_tok_s": 1000.0, "output_tok_s_rounds": BASE, "bench_settings": NIGHTLY},
        {"output_tok_s": 400.0, "output_tok_s_rounds": [400.0] * 12, "bench_settings": MINE}]}
    # nightly on the built-in set is compared with the built-in baseline, not with mine.json's 400
    assert compare({"output_tok_s": 990.0, "output_tok_s_rounds": BASE, "bench_settings": NIGHTLY}, good,
                   0.9, 0.9).throughput.outcome == "pass"
    assert compare({"output_tok_s": 380.0, "output_tok_s_rounds": scaled(BASE, 0.38), "bench_settings": MINE}, good,
                   0.9, 0.9).throughput.against_bar.ratio == pytest.approx(0.95, rel=0.02)


def test_record_good_adds_a_datasets_baseline_beside_the_others():
    nightly = M(metrics(BASE))
    after_bench = record_good.keep_bar(record_good.with_baselines(nightly, None, False, "fp1"),
                                       M(metrics([400.0] * 12, MINE)), fingerprint="fp1")
    entries = record_good.throughput_baselines(after_bench)
    assert [e.bench_settings for e in entries] == [NIGHTLY, MINE]
    assert record_good.throughput_baseline(after_bench, NIGHTLY).output_tok_s_rounds == BASE
    assert entries[0].drafter_fingerprint == "fp1"


def test_same_deployment_keeps_its_bar_and_a_legacy_single_round_bar_is_filled_in():
    kept = record_good.keep_bar(record_good.with_baselines(M(metrics(BASE)), None, False), M(metrics(scaled(BASE, 0.93))))
    assert record_good.throughput_baseline(kept, NIGHTLY).output_tok_s_rounds == BASE
    legacy = M({"draft_tokens": 16, "output_tok_s": 1000.0, "bench_settings": NIGHTLY})
    filled = record_good.keep_bar(legacy, M(metrics(scaled(BASE, 0.97))))
    assert record_good.throughput_baseline(filled, NIGHTLY).output_tok_s_rounds == scaled(BASE, 0.97)


def test_an_inconclusive_new_deployment_keeps_the_previous_bar():
    before = record_good.with_baselines(M(metrics(BASE)), None, False, "old")
    kept = record_good.with_baselines(M(metrics(scaled(BASE, 0.88))), before, True, "new")
    assert record_good.throughput_baseline(kept, NIGHTLY).drafter_fingerprint == "old"
    replaced = record_good.with_baselines(M(metrics(scaled(BASE, 0.95))), before, False, "new")
    assert record_good.throughput_baseline(replaced, NIGHTLY).drafter_fingerprint == "new"


@pytest.mark.parametrize("entry", [{"output_tok_s": "fast"}, {"output_tok_s": 0}, {"output_tok_s_rounds": [1, "x"]},
                                   {"output_tok_s": True}, {"output_tok_s": float("nan")}])
def test_a_hand_edited_baseline_is_not_trusted_into_the_statistics(entry):
    assert record_good.rounds_of(Baseline.model_validate(entry)) == []
    assert record_good.throughput_baselines(M({"throughput_baselines": [entry]})) == []
    assert compare({"output_tok_s": 900.0, "bench_settings": NIGHTLY}, {"throughput_baselines": [entry]}, 0.9,
                   0.9).throughput is None


# --- the verdict reaches every report ---------------------------------------------------------------


def _gated_report():
    from deploy.engine.records import HostReport, StepRecord
    from deploy.local.same_night import judge

    verdict = judge([880.0] * 2, BASE, 0.9).verdict()  # 2 rounds now: inconclusive, no interval
    report = HostReport(HOST, steps=[StepRecord("benchmark", "ok", data={"output_tok_s": 880.0,
                                                                        "output_tok_s_rounds": [880.0, 880.0]}),
                                     StepRecord("regression-gate", "ok", detail="INCONCLUSIVE ...",
                                                data={"throughput_gate": verdict.document()})])
    report.facts = {"output_tok_s": 880.0, "throughput_gate": verdict.summary()}
    return report


def test_the_gates_verdict_goes_to_the_plain_report_json_and_history():
    from deploy.local import history
    from deploy.render import report as render

    report = _gated_report()
    [line] = [l for l in render.plain_report_lines("nightly", [report], "T") if "throughput gate" in l]
    assert "INCONCLUSIVE: now/last good (the stored bar) 88.0% [no interval], minimum 90.0% (2 vs 12 rounds" in line
    assert report.to_dict()["facts"]["throughput_gate"]["outcome"] == "inconclusive"
    [row] = history.records_for("nightly", "r", [report])
    assert row["throughput_gate"]["ratio"] == pytest.approx(0.88, abs=0.005) and row["throughput_gate"]["rounds"] == [2, 12]
    assert "gate=inconclusive" in render.history_lines([row])[0]


def test_the_html_bench_report_shows_the_rounds_and_the_verdict():
    from deploy.render import bench_report

    table = bench_report.rows([(16, [_gated_report()])])
    page = bench_report.render_html(bench_report.document("r", 16, table, []))
    assert "2 rounds, 880.0-880.0" in page and "INCONCLUSIVE 88.0% [no interval], minimum 90%" in page
    assert "whole 95% interval below 100%" in page
