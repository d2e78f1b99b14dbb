"""The silent EAGLE-3 failures reported after the first twelve (issue 19), one check each.

Each passes today's other checks and costs a load (minutes on a real host) before anything notices,
or is never noticed at all. Pure functions over the doctor's facts: the drafter's and the target's
config.json and safetensors header names (never tensor bytes), the run's extra_args and env, and
the SGLang variables in the host's environment (deploy/remote/doctor_facts.py ``server_env``).
Version boundaries were read from the published wheels (0.5.6, 0.5.7, 0.5.8, 0.5.11, 0.5.13,
0.5.14, 0.5.15, 0.5.16, 0.5.20, 0.5.23); each is cited where it is used, with the upstream issue/PR.
"""

from __future__ import annotations

from typing import Any, Optional

from deploy.doctor.sglang_options import extra_arg
from deploy.doctor.sglang_options import literal_option_value as option_value  # noqa: F401  (re-exported)
from deploy.doctor.verdict import Check, DoctorInput, version_tuple
from deploy.host.sglang_argv import DRAFT_QUANT_FLAG, speculative_plan

#: the value for an unquantized (bf16/fp16) drafter (sglang#22588); a choice since 0.5.7 (absent in
#: 0.5.6's server_args.py, present in 0.5.7 - 0.5.23)
UNQUANT = "unquant"
DRAFT_QUANT_SINCE = (0, 5, 7)
#: PR #27964 ("Retire Spec V1") removed SGLANG_ENABLE_SPEC_V2: in srt/environ.py up to 0.5.13,
#: gone from 0.5.14 (0.5.14 - 0.5.20 log a removal notice; 0.5.23 says nothing at all)
SPEC_V2_REMOVED = (0, 5, 14)
#: topk > 1 with page_size > 1 raises at startup unless the attention backend is one of these
#: (server_args.py 0.5.6 - 0.5.12: flashinfer, fa3; arg_groups/speculative_hook.py 0.5.13+: + triton)
PAGE_TREE_BACKENDS_OLD = ("flashinfer", "fa3")
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")
PAGE_TREE_TRITON_SINCE = (0, 5, 13)
#: a drafter window under this fraction of the target's is "far below" (sglang#6783: past its window
#: a drafter drafts noise; slower than no speculation above 2k tokens)
WINDOW_FRACTION = 0.5


# ---------------------------------------------------------------------------------------------
# reading the run's extra_args and env, and the two config.json files

def _int_option(d: DoctorInput, name: str) -> Optional[int]:
    value = extra_arg(d, name)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def effective_env(d: DoctorInput, name: str) -> tuple[Optional[str], str]:
    """(value, where) of an SGLang variable as the server gets it: the run's env file is sourced
    after the host's shell environment, so the run's value wins."""
    if name in d.run.env:
        return d.run.env[name], "the run's env (runs[].env in the config)"
    if name in d.facts.server_env:
        return d.facts.server_env[name], (f"the host's environment ({d.host.name}: shell startup files, "
                                          "/etc/environment or sshd SetEnv)")
    return None, ""


def _shown(value: str) -> str:
    """A variable's value as a reason quotes it: host output, so anything unprintable is escaped."""
    return value if value.isprintable() and len(value) <= 40 else repr(value[:40])


def _text_config(config: Optional[dict[str, Any]]) -> dict[str, Any]:
    """A multimodal target nests the language model's fields in text_config; a speculators drafter
    nests them in transformer_layer_config. Top-level keys win where both exist, except these."""
    if not isinstance(config, dict):
        return {}
    for key in ("text_config", "transformer_layer_config"):
        nested = config.get(key)
        if isinstance(nested, dict):
            return {**nested, **{k: v for k, v in config.items() if k not in (key,)}}
    return config


def _int(config: dict[str, Any], key: str) -> Optional[int]:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _version(d: DoctorInput) -> Optional[tuple[int, int, int]]:
    return version_tuple(d.sglang.version) if d.sglang else None


def _version_text(d: DoctorInput) -> str:
    return f"SGLang {d.sglang.version}" if d.sglang and d.sglang.version else "the installed SGLang"


def _tensor_names(d: DoctorInput) -> Optional[list[str]]:
    files = d.facts.drafter.files
    if not files or any(v is None for v in files.values()):
        return None
    return [name for shapes in files.values() if shapes for name in shapes]


