"""SIMULATED effects of the silent EAGLE-3 failures (deployctl sandbox TEST DOUBLE; issue 19).

Each is modelled on what real SGLang does (0.5.6 - 0.5.23 wheels, upstream issues cited), as
unforgiving as the real thing: nothing here warns where SGLang does not.

- Reduced draft vocabulary without ``d2t``: ``LlamaForCausalLMEagle3.load_weights`` builds the
  hot-token map only from a tensor named d2t; without it (and without --speculative-token-map) the
  draft's ids are taken as target ids: every draft token is rejected, accept len 1.00
  (NVIDIA-NeMo/Automodel#2447).
- Draft quantization: unless --speculative-draft-model-quantization is given (0.5.7+), the draft
  inherits the target's quantization (its --quantization, or the method its config.json declares,
  as sglang#28196 reports it); a drafter without a quantization config of its own then fails at
  draft load, ``ValueError: Cannot find the config file for awq``, for the methods whose config
  needs a file (layers/quantization CONFIG_FILE_METHODS); the others quantize it online.
- SGLANG_SIMULATE_ACC_LEN > 0: every verify step accepts that many tokens on average, whatever
  the drafter does (speculative/eagle_utils.py generate_simulated_accept_index).
- The drafter's window: at positions past its max_position_embeddings, or past the target's
  unscaled window when the target scales RoPE and the drafter has no rope_scaling
  (vllm-project/speculators#574), drafts are noise: those steps accept only the bonus token
  (sglang#6783).
"""

from __future__ import annotations

import os
from typing import Optional

from sglang.srt.layers.quantization import CONFIG_FILE_METHODS


def _text(config: dict) -> dict:
    for key in ("text_config", "transformer_layer_config"):
        nested = config.get(key)
        if isinstance(nested, dict):
            return {**nested, **{k: v for k, v in config.items() if k != key}}
    return config


def declared_quantization(config: dict) -> Optional[str]:
    for scope in (config, _text(config)):
        quant = scope.get("quantization_config") or scope.get("compression_config")
        if isinstance(quant, dict):
            return str(quant.get("quant_method") or "quantized")
    return None


def vocab_collapse(draft_config: dict, target_config: dict, has_d2t: bool, token_map: Optional[str]) -> Optional[str]:
    draft_vocab = _text(draft_config).get("draft_vocab_size")
    vocab = _text(target_config).get("vocab_size")
    if not isinstance(draft_vocab, int) or not isinstance(vocab, int) or draft_vocab >= vocab:
        return None
    if has_d2t or token_map:
        return None
    return (f"draft_vocab_size {draft_vocab} < vocab_size {vocab} and no d2t: draft ids taken as target ids "
            "(no hot-token map)")


def draft_load_error(target_quantization: Optional[str], draft_flag: Optional[str], draft_config: dict,
                     draft_dir: str) -> tuple[Optional[str], Optional[str]]:
    """(the draft's effective quantization, the ValueError its load raises or None)."""
    if draft_flag == "unquant":
        method = None
    elif draft_flag:
        method = draft_flag
    else:
        method = target_quantization  # inherited (serving_hook.py: draft quantization = quantization)
    own = declared_quantization(draft_config)
    if own is not None:
        return own, None  # "Using draft model's detected quantization"
    if method is None:
        return None, None
    files = CONFIG_FILE_METHODS.get(method)
    if files and not any(os.path.isfile(os.path.join(draft_dir, name)) for name in files):
        return method, f"Cannot find the config file for {method}"
    return method, None  # online quantization of the bf16 draft


def simulated_accept_length() -> Optional[float]:
    raw = os.environ.get("SGLANG_SIMULATE_ACC_LEN")
    if raw is None:
        return None
    value = float(raw)  # EnvFloat: a non-number fails at startup
    return value if value > 0 else None


def draft_window(draft_config: dict, target_config: dict) -> Optional[int]:
    draft, target = _text(draft_config), _text(target_config)
    window = draft.get("max_position_embeddings")
    window = window if isinstance(window, int) else None
    target_rope, draft_rope = target.get("rope_scaling"), draft.get("rope_scaling")
    if isinstance(target_rope, dict) and not isinstance(draft_rope, dict):
        original = target_rope.get("original_max_position_embeddings")
        if isinstance(original, int):
            window = original if window is None else min(window, original)
    return window
