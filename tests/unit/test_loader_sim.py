"""The replay of SGLang's LlamaForCausalLMEagle3.load_weights: nothing may be dropped silently.

SGLang's ``srt/models/llama_eagle3.py`` (0.5.6 - 0.5.23): names are resolved (0.5.12+ legacy map, d2t/t2d, stacked q/k/v and
gate/up, then ``name`` or ``model.`` + name) and anything unresolved is dropped without a word;
nothing checks that every parameter received a tensor. The aux layer ids must be in the
draft config's eagle_config (the Llama draft path reads only that key).
"""

from __future__ import annotations

import json

import pytest

from deploy.remote import fixer as fix
from deploy.remote.fixer import loader
from tests.fixtures_ckpt import (
    make_sglang_drafter,
    make_speculators_drafter,
    sglang_config,
    speculators_config,
)

H = 64
LAYER = {
    "hidden_norm.weight": [H], "input_layernorm.weight": [H],
    "post_attention_layernorm.weight": [H],
    "self_attn.q_proj.weight": [H, 2 * H], "self_attn.k_proj.weight": [32, 2 * H],
    "self_attn.v_proj.weight": [32, 2 * H], "self_attn.o_proj.weight": [H, H],
    "mlp.gate_proj.weight": [128, H], "mlp.up_proj.weight": [128, H],
    "mlp.down_proj.weight": [H, 128],
}


def shapes(prefix="midlayer.", *, embed=False, fc_width=3 * H, extra=None, drop=()):
    out = {"fc.weight": [H, fc_width], "norm.weight": [H], "lm_head.weight": [128, H],
           "d2t": [128], "t2d": [256]}
    if embed:
        out["embed_tokens.weight"] = [256, H]
    out.update((prefix + k, v) for k, v in LAYER.items())
    out.update(extra or {})
    for name in drop:
        del out[name]
    return out


def sim(shape_map, config=None, generation="legacy"):
    return loader._simulate_load(shape_map, sglang_config() if config is None else config, generation)


# ------------------------------------------------------------------------- on real checkpoints