# ---------------------------------------------------------------------------------------------
# 1. reduced draft vocabulary without d2t

def check_draft_vocab_map(d: DoctorInput) -> Check:
    """LlamaForCausalLMEagle3 builds hot_token_id only from a tensor named d2t (t2d is ignored);
    without it a reduced draft vocabulary's ids are taken as target ids and acceptance collapses
    (NVIDIA-NeMo/Automodel#2447; every version 0.5.6 - 0.5.23). --speculative-token-map supplies the
    map instead."""
    name = "draft-vocab-map"
    drafter = _text_config(d.facts.drafter.config)
    target = _text_config(d.facts.base_model.config)
    vocab = _int(target, "vocab_size")
    names = _tensor_names(d)
    if not drafter or vocab is None or names is None:
        return Check(name, "warn", "cannot decide: the drafter's config.json, its safetensors headers or the "
                     "base model's vocab_size cannot be read")
    draft_vocab = _int(drafter, "draft_vocab_size")
    source = f"draft_vocab_size {draft_vocab} ({d.run.drafter}/config.json)"
    if draft_vocab is None:
        shapes = {k: v for f in (d.facts.drafter.files or {}).values() if f for k, v in f.items()}
        head = shapes.get("lm_head.weight") or shapes.get("model.lm_head.weight")
        draft_vocab = head[0] if head else vocab
        source = f"lm_head.weight rows {draft_vocab} (no draft_vocab_size in config.json)"
    d2t = [n for n in names if "d2t" in n]
    if draft_vocab > vocab:
        return Check(name, "warn", f"cannot decide: {source} > the target's vocab_size {vocab} "
                     "(hidden-and-vocab judges that)")
    if draft_vocab == vocab:
        return Check(name, "pass", f"full vocabulary ({source} = the target's vocab_size {vocab}): no "
                     "draft-to-target map needed")
    if d2t:
        return Check(name, "pass", f"{source} < the target's vocab_size {vocab}; {d2t[0]} maps draft ids to "
                     "target ids")
    token_map = extra_arg(d, "--speculative-token-map")
    if token_map:
        return Check(name, "pass", f"{source} < the target's vocab_size {vocab}, no d2t tensor; extra_args "
                     f"--speculative-token-map {token_map} supplies the map")
    return Check(name, "fail",
                 f"{source} < the target's vocab_size {vocab} ({d.run.base_model}/config.json) and the drafter's "
                 "safetensors hold no d2t tensor: SGLang builds its hot-token map only from d2t, so draft ids are "
                 "taken as target ids and acceptance collapses to ~1.0 (NVIDIA-NeMo/Automodel#2447)",
                 "re-export the drafter with its d2t mapping (the trainer's vocab mapping), or add "
                 "--speculative-token-map FILE to the run's extra_args")


# ---------------------------------------------------------------------------------------------
# 2. quantized target, unquantized drafter

def _declared_quantization(config: Optional[dict[str, Any]], quant_files: list[str]) -> Optional[str]:
    """The method a checkpoint declares: config.json quantization_config.quant_method (top level or
    text_config), else a quantization file next to it; None when it declares none."""
    for scope in (config or {}, _text_config(config)):
        quant = scope.get("quantization_config") or scope.get("compression_config")
        if isinstance(quant, dict):
            method = quant.get("quant_method")
            return str(method) if method else "quantized (quantization_config without quant_method)"
    if quant_files:
        return f"quantized ({quant_files[0]})"
    return None


def target_quantization(d: DoctorInput) -> tuple[Optional[str], str]:
    """(method, where it comes from): --quantization in extra_args wins over the checkpoint's own."""
    flag = extra_arg(d, "--quantization")
    if flag and flag != UNQUANT:
        return flag, f"--quantization {flag} in extra_args"
    if flag == UNQUANT:
        return None, "--quantization unquant in extra_args"
    method = _declared_quantization(d.facts.base_model.config, d.facts.base_model.quant_files)
    return method, f"{d.run.base_model}/config.json quantization_config" if method else ""


