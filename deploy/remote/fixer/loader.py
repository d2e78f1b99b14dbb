"""What SGLang would load: a simulation of LlamaForCausalLMEagle3.load_weights' name resolution for
SGLang 0.5.6-0.5.11 (legacy) and 0.5.12+ (modern, PR #24663), listing dropped tensors and
parameters no tensor loads."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from .errors import EXIT_CHECKPOINT, EXIT_USAGE, FixError
from .header import Header, _is_uint, read_header
from .checkpoint import CONFIG_NAME, _Checkpoint, _read_config
from .rename import DEFAULT_RENAMES, _plan_renames
from .config import SGLANG_ARCH, config_kind, convert_config

GENERATIONS = {"legacy": "0.5.6-0.5.11", "modern": "0.5.12+"}
OLDEST_SUPPORTED = (0, 5, 6)
FIRST_MODERN = (0, 5, 12)

#: LlamaConfig defaults SGLang falls back to when config.json leaves a field out.
LLAMA_DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000}

#: SGLang 0.5.12+ (PR #24663) renames these substrings before resolving a name.
MODERN_LEGACY_MAP = (
    ("midlayer", "layers.0"),
    ("aux_norm_low", "fc_norm.0"),
    ("aux_norm_mid", "fc_norm.1"),
    ("aux_norm_high", "fc_norm.2"),
)

#: (fused parameter, checkpoint name part, shard id), as in load_weights' stacked_params_mapping.
STACKED_PARAMS = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", "gate"),
    (".gate_up_proj", ".up_proj", "up"),
)

LAYER_PARAMS = (
    "hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
)

_MODERN_UNUSED_NORM = re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$")


def _resolve_generation(generation: Optional[str]) -> str:
    if generation is None:
        return "legacy"
    if generation in GENERATIONS:
        return generation
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(generation))
    if not match:
        raise FixError(EXIT_USAGE, "SGLang generation %r: expected legacy, modern or a version like "
                       "0.5.9" % (generation,))
    version = tuple(int(p or 0) for p in match.groups())
    if version < OLDEST_SUPPORTED:
        raise FixError(EXIT_USAGE, "SGLang %s is not supported: the EAGLE-3 loader was checked from "
                       "0.5.6 on" % generation)
    return "modern" if version >= FIRST_MODERN else "legacy"


def effective_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """What SGLang's LlamaConfig would see; for a speculators config, the nested fields as a hint."""
    if config_kind(config) != "speculators":
        return config
    merged = dict(config.get("transformer_layer_config") or {})
    merged.update((k, v) for k, v in config.items() if k != "transformer_layer_config")
    return merged