def test_speculators_checkpoint_on_legacy_drops_the_whole_decoder_layer(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    result = fix.verify(drafter, "legacy")
    assert result["ok"] is False
    assert sorted(result["dropped"]) == sorted("layers.0." + k for k in LAYER)
    assert "model.midlayer.self_attn.qkv_proj.weight" in result["missing"]
    assert "model.midlayer.hidden_norm.weight" in result["missing"]
    assert any("drop 10 tensor(s) without a word" in p for p in result["problems"])
    assert any("speculators format" in p for p in result["problems"])


def test_after_conversion_legacy_loads_everything(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter)
    result = fix.verify(drafter, "0.5.9")
    assert result == dict(result, ok=True, dropped=[], missing=[], problems=[])
    assert result["generation"] == "legacy"


def test_after_conversion_modern_loads_everything_via_the_legacy_map(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter)
    assert fix.verify(drafter, "modern")["ok"] is True


def test_two_layer_drafter_on_legacy_is_a_problem(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", layers=2)
    fix.convert(drafter, generation="modern")
    result = fix.verify(drafter, "legacy")
    assert result["ok"] is False
    assert any("EAGLE3 currently only supports 1 layer" in p for p in result["problems"])


def test_two_layer_drafter_on_modern_needs_the_hidden_norm_mapping(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", layers=2)
    # config converted by hand, weights as speculators saved them
    config = json.loads((drafter / "config.json").read_text())
    flat = sglang_config(layers=2)
    (drafter / "config.json").write_text(json.dumps(flat))
    before = fix.verify(drafter, "modern")
    assert before["ok"] is False
    assert before["missing"] == ["model.layers.1.hidden_norm.weight"]
    assert any("layers.1.input_layernorm.weight loads into model.layers.1.input_layernorm.weight"
               in p and "never uses" in p for p in before["problems"])
    (drafter / "config.json").write_text(json.dumps(config))

    summary = fix.convert(drafter, generation="modern")

    assert ["layers.1.input_layernorm.weight", "layers.1.hidden_norm.weight"] in summary["renames"]
    assert summary["verification"]["ok"] is True
    assert fix.verify(drafter, "0.5.12")["ok"] is True


def test_sglang_format_without_embed_tokens_is_fine_with_a_note(tmp_path):
    drafter = make_sglang_drafter(tmp_path / "d")
    for generation in ("legacy", "modern"):
        result = fix.verify(drafter, generation)
        assert result["ok"] is True, result
        assert any("embed_tokens" in note and "target" in note for note in result["notes"])


def test_sglang_multi_layer_drafter_on_modern(tmp_path):
    drafter = make_sglang_drafter(tmp_path / "d", layers=3)
    assert fix.verify(drafter, "modern")["ok"] is True
    assert fix.convert(drafter, generation="modern")["status"] == "already_converted"


# ---------------------------------------------------------------------------- resolution rules

def test_d2t_and_t2d_are_consumed_not_dropped():
    result = sim(shapes())
    assert result["ok"] and result["dropped"] == []


def test_unknown_tensor_is_dropped_by_name():
    result = sim(shapes(extra={"midlayer.mystery.weight": [H], "aux_head.weight": [H]}))
    assert result["dropped"] == ["midlayer.mystery.weight", "aux_head.weight"]
    assert not result["ok"]


def test_missing_q_part_is_reported_by_parameter_and_part():
    result = sim(shapes(drop=["midlayer.self_attn.q_proj.weight"]))
    assert result["missing"] == ["model.midlayer.self_attn.qkv_proj.weight"]
    assert any("k, v part(s); q missing" in p for p in result["problems"])


def test_fused_qkv_checkpoint_is_accepted():
    extra = {"midlayer.self_attn.qkv_proj.weight": [128, 2 * H]}
    drop = ["midlayer.self_attn.%s_proj.weight" % p for p in "qkv"]
    assert sim(shapes(extra=extra, drop=drop))["ok"] is True


def test_missing_lm_head_and_norm_are_gaps():
    result = sim(shapes(drop=["lm_head.weight", "norm.weight"]))
    assert result["missing"] == ["model.norm.weight", "lm_head.weight"]


def test_lm_head_from_target_when_draft_vocab_is_unset():
    config = sglang_config()
    del config["draft_vocab_size"]
    result = sim(shapes(drop=["lm_head.weight"]), config)
    assert result["ok"] and any("LM head from the target" in n for n in result["notes"])


def test_tied_embeddings_drop_the_separate_lm_head():
    config = dict(sglang_config(), tie_word_embeddings=True)
    result = sim(shapes(embed=True), config)
    assert result["dropped"] == ["lm_head.weight"]


def test_midlayer_on_modern_goes_through_the_legacy_map():
    assert sim(shapes(), generation="modern")["ok"] is True


def test_layers_0_on_legacy_is_dropped_on_modern_loaded():
    assert sim(shapes("layers.0."), generation="legacy")["ok"] is False
    assert sim(shapes("layers.0."), generation="modern")["ok"] is True


def test_same_parameter_loaded_twice_is_a_problem():
    extra = {"layers.0." + k: v for k, v in LAYER.items()}
    result = sim(shapes(extra=extra), generation="modern")
    assert any("both load into model.layers.0.hidden_norm.weight" in p for p in result["problems"])


def test_aux_norms_on_modern_with_fc_norm():
    config = dict(sglang_config(), fc_norm=True)
    extra = {"aux_norm_low.weight": [H], "aux_norm_mid.weight": [H], "aux_norm_high.weight": [H]}
    assert sim(shapes(extra=extra), config, "modern")["ok"] is True
    result = sim(shapes(), config, "modern")
    assert result["missing"] == ["model.fc_norm.0.weight", "model.fc_norm.1.weight",
                                 "model.fc_norm.2.weight"]


# ------------------------------------------------------------------------------- aux capture

def test_top_level_ids_without_eagle_config_is_a_problem():
    config = sglang_config(aux_ids=None)
    config["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]
    result = sim(shapes(), config)
    assert not result["ok"]
    assert any("top-level key is not read by the Llama draft path" in p for p in result["problems"])


def test_missing_eagle_config_entirely_means_sglang_defaults():
    result = sim(shapes(), sglang_config(aux_ids=None))
    assert result["ok"] is True
    assert any("[2, N//2, N-3]" in n for n in result["notes"])


def test_aux_hidden_state_disabled_is_a_problem():
    config = sglang_config()
    config["eagle_config"]["use_aux_hidden_state"] = False
    assert any("use_aux_hidden_state is false" in p for p in sim(shapes(), config)["problems"])


def test_four_aux_layers_on_legacy_conflict_with_the_hard_coded_three():
    config = sglang_config(aux_ids=(2, 20, 40, 58))
    legacy = sim(shapes(fc_width=4 * H), config, "legacy")
    assert any("hard-code fc's input to 3 hidden states" in p for p in legacy["problems"])
    assert any("[64, 192]" in p for p in legacy["problems"])
    assert sim(shapes(fc_width=4 * H), config, "modern")["ok"] is True


def test_fc_width_must_match_the_number_of_ids():
    config = sglang_config(aux_ids=(2, 30))
    result = sim(shapes(fc_width=3 * H), config, "modern")
    assert any("fc.weight has shape [64, 192]" in p and "[64, 128]" in p
               for p in result["problems"])


def test_target_hidden_size_sets_fc_width():
    config = dict(sglang_config(), target_hidden_size=96)
    assert sim(shapes(fc_width=3 * 96), config)["ok"] is True
    assert not sim(shapes(fc_width=3 * H), config)["ok"]


def test_null_target_hidden_size_is_a_problem():
    config = dict(sglang_config(), target_hidden_size=None)
    assert any("target_hidden_size is null" in p for p in sim(shapes(), config)["problems"])


def test_speculators_config_is_a_problem_but_names_still_resolve():
    result = sim(shapes("layers.0."), speculators_config(), "legacy")
    assert len(result["dropped"]) == 10
    assert any("speculators format" in p for p in result["problems"])


def test_no_config_at_all():
    result = loader._simulate_load(shapes(), None, "legacy")
    assert result["ok"] is False and "config.json is missing" in result["problems"][0]


def test_llama_default_layer_count_when_absent():
    config = sglang_config()
    del config["num_hidden_layers"]
    result = sim(shapes(), config, "legacy")
    assert any("num_hidden_layers is 32" in p for p in result["problems"])
    assert any("LlamaConfig's default" in n for n in result["notes"])


@pytest.mark.parametrize("generation", ["0.5.5", "0.4.9", "nonsense"])
def test_unsupported_generation(generation):
    with pytest.raises(fix.FixError) as caught:
        loader._resolve_generation(generation)
    assert caught.value.code == 2