def draft_quantization_flag(d: DoctorInput) -> Optional[str]:
    """The value deployctl passes as --speculative-draft-model-quantization, or None.

    Unless that flag is set, SGLang's draft inherits the target's quantization (serving_hook.py
    0.5.23: speculative_draft_model_quantization = quantization) and an unquantized drafter under
    an awq/gptq/modelopt target dies at draft load, "Cannot find the config file for awq"
    (sglang#28196); fp8-like methods quantize it online instead. ``unquant`` keeps the draft as its
    own checkpoint says (a drafter with its own quantization_config is still detected). Only when
    the version is known to have the flag (0.5.7+): 0.5.6 rejects it (argparse, exit 2)."""
    if extra_arg(d, DRAFT_QUANT_FLAG) is not None:
        return None  # the user's choice
    method, _ = target_quantization(d)
    drafter = _declared_quantization(d.facts.drafter.config, d.facts.drafter.quant_files)
    installed = _version(d)
    if method is None or drafter is not None or installed is None or installed < DRAFT_QUANT_SINCE:
        return None
    return UNQUANT


def check_draft_quantization(d: DoctorInput) -> Check:
    name = "draft-quantization"
    method, where = target_quantization(d)
    explicit = extra_arg(d, DRAFT_QUANT_FLAG)
    if d.facts.base_model.config is None or d.facts.drafter.config is None:
        return Check(name, "warn", "cannot decide: the base model's or the drafter's config.json is unreadable")
    drafter = _declared_quantization(d.facts.drafter.config, d.facts.drafter.quant_files)
    if method is None:
        return Check(name, "pass", "the target is not quantized (no quantization_config in its config.json, no "
                     "--quantization in extra_args): the drafter loads as its checkpoint says")
    if explicit is not None:
        return Check(name, "pass", f"target quantized ({method}, {where}); {DRAFT_QUANT_FLAG} {explicit} is set "
                     "in extra_args, so deployctl leaves the draft's quantization to it")
    if drafter is not None:
        return Check(name, "pass", f"target quantized ({method}, {where}); the drafter declares its own "
                     f"quantization ({drafter}), which SGLang detects from its checkpoint")
    installed = _version(d)
    if installed is None:
        return Check(name, "warn", f"cannot decide: target quantized ({method}, {where}), drafter unquantized, and "
                     f"the SGLang version is unknown ({DRAFT_QUANT_FLAG} exists from 0.5.7)",
                     f"make SGLang's version readable, or add {DRAFT_QUANT_FLAG} {UNQUANT} to extra_args")
    if installed < DRAFT_QUANT_SINCE:
        return Check(name, "fail", f"target quantized ({method}, {where}), drafter unquantized (no "
                     f"quantization_config in {d.run.drafter}/config.json): {_version_text(d)} has no "
                     f"{DRAFT_QUANT_FLAG}, the draft inherits {method} and the server dies at draft load "
                     f"(\"Cannot find the config file for {method}\", sglang#28196)",
                     f"upgrade SGLang to 0.5.7+ (deployctl then passes {DRAFT_QUANT_FLAG} {UNQUANT})")
    return Check(name, "pass", f"target quantized ({method}, {where}), drafter unquantized (no quantization_config "
                 f"in {d.run.drafter}/config.json): deployctl passes {DRAFT_QUANT_FLAG} {UNQUANT}, so the draft does "
                 f"not inherit {method} and fail at load (\"Cannot find the config file for {method}\", sglang#28196)")


# ---------------------------------------------------------------------------------------------
# 3. SGLANG_SIMULATE_ACC_LEN

def check_simulated_acceptance(d: DoctorInput) -> Check:
    """SGLANG_SIMULATE_ACC_LEN (srt/environ.py, EnvFloat default -1; speculative/eagle_utils.py
    simulates when it is > 0, every version 0.5.6 - 0.5.23) is a benchmarking knob: the server then
    reports that accept length whatever the drafter does, so verify-acceptance and the nightly
    gate can no longer fail."""
    name = "simulated-acceptance"
    value, where = effective_env(d, "SGLANG_SIMULATE_ACC_LEN")
    if value is None:
        return Check(name, "pass", "SGLANG_SIMULATE_ACC_LEN is set neither in the run's env nor in the host's "
                     "environment: the accept length SGLang reports is measured")
    fix = ("remove SGLANG_SIMULATE_ACC_LEN from runs[].env" if where.startswith("the run's") else
           f"unset SGLANG_SIMULATE_ACC_LEN on {d.host.name} (its shell startup files, /etc/environment or sshd "
           "SetEnv), or set it to -1 in runs[].env")
    try:
        number = float(value)
    except ValueError:
        return Check(name, "warn", f"cannot decide: SGLANG_SIMULATE_ACC_LEN={_shown(value)} in {where} is not a number",
                     fix)
    value = _shown(value)
    if number <= 0:
        return Check(name, "pass", f"SGLANG_SIMULATE_ACC_LEN={value} in {where}: off (SGLang simulates only above 0)")
    return Check(name, "fail",
                 f"SGLANG_SIMULATE_ACC_LEN={value} in {where}: the server reports a simulated accept length of "
                 f"{value} whatever the drafter does (SGLang srt/environ.py, a test knob), so verify-acceptance "
                 "and the nightly gate can no longer fail", fix)