def _simulate_load(shapes: Dict[str, List[int]], config: Optional[Dict[str, Any]],
                   generation: str) -> Dict[str, Any]:
    """Replay LlamaForCausalLMEagle3.load_weights' name resolution and report every gap by name."""
    versions = GENERATIONS[generation]
    result: Dict[str, Any] = {"generation": generation, "sglang_versions": versions, "ok": False,
                              "dropped": [], "missing": [], "problems": [], "notes": []}
    problems: List[str] = result["problems"]
    notes: List[str] = result["notes"]
    if config is None:
        problems.append("config.json is missing: SGLang cannot build the draft model")
        return result
    kind = config_kind(config)
    if kind == "speculators":
        problems.append("config.json is in speculators format (architectures %r): SGLang has no "
                        "such class and reads the Llama fields and eagle_config at the top level; "
                        "convert it" % (config.get("architectures"),))
    elif kind == "other":
        problems.append("config.json architectures is %r; SGLang's EAGLE-3 Llama draft class is "
                        "%s" % (config.get("architectures"), SGLANG_ARCH))
    eff = effective_config(config)
    defaults_used = [k for k in LLAMA_DEFAULTS if eff.get(k) is None]
    if defaults_used:
        notes.append("config.json has no %s; SGLang uses LlamaConfig's default (%s)"
                     % (", ".join(defaults_used),
                        ", ".join("%s=%s" % (k, LLAMA_DEFAULTS[k]) for k in defaults_used)))
    try:
        n_layers = int(eff.get("num_hidden_layers") or LLAMA_DEFAULTS["num_hidden_layers"])
        hidden = int(eff.get("hidden_size") or LLAMA_DEFAULTS["hidden_size"])
    except (TypeError, ValueError):
        problems.append("config.json: num_hidden_layers and hidden_size must be integers")
        return result
    result["layers"] = n_layers
    n_layers = max(0, min(n_layers, 4096))
    eagle = eff.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    top_ids = eff.get("eagle_aux_hidden_state_layer_ids")
    ids_valid = isinstance(ids, list) and bool(ids) and all(_is_uint(i) for i in ids)
    result["aux_layer_ids"] = ids
    num_aux = 3
    if generation == "modern":
        explicit = eff.get("num_aux_hidden_states")
        if _is_uint(explicit) and explicit:
            num_aux = explicit
        elif ids_valid:
            num_aux = len(ids or ())
    tie = bool(eff.get("tie_word_embeddings", False))

    params: List[str] = []
    if generation == "legacy":
        if n_layers != 1:
            problems.append("num_hidden_layers is %d: SGLang %s raise \"EAGLE3 currently only "
                            "supports 1 layer\" and cannot serve this drafter; use SGLang 0.5.12+ "
                            "(--sglang-generation modern)" % (n_layers, versions))
        params += ["model.midlayer." + p for p in LAYER_PARAMS]
    else:
        for i in range(n_layers):
            params += ["model.layers.%d.%s" % (i, p) for p in LAYER_PARAMS]
        if eff.get("fc_norm") or eff.get("use_aux_norm"):
            params += ["model.fc_norm.%d.weight" % k for k in range(num_aux)]
        if eff.get("norm_before_fc"):
            params.append("model.input_norm.weight")
    params += ["model.fc.weight", "model.norm.weight", "model.embed_tokens.weight"]
    if not tie:
        params.append("lm_head.weight")
    param_set = set(params)
    received: Dict[str, set] = dict((p, set()) for p in params)
    source: Dict[str, str] = {}

    for original in shapes:
        name = original
        if generation == "modern":
            for legacy, new in MODERN_LEGACY_MAP:
                if legacy in name:
                    name = name.replace(legacy, new)
        if "d2t" in name:
            continue        # becomes the draft->target hot-token map
        if "t2d" in name:
            continue        # skipped by SGLang on purpose
        target = None
        shard = "full"
        for fused, part, shard_id in STACKED_PARAMS:
            if part in name:
                name = name.replace(part, fused)
                shard = shard_id
                break
        target = name if name in param_set else "model." + name
        if target not in param_set:
            result["dropped"].append(original)
            continue
        if shard in received[target] or "full" in received[target]:
            problems.append("%s and %s both load into %s (the later one wins)"
                            % (source.get(target, "?"), original, target))
        received[target].add(shard)
        source[target] = original
        unused = _MODERN_UNUSED_NORM.match(target)
        if generation == "modern" and unused and int(unused.group(1)) > 0:
            problems.append("%s loads into %s, which SGLang 0.5.12+ never uses (layer %s's "
                            "pre-attention norm is hidden_norm)" % (original, target,
                                                                    unused.group(1)))

    for param in params:
        got = received[param]
        if param.endswith(".qkv_proj.weight"):
            need = {"q", "k", "v"}
        elif param.endswith(".gate_up_proj.weight"):
            need = {"gate", "up"}
        else:
            need = {"full"}
        if "full" in got or need <= got:
            continue
        if got:
            result["missing"].append(param)
            problems.append("%s receives only the %s part(s); %s missing"
                            % (param, ", ".join(sorted(got)), ", ".join(sorted(need - got))))
            continue
        unused = _MODERN_UNUSED_NORM.match(param)
        if param == "model.embed_tokens.weight":
            notes.append("model.embed_tokens.weight is not in the checkpoint: SGLang takes the "
                         "embeddings from the target model")
        elif generation == "modern" and unused and int(unused.group(1)) > 0:
            continue        # allocated but never used for layers N > 0
        elif param == "lm_head.weight" and eff.get("draft_vocab_size") is None:
            notes.append("lm_head.weight is not in the checkpoint and draft_vocab_size is unset: "
                         "SGLang loads the LM head from the target")
        else:
            result["missing"].append(param)

    # Aux hidden states: the target captures the layers named by the DRAFT config's eagle_config.
    # Without them the draft sees one hidden state, skips fc (7168 == 7168) and accepts nothing.
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False:
        problems.append("eagle_config.use_aux_hidden_state is false: the target sends one hidden "
                        "state and fc is skipped")
    if ids is None and top_ids is not None:
        problems.append("eagle_aux_hidden_state_layer_ids %r is only at the top level of "
                        "config.json: the top-level key is not read by the Llama draft path, so "
                        "SGLang would capture its default layers; it belongs in eagle_config"
                        % (top_ids,))
    elif ids is None:
        notes.append("no eagle_config.eagle_aux_hidden_state_layer_ids: the target captures "
                     "SGLang's default layers [2, N//2, N-3]")
    elif not ids_valid:
        problems.append("eagle_config.eagle_aux_hidden_state_layer_ids must be a non-empty list of "
                        "non-negative integers, got %r" % (ids,))
    elif generation == "legacy" and len(ids) != 3:
        problems.append("eagle_config lists %d aux layer ids but SGLang %s hard-code fc's input to "
                        "3 hidden states" % (len(ids), versions))
    target_hidden = eff.get("target_hidden_size", hidden)
    if "target_hidden_size" in eff and eff.get("target_hidden_size") is None:
        problems.append("target_hidden_size is null: SGLang tests hasattr() and would build fc "
                        "with a width of None; remove the key")
        target_hidden = hidden
    fc_name = source.get("model.fc.weight")
    if fc_name is not None and _is_uint(target_hidden):
        shape = shapes[fc_name]
        want = [hidden, num_aux * target_hidden]
        if shape != want:
            problems.append("%s has shape %r but SGLang %s builds fc as %r (%d aux hidden states "
                            "of width %d)" % (fc_name, shape, versions, want, num_aux,
                                              target_hidden))
        elif ids_valid and len(ids or ()) != int(num_aux):
            problems.append("%s takes %d aux hidden states but eagle_config lists %d ids"
                            % (fc_name, num_aux, len(ids or ())))
    if result["dropped"]:
        problems.insert(0, "SGLang %s would drop %d tensor(s) without a word: %s"
                        % (versions, len(result["dropped"]), _some(result["dropped"])))
    if result["missing"]:
        problems.insert(0, "parameter(s) that no tensor loads into (they stay randomly "
                        "initialised): %s" % _some(result["missing"]))
    fatal = [p for p in problems if "only supports 1 layer" in p or "speculators format" in p]
    problems[:] = fatal + [p for p in problems if p not in fatal]     # the root cause first
    result["ok"] = not (result["dropped"] or result["missing"] or problems)
    return result


