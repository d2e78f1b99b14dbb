"""config.json: a speculators EAGLE-3 config converted to the flat form SGLang's
LlamaForCausalLMEagle3 reads (aux hidden-state layer ids under eagle_config)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .errors import EXIT_CHECKPOINT, FixError
from .header import _is_uint

IDS_MODES = ("keep", "vllm", "sglang")
SPECULATORS_ARCHS = ("Eagle3DraftModel", "Eagle3Speculator")
SGLANG_ARCH = "LlamaForCausalLMEagle3"


def config_kind(config: Optional[Dict[str, Any]]) -> str:
    if config is None:
        return "missing"
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    if config.get("speculators_model_type") == "eagle3" or any(a in SPECULATORS_ARCHS for a in archs):
        return "speculators"
    if SGLANG_ARCH in archs:
        return "sglang"
    return "other"


def _layer_ids(value: Any, where: str) -> Optional[List[int]]:
    if value is None:
        return None
    if not isinstance(value, list) or not all(_is_uint(i) for i in value):
        raise FixError(EXIT_CHECKPOINT, "%s: eagle_aux_hidden_state_layer_ids must be a list of "
                       "non-negative integers, got %r" % (where, value))
    return list(value)


def _sglang_ids(config: Dict[str, Any]) -> Optional[List[int]]:
    eagle = config.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        return eagle.get("eagle_aux_hidden_state_layer_ids")
    return None


def convert_config(config: Dict[str, Any], ids_mode: str, shapes: Dict[str, List[int]],
                    where: str) -> Tuple[Dict[str, Any], List[str], Optional[List[int]]]:
    """speculators config -> the flat form LlamaForCausalLMEagle3 reads."""
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise FixError(EXIT_CHECKPOINT, "%s: a speculators eagle3 config needs a "
                       "transformer_layer_config object with the Llama fields" % where)
    archs = config.get("architectures") or ["speculators_model_type eagle3"]
    log = ["%s: speculators format (%s) -> SGLang format (%s)"
           % (where, ", ".join(str(a) for a in (archs if isinstance(archs, list) else [archs])),
              SGLANG_ARCH)]
    new: Dict[str, Any] = {"architectures": [SGLANG_ARCH], "model_type": "llama"}
    moved = []
    for key, value in layer.items():
        if key in ("architectures", "model_type"):
            continue
        new[key] = value
        moved.append(key)
    log.append("%s: Llama fields moved from transformer_layer_config to the top level: %s"
               % (where, ", ".join(moved) or "(none)"))
    if layer.get("model_type") not in (None, "llama"):
        log.append("%s: warning: transformer_layer_config.model_type is %r; fields it left at that "
                   "model's defaults now take Llama's defaults" % (where, layer.get("model_type")))
    if config.get("draft_vocab_size") is not None:
        new["draft_vocab_size"] = config["draft_vocab_size"]
    elif "lm_head.weight" in shapes and shapes["lm_head.weight"]:
        new["draft_vocab_size"] = shapes["lm_head.weight"][0]
        log.append("%s: draft_vocab_size %d taken from lm_head.weight" % (where,
                                                                         new["draft_vocab_size"]))
    if config.get("target_hidden_size") is not None:
        # SGLang tests hasattr(config, "target_hidden_size"): a null would be used as the width.
        new["target_hidden_size"] = config["target_hidden_size"]
    ids = _layer_ids(config.get("eagle_aux_hidden_state_layer_ids"), where)
    if ids is None:
        ids = _layer_ids(_sglang_ids(config), where)
    final_ids = ids
    if ids is None:
        new["eagle_config"] = {"use_aux_hidden_state": True}
        log.append("%s: no eagle_aux_hidden_state_layer_ids: SGLang will use its default "
                   "[2, N//2, N-3] (N = target layers), which is also vLLM's default" % where)
    else:
        if ids_mode == "vllm":
            bad = [i for i in ids if i - 1 < 0]
            if bad:
                raise FixError(EXIT_CHECKPOINT, "%s: eagle_aux_hidden_state_layer_ids %r: id %d would "
                               "become %d with --hidden-states-from vllm (SGLang cannot capture the "
                               "stream entering layer 0); check the ids" % (where, ids, bad[0],
                                                                           bad[0] - 1))
            final_ids = [i - 1 for i in ids]
            log.append("%s: eagle_aux_hidden_state_layer_ids %r -> %r (--hidden-states-from vllm: "
                       "vLLM captured the stream entering layer id; SGLang's Llama-family targets "
                       "capture the output of layer id, so id - 1 selects the same streams)"
                       % (where, ids, final_ids))
        elif ids_mode == "sglang":
            log.append("%s: eagle_aux_hidden_state_layer_ids %r kept (--hidden-states-from sglang: "
                       "already in SGLang's meaning)" % (where, ids))
        else:
            log.append("%s: eagle_aux_hidden_state_layer_ids %r kept as-is (--hidden-states-from "
                       "keep)" % (where, ids))
            log.append("%s: note: if vLLM/speculators extracted the training hidden states, SGLang's "
                       "Llama-family targets capture one layer later with these ids; convert with "
                       "--hidden-states-from vllm instead" % where)
        new["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": final_ids,
                               "use_aux_hidden_state": True}
    dropped = []
    for key, value in config.items():
        if key in ("architectures", "model_type", "transformer_layer_config", "draft_vocab_size",
                   "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "eagle_config"):
            continue
        if key in ("speculators_model_type", "auto_map"):
            dropped.append(key)
            continue
        if key in new:
            continue
        new[key] = value
    if dropped:
        log.append("%s: dropped %s (speculators-only; the original is in the backup)"
                   % (where, ", ".join(dropped)))
    return new, log, final_ids