# ---------------------------------------------------------------------------------------------
# 4. the drafter's window

def _rope(config: dict[str, Any]) -> Optional[dict[str, Any]]:
    rope = config.get("rope_scaling")
    if not isinstance(rope, dict):
        return None
    kind = rope.get("rope_type", rope.get("type"))
    return None if kind in (None, "default") and "factor" not in rope else rope


def drafter_window(drafter: dict[str, Any], target: dict[str, Any]) -> Optional[int]:
    """Positions the drafter drafts well at: its max_position_embeddings, or, when the target scales
    RoPE and the drafter lost rope_scaling (speculators#574 dropped it in conversion), the unscaled
    window the target's rope_scaling starts from (original_max_position_embeddings)."""
    window = _int(drafter, "max_position_embeddings")
    target_rope, drafter_rope = _rope(target), _rope(drafter)
    if target_rope is not None and drafter_rope is None:
        original = target_rope.get("original_max_position_embeddings")
        if isinstance(original, int) and not isinstance(original, bool):
            window = original if window is None else min(window, original)
    return window


def check_drafter_window(d: DoctorInput) -> Check:
    """A WARNING, not a failure: short requests are unaffected; past the drafter's window the
    drafts are noise and speculation is slower than none (sglang#6783). No SGLang version checks it."""
    name = "drafter-window"
    drafter = _text_config(d.facts.drafter.config)
    target = _text_config(d.facts.base_model.config)
    drafter_max, target_max = _int(drafter, "max_position_embeddings"), _int(target, "max_position_embeddings")
    if drafter_max is None or target_max is None:
        return Check(name, "warn", "cannot decide: max_position_embeddings is missing from the drafter's or the "
                     "base model's config.json")
    context = _int_option(d, "--context-length")
    served = context or target_max
    problems = []
    if context is not None and drafter_max < context:
        problems.append(f"the drafter's max_position_embeddings {drafter_max} ({d.run.drafter}/config.json) < "
                        f"--context-length {context} in extra_args")
    elif context is None and drafter_max < target_max * WINDOW_FRACTION:
        problems.append(f"the drafter's max_position_embeddings {drafter_max} ({d.run.drafter}/config.json) is far "
                        f"below the target's {target_max} ({d.run.base_model}/config.json)")
    target_rope, drafter_rope = _rope(target), _rope(drafter)
    window = drafter_window(drafter, target)
    if target_rope is not None and drafter_rope is None and window is not None and window < served:
        problems.append(f"the target scales RoPE (rope_scaling {target_rope.get('rope_type', target_rope.get('type'))} "
                        f"factor {target_rope.get('factor')}) and the drafter's config.json has no rope_scaling: past "
                        f"{window} positions its drafts are noise (speculators#574 dropped it in conversion)")
    if problems:
        return Check(name, "warn", "; ".join(problems) + ": long requests get drafts that are noise past the "
                     "drafter's window, and speculation is slower than none there (sglang#6783)",
                     "deploy a drafter trained for the target's window (copy the target's rope_scaling into the "
                     "drafter's config.json if the converter dropped it), or cap --context-length in extra_args")
    return Check(name, "pass", f"the drafter's window ({drafter_max} positions"
                 f"{', rope_scaling as the target' if target_rope else ''}) covers the {served} served")


# ---------------------------------------------------------------------------------------------
# 5. the smaller ones, a version rule each

