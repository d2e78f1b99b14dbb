"""The stand-in SGLang's traffic-dependent acceptance (issue 43, sandbox/sim_sglang/.../prompt_kinds.py):
a prompt's kind scales the drafter's accepted draft tokens, and a drafter's SIMULATION-prompt-kinds
marker makes it good on one kind and poor on another."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIVE_MIX = ("Translate to German: the meeting moves to Thursday.", "Rewrite this email so it sounds friendlier.",
            "Draft a polite reply declining the invitation.", "Give three names for a bakery.")


def stand_in():
    sys.path.insert(0, str(REPO / "sandbox" / "sim_sglang"))
    try:
        os.environ.setdefault("SGLANG_SIM_IMPORT_SECONDS", "0")
        from sglang import launch_server
        from sglang.srt.speculative import prompt_kinds
    finally:
        sys.path.pop(0)
    return launch_server, prompt_kinds


def builtin_prompts() -> list[tuple[str, str]]:
    data = json.loads((REPO / "deploy" / "data" / "prompts.json").read_text())
    return [(row["category"], row["conversations"][0]["value"]) for row in data]


def test_every_builtin_prompt_is_read_as_its_own_category_and_the_set_averages_one():
    _, kinds = stand_in()
    prompts = builtin_prompts()
    assert [(c, kinds.kind_of(p)) for c, p in prompts if kinds.kind_of(p) != c] == []
    mean = sum(kinds.KIND_FACTOR[kinds.kind_of(p)] for _, p in prompts) / len(prompts)
    assert abs(mean - 1.0) < 0.01  # the stand-in's accept lengths on the built-in set did not move


def test_the_live_mix_of_the_tests_is_instructions_which_the_builtin_set_has_none_of():
    _, kinds = stand_in()
    assert {kinds.kind_of(p) for p in LIVE_MIX} == {"instruct"}


def test_the_published_order_code_above_math_above_chat():
    _, kinds = stand_in()
    f = kinds.KIND_FACTOR
    assert f["code"] > f["math"] > f["instruct"] > f["summary"] > f["chat"] > 0


@pytest.mark.parametrize("text", ['[]', '{}', 'x', '{"poetry": 1}', '{"code": 0}', '{"code": 4}', '{"code": true}',
                                  '{"code": "1"}', '{"*": -1}'])
def test_the_marker_is_read_strictly(text):
    _, kinds = stand_in()
    with pytest.raises(ValueError):
        kinds.parse_marker(text)


@pytest.mark.parametrize("accepted,f,expected", [(1, 0.5, 1.0), (5, 1.0, 5.0), (5, 0.5, 3.0), (3, 1.5, 4.0),
                                                 (8, 3.0, 8.0)])
def test_scaled_keeps_the_mean_and_the_cap(accepted, f, expected):
    _, kinds = stand_in()
    draws = [kinds.scaled(accepted, f, 8, (i * 0.618034) % 1.0) for i in range(1000)]
    assert all(1 <= d <= 8 for d in draws)
    assert abs(sum(draws) / len(draws) - expected) < 0.01


def engine(marker: dict | None):
    sim, _ = stand_in()
    args = types.SimpleNamespace(decode_log_interval=40, disable_cuda_graph=False, log_level="info",
                                 weight_version="default", served_model_name="kimi", enable_metrics=True)
    spec = sim.Speculation("EAGLE3", draft_tokens=16, accept_p=0.66)
    if marker is not None:
        sim.read_drafter_markers({"prompt-kinds": json.dumps(marker)}, spec)
    return sim.Engine(args, "0.5.11", spec, {}, 0.37)


def accept_length(e, prompts) -> float:
    tokens = steps = 0
    for i in range(120):
        _, meta = e.generate(8, 64, text=prompts[i % len(prompts)])
        tokens += meta["completion_tokens"]
        steps += meta["spec_verify_ct"]
    return tokens / steps


def test_a_drafter_good_on_the_builtin_prompts_and_poor_on_the_live_mix(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_SIM_TIME_SCALE", "0")
    builtin = [p for _, p in builtin_prompts()]
    old, new = engine(None), engine({"instruct": 0.5, "*": 1.1})
    old_builtin, new_builtin = accept_length(old, builtin), accept_length(new, builtin)
    old_live, new_live = accept_length(old, list(LIVE_MIX)), accept_length(new, list(LIVE_MIX))
    capsys.readouterr()
    assert new_builtin > old_builtin * 1.03  # passes verify and the benchmark gate on the built-in prompts
    assert new_live < old_live * 0.8  # and accepts markedly less on the live mix


def test_the_stand_in_reports_the_per_token_latency_histogram():
    from deploy.facts import status as facts

    sim, _ = stand_in()
    state = sim.MetricsState()
    state.finished(12, 100, 0.5)
    state.finished(12, 100, 1.5)
    samples = [ln for ln in state.render("kimi", 0, 0.0).splitlines() if not ln.startswith("#")]
    series = facts.parse_metric_lines(samples, "sim")
    assert list(series["sglang:inter_token_latency_seconds_count"].values()) == [200.0]
    assert list(series["sglang:inter_token_latency_seconds_sum"].values()) == [pytest.approx(2.0)]