#: names listed in one problem line (a checkpoint with 200k stray tensors would print them all)
MAX_NAMES_SHOWN = 20


def _some(names: List[str]) -> str:
    shown = ", ".join(repr(n) if not n or not n.isprintable() else n for n in names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return shown + (" and %d more" % more if more > 0 else "")


#: a control character (C0 or DEL): one regex search per name, not a generator per character
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def name_problems(names: List[str]) -> List[str]:
    """Tensor names no loader can mean: empty, or holding NUL or another control character (torch
    and SGLang look tensors up by name; such a name is dropped or collides)."""
    bad = [n for n in names if not n or _CONTROL.search(n)]
    if not bad:
        return []
    return ["%d tensor name(s) are empty or hold a control character (NUL, newline, ...): %s"
            % (len(bad), _some(bad))]


def _merged_shapes(headers: List[Header]) -> Dict[str, List[int]]:
    shapes: Dict[str, List[int]] = {}
    where: Dict[str, str] = {}
    for header in headers:
        for name, shape in header.shapes().items():
            if name in shapes:
                raise FixError(EXIT_CHECKPOINT, "tensor %r is in both %s and %s"
                               % (name, where[name], header.display))
            shapes[name] = shape
            where[name] = header.display
    return shapes


def simulate_fixed(files: Dict[str, Dict[str, List[int]]], config: Optional[Dict[str, Any]],
                   generation: str, hidden_states_from: str = "keep"
                   ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Dict[str, List[int]]]:
    """What SGLang would load once this fixer ran with its default renames: no file is touched.

    ``files`` maps each safetensors file to its tensor shapes (as read from the headers on the
    host). Returns (verification, the config as the fixer would write it, the final shapes).
    deployctl doctor judges a drafter with this before anything on the host is changed.
    """
    generation = _resolve_generation(generation)
    headers = [Header(name, name, 0, b"", dict((k, {"shape": v}) for k, v in tensors.items()), 0)
               for name, tensors in sorted(files.items())]
    mapping, _, _ = _plan_renames(headers, list(DEFAULT_RENAMES), False)
    shapes = dict((mapping.get(k, k), v) for k, v in _merged_shapes(headers).items())
    if config is not None and config_kind(config) == "speculators":
        config, _, _ = convert_config(config, hidden_states_from, shapes, CONFIG_NAME)
    return _simulate_load(shapes, config, generation), config, shapes


def verify(path: str, generation: str = "legacy") -> Dict[str, Any]:
    """What SGLang of ``generation`` (legacy, modern or a version) would load from the drafter."""
    generation = _resolve_generation(generation)
    ckpt = _Checkpoint(path)
    headers = [read_header(w.real, w.path) for w in ckpt.weights]
    _, config = _read_config(ckpt.config_path)
    return _simulate_load(_merged_shapes(headers), config, generation)