def check_spec_v2_env(d: DoctorInput) -> Check:
    name = "spec-v2-env"
    value, where = effective_env(d, "SGLANG_ENABLE_SPEC_V2")
    if value is None:
        return Check(name, "pass", "SGLANG_ENABLE_SPEC_V2 is not set")
    value = _shown(value)
    installed = _version(d)
    if installed is None:
        return Check(name, "warn", f"cannot decide: SGLANG_ENABLE_SPEC_V2={value} in {where} and the SGLang "
                     "version is unknown (0.5.14 removed it, PR #27964)")
    if installed < SPEC_V2_REMOVED:
        return Check(name, "pass", f"SGLANG_ENABLE_SPEC_V2={value} in {where}: honoured by {_version_text(d)} "
                     "(removed in 0.5.14, PR #27964)")
    return Check(name, "warn",
                 f"SGLANG_ENABLE_SPEC_V2={value} in {where}: {_version_text(d)} ignores it (removed in 0.5.14, PR "
                 "#27964): it no longer turns the overlap scheduler off",
                 "remove it; add --disable-overlap-schedule to extra_args for the synchronous path")


def check_max_running_requests(d: DoctorInput) -> Check:
    """With speculation SGLang sets max_running_requests to 48 unless it is given (server_args.py
    0.5.6 - 0.5.11, arg_groups/speculative_hook.py 0.5.13 - 0.5.23; sglang#34290). A WARNING: it
    matters only with more than 48 concurrent requests."""
    name = "max-running-requests"
    value = _int_option(d, "--max-running-requests")
    if value is not None:
        return Check(name, "pass", f"--max-running-requests {value} is set in extra_args")
    return Check(name, "warn", "--max-running-requests is not set: with speculative decoding SGLang silently caps "
                 "concurrent requests at 48 (sglang#34290); more queue",
                 "add --max-running-requests N (the concurrency the host should serve) to extra_args")


def check_page_size_topk(d: DoctorInput) -> Check:
    """topk > 1 with page_size > 1 raises at startup ("speculative_eagle_topk > 1 with page_size > 1
    is ...", since #9784; every version 0.5.6 - 0.5.23) unless the attention backend builds the
    per-branch tree (PAGE_TREE_BACKENDS)."""
    name = "page-size-topk"
    _, topk, _ = speculative_plan(d.run, d.draft_tokens)
    page = _int_option(d, "--page-size")
    if topk <= 1 or page is None or page <= 1:
        return Check(name, "pass", f"topk {topk}, page size {page or 1}: no paged tree")
    installed = _version(d)
    allowed = PAGE_TREE_BACKENDS if installed is None or installed >= PAGE_TREE_TRITON_SINCE else PAGE_TREE_BACKENDS_OLD
    backend = extra_arg(d, "--attention-backend")
    if backend in allowed:
        return Check(name, "pass", f"topk {topk} with --page-size {page}: --attention-backend {backend} supports it")
    fix = f"use --page-size 1, eagle_topk 1, or --attention-backend one of {', '.join(allowed)}"
    if backend:
        return Check(name, "fail", f"eagle_topk {topk} with --page-size {page} and --attention-backend {backend}: "
                     f"{_version_text(d)} refuses it at startup (topk > 1 with page_size > 1 only on "
                     f"{', '.join(allowed)}; since #9784)", fix)
    return Check(name, "warn", f"eagle_topk {topk} with --page-size {page} and no --attention-backend: "
                 f"{_version_text(d)} refuses it at startup unless its automatic backend is one of "
                 f"{', '.join(allowed)} (since #9784)", fix)


def check_hierarchical_cache(d: DoctorInput) -> Check:
    """HiCache with speculation lost acceptance while serving: 4.49 -> 1.59 after loadback
    (sglang#32176), 3.4 -> 1.9 over two hours (sglang#28771). No fix known as of 0.5.23. A WARNING:
    it depends on traffic; deployctl status shows the decay."""
    name = "hierarchical-cache"
    if extra_arg(d, "--enable-hierarchical-cache") is None:
        return Check(name, "pass", "--enable-hierarchical-cache is not set")
    return Check(name, "warn", "--enable-hierarchical-cache with speculative decoding: acceptance decays while "
                 "serving (4.49 -> 1.59 after cache loadback, sglang#32176; 3.4 -> 1.9 over two hours, sglang#28771; "
                 "no fix known as of SGLang 0.5.23)",
                 "remove --enable-hierarchical-cache from extra_args, or watch acceptance with deployctl status")


CHECKS = (check_draft_vocab_map, check_draft_quantization, check_simulated_acceptance, check_drafter_window,
          check_spec_v2_env, check_max_running_requests, check_page_size_topk, check_hierarchical_cache)
