"""SIMULATED ``python3 -m sglang.launch_server``: a TEST DOUBLE from deployctl's sandbox.

It loads no model and uses no GPU. It is a small stdlib HTTP server that behaves like SGLang
(read from the published wheels 0.5.6 - 0.5.23) where deployctl depends on it.

Faithful (on purpose, because deployctl must cope with it):
- Flags: the real names, aliases, choices and defaults for the subset listed in ``srt/server_args.py``
  (built like SGLang 0.5.15+: ``Arg`` dataclass fields plus literal calls); an unknown flag, a value
  outside its choices or of the wrong type is an argparse error (exit 2); ``--cuda-graph-max-bs``
  only exists up to 0.5.12.
- Speculative flag rules (server_args.py): num-steps unset => topk and draft tokens must be unset
  (auto-chosen); topk == 1 and T != S + 1 => a warning and T = S + 1, silently.
- Paths are not expanded: ``~/x`` or a missing dir fails like huggingface_hub does, exit 1.
- EAGLE-3 draft weight loading: the tensor names in the drafter's safetensors headers go through
  ``LlamaForCausalLMEagle3.load_weights``' name resolution for the simulated version (legacy
  0.5.6-0.5.11 ``model.midlayer.*`` vs 0.5.12+ ``model.layers.N.*`` with the midlayer legacy map);
  names matching no parameter are DROPPED WITHOUT A WORD (at --log-level debug we do say it,
  SGLang does not). A decoder layer left randomly initialised => ``accept len: 1.00``; so does
  ``--speculative-algorithm EAGLE`` with an EAGLE-3 drafter (one hidden state, PR #21272).
- GPUs: one child process per TP rank, argv[0] ``sglang::scheduler_TP<i>``, SIGKILLed when its parent
  dies however it died, as SGLang's kill_itself_when_parent_died (PR_SET_PDEATHSIG) has it, holding the host's simulated ``~/dev/nvidia<i>`` open so
  the simulated nvidia-smi and real ``fuser`` see them. A child killed from outside leaves the
  main process running but unhealthy (/health 503), as a dead scheduler does in SGLang.
- Startup/decode log lines in SGLang's format, ``Uvicorn running on ...``, ``The server is fired
  up and ready to roll!``, ``[Errno 98] ... address already in use`` (exit 1), the OOM traceback.
- HTTP: /health, /health_generate (503 until warmed up), /model_info (/get_model_info),
  /v1/models, /v1/loads (num_running_reqs per DP rank), /server_info (/get_server_info) with internal_states[0].avg_spec_accept_length once a
  decode log line was printed, /generate, /v1/completions, /v1/chat/completions, /flush_cache
  (resets the average), /metrics with --enable-metrics (404 without it, like SGLang: the route is
  only added then; SGLang's metric names and labels, see MetricsState).
- Weight updates (0.5.21+): /begin_weight_update, /update_weights_from_tensor (selector draft),
  /end_weight_update, ``--admin-api-key``, ``weight_version`` in /model_info; a swapped drafter goes
  through draft_weights_effect, the loader rules of a launch (srt/managers/weight_update.py says what
  is and is not faithful: the payload is the stand-in's own format, no CUDA IPC).

Also modelled (srt/speculative/pitfalls.py, issue 19): a reduced draft vocabulary without d2t
(accept len 1.00), the draft inheriting the target's quantization (``Cannot find the config file
for awq`` at draft load), SGLANG_SIMULATE_ACC_LEN (reports that accept length whatever the drafter),
drafts past the drafter's window (accept only the bonus token there), topk > 1 with page size > 1.

Not faithful:
- The port is bound (not listened on) before loading so a taken port fails fast; real SGLang
  finds out when uvicorn starts after loading. Connections are still refused until then.
- Acceptance is a deterministic model, not a measurement: with every draft tensor loaded, each
  verify step accepts 1 + G tokens, G geometric with p in [0.64, 0.68) (from a hash of the
  drafter's headers), capped at T - 1 (mean ~2.9 for T = 16, ~2.4 for T = 4). topk > 1 and the
  +1 shift of aux layer ids are NOT modelled. Modelled (accept len 1.00): a target architecture
  whose class in this install's srt/models/*.py (read as text; the sandbox installs the sources of
  the simulated version) has no set_eagle3_layers_to_capture (0.5.23+: ValueError at startup), and
  custom eagle_config aux ids on 0.5.10 or older without --disable-cuda-graph (PR #22836).
- ``import sglang`` sleeps SGLANG_SIM_IMPORT_SECONDS (2.5 s, like a real install's import); the
  package metadata (sglang-<version>.dist-info) is installed by the sandbox.
- Generated text is filler words; token counts are word counts. /generate streams (SSE, chunked); no tokenizer, no
  batching effects; timings are simulated (a decode step is 19.5 ms) and the real sleep is scaled
  by $SGLANG_SIM_TIME_SCALE.
- Memory: each rank allocates ``--mem-fraction-static`` x total + 1.5 GiB; the unbalanced-memory and
  "Not enough memory" checks use the other holders of the same simulated GPUs. Weights are a
  constant 75000 MiB per rank.
- Multi-node (--nnodes N --node-rank R --dist-init-addr HOST:PORT): rank 0 listens on the
  dist-init port and waits for the other nodes before loading; a rank > 0 connects to it (retrying
  while nothing listens) and serves no HTTP. Either side dies when its peer's connection closes
  (as torch.distributed's store and NCCL do), so rank 1 dying during load takes rank 0 down too.

Env knobs: SGLANG_SIM_CONFIG (the host's sim config, default ~/.sim/config.json),
SGLANG_SIM_LOAD_SECONDS (1.0), SGLANG_SIM_WARMUP_SECONDS (0.3), SGLANG_SIM_TIME_SCALE (0.02),
SGLANG_SIM_CRASH_DURING_LOAD=1 (or the file ~/.sim/crash_during_load): crash with CUDA OOM
midway through loading, exit 1. ``~/.sim/accept_factor`` holding F in (0, 1]: acceptance decays
while serving (accept length ~1 + F (L - 1) from the next request on, same PID; see accept_factor).

Drafter markers (files in the drafter directory, so a test's "bad new checkpoint" carries its own
badness and a rollback to the previous drafter's bytes really cures it):
  SIMULATION-crash-during-load   crash with CUDA OOM midway through loading, exit 1;
  SIMULATION-crash-on-generate   ready, then the first /generate kills the server (exit 1);
  SIMULATION-accept-nothing      every draft token rejected: accept len 1.00 (as a drafter whose
                                 weights are garbage would give);
  SIMULATION-decode-speed        a float F in (0, 10]: each decode step takes 1/F as long (F 0.5:
                                 half the output throughput, an injectable regression).
  SIMULATION-prompt-kinds        a JSON object {kind: factor}: this drafter's acceptance per prompt kind
                                 (srt/speculative/prompt_kinds.py: traffic-dependent acceptance, issue 43).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import re
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt.layers.quantization import QUANTIZATION_CHOICES
from sglang.srt.managers.weight_update import WEIGHT_UPDATE_PATHS, ModelUpdateLock, WeightUpdater
from sglang.srt.utils.auth import decide_request_auth
from sglang.srt.speculative import pitfalls, prompt_kinds

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
SIM_STEP_S = 0.0195  # one simulated decode step of a large MoE target at TP8
WEIGHTS_MIB = 75000  # per TP rank, constant (the stand-in base model has no weights)
GRAPH_MIB = 1536
DEFAULT_MEM_FRACTION = 0.88
MAX_TOTAL_TOKENS = 1_234_567
CHECKPOINT_SHARDS = 64
FILLER = ("the of and to in a is that for it as with was on be by this are from at or an "
          "which but not have has were all can more one will so up out if about into").split()


# --------------------------------------------------------------------------------------------
# logging in SGLang's shape: "[2026-11-29 10:00:00] msg" / "[2026-11-29 10:00:00 TP0] msg"

_log_lock = threading.Lock()


def log(message: str, tp: int | None = None) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    prefix = f"[{stamp} TP{tp}]" if tp is not None else f"[{stamp}]"
    with _log_lock:
        sys.stderr.write(f"{prefix} {message}\n")
        sys.stderr.flush()


def raw(message: str) -> None:
    with _log_lock:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def version_tuple(version: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# flags


def build_parser(version: str) -> argparse.ArgumentParser:
    # the options live where SGLang keeps them (srt/server_args.py), whose source the doctor reads with ast
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(
        prog="launch_server.py",
        description="SIMULATED SGLang server (deployctl sandbox test double).")
    ServerArgs.add_cli_args(p, version)
    return p


def finalize_args(args: argparse.Namespace) -> list[str]:
    """Fill defaults the way ServerArgs.__post_init__ does; returns the warnings it logs."""
    warnings: list[str] = []
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.mem_fraction_static is None:
        args.mem_fraction_static = DEFAULT_MEM_FRACTION
    if args.chunked_prefill_size is None:
        args.chunked_prefill_size = 8192
    if args.page_size is None:
        args.page_size = 1
    if args.random_seed is None:
        args.random_seed = 42
    if args.nnodes > 1:
        if not args.dist_init_addr or ":" not in args.dist_init_addr:
            raise ValueError("--dist-init-addr HOST:PORT is required with --nnodes > 1")
        if not 0 <= args.node_rank < args.nnodes:
            raise ValueError(f"--node-rank {args.node_rank} is not in [0, {args.nnodes})")
    algo = args.speculative_algorithm
    if algo is None:
        return warnings
    if args.max_running_requests is None:
        args.max_running_requests = 48
    if algo in ("EAGLE", "EAGLE3", "STANDALONE") and args.speculative_draft_model_path is None:
        raise ValueError(f"speculative_draft_model_path is required for --speculative-algorithm {algo}")
    if algo == "NEXTN" and args.speculative_draft_model_path is None:
        args.speculative_draft_model_path = args.model_path
    if args.speculative_num_steps is None:
        if args.speculative_eagle_topk is not None or args.speculative_num_draft_tokens is not None:
            raise ValueError(
                "speculative_num_steps is not set, so speculative_eagle_topk and "
                "speculative_num_draft_tokens must not be set either (SGLang chooses the three together); "
                f"got speculative_eagle_topk={args.speculative_eagle_topk}, "
                f"speculative_num_draft_tokens={args.speculative_num_draft_tokens}")
        args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens = 3, 1, 4
    if args.speculative_eagle_topk is None:
        args.speculative_eagle_topk = 1
    if args.speculative_num_draft_tokens is None:
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    if (args.speculative_eagle_topk == 1
            and args.speculative_num_draft_tokens != args.speculative_num_steps + 1):
        warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")
        args.speculative_num_draft_tokens = args.speculative_num_steps + 1
    # since #9784 (0.5.6 - 0.5.12 server_args.py: flashinfer, fa3; 0.5.13+ also triton)
    tree_backends = ("flashinfer", "fa3") + (("triton",) if version_tuple(args.sim_version) >= (0, 5, 13) else ())
    if args.speculative_eagle_topk > 1 and args.page_size > 1 and args.attention_backend not in tree_backends:
        raise ValueError(f"speculative_eagle_topk > 1 with page_size > 1 is only supported on {tree_backends}; "
                         f"got attention_backend={args.attention_backend!r}. Use page_size == 1 or one of those "
                         "backends.")
    return warnings


# --------------------------------------------------------------------------------------------
# errors shaped like the libraries SGLang calls


class HFValidationError(ValueError):
    pass


HFValidationError.__module__ = "huggingface_hub.errors"


def check_model_dir(path: str) -> None:
    if not os.path.isdir(path):
        # SGLang hands a non-directory to huggingface_hub as a repo id; "~" is never expanded.
        raise HFValidationError(
            f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. "
            "Use `repo_type` argument if needed.")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise OSError(f"{path} does not appear to have a file named config.json. Checkout "
                      f"'https://huggingface.co/{path}/tree/None' for available files.")


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------------------------
# EAGLE-3 draft checkpoint: SGLang's name resolution (llama_eagle3.py, load_weights)

LAYER_PARAMS = ("hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
                "self_attn.qkv_proj.weight", "self_attn.o_proj.weight", "mlp.gate_up_proj.weight",
                "mlp.down_proj.weight")
STACKED = ((".q_proj", ".qkv_proj"), (".k_proj", ".qkv_proj"), (".v_proj", ".qkv_proj"),
           (".gate_proj", ".gate_up_proj"), (".up_proj", ".gate_up_proj"))


def read_safetensors_header(path: str) -> dict:
    # Deliberately NOT the product's reader (deploy/remote/fixer/header.py): this stand-in is the
    # oracle fix-keys is tested against, so it reads the file on its own, as SGLang does through the
    # safetensors library (not installed for the sandbox hosts' system python3), with that library's
    # error texts. A shared reader would let one bug pass both sides.
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise RuntimeError(f"Error while deserializing header: {path} is too small")
        (n,) = struct.unpack("<Q", head)
        if n > 100_000_000:
            raise RuntimeError(f"Error while deserializing header: HeaderTooLarge ({path})")
        blob = f.read(n)
    if len(blob) != n:
        raise RuntimeError(f"Error while deserializing header: InvalidHeaderLength ({path})")
    return json.loads(blob.decode("utf-8"))


def checkpoint_tensor_names(model_dir: str) -> tuple[list[str], str]:
    """Tensor names of a checkpoint dir (index.json first, else every *.safetensors), + a digest."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        files = sorted(set(read_json(index)["weight_map"].values()))
    else:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise RuntimeError(f"Cannot find any model weights with `{model_dir}`")
    names: list[str] = []
    digest = hashlib.sha256()
    for fname in files:
        header = read_safetensors_header(os.path.join(model_dir, fname))
        digest.update(json.dumps(header, sort_keys=True).encode())
        names.extend(k for k in header if k != "__metadata__")
    return names, digest.hexdigest()


def is_eagle3_drafter(config: dict) -> bool:
    archs = config.get("architectures") or []
    return any(a == "LlamaForCausalLMEagle3" or a.startswith("Eagle3") for a in archs) \
        or config.get("speculators_model_type") == "eagle3"


def drafter_num_layers(config: dict) -> int:
    nested = config.get("transformer_layer_config") or {}
    return int(config.get("num_hidden_layers", nested.get("num_hidden_layers", 1)))


def eagle3_params(version: tuple[int, int, int], num_layers: int, config: dict) -> set[str]:
    if version < (0, 5, 12):
        if num_layers != 1:
            raise ValueError("EAGLE3 currently only supports 1 layer")
        prefixes = ["model.midlayer."]
    else:
        prefixes = [f"model.layers.{i}." for i in range(num_layers)]
    params = {p + s for p in prefixes for s in LAYER_PARAMS}
    params |= {"model.fc.weight", "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}
    if version >= (0, 5, 12):
        if config.get("norm_before_fc"):
            params.add("model.input_norm.weight")
        if config.get("use_aux_norm") or config.get("fc_norm"):
            params |= {f"model.fc_norm.{k}.weight" for k in range(3)}
    return params


@dataclass
class Resolution:
    params: set[str]
    loaded: dict[str, list[str]] = field(default_factory=dict)  # param -> checkpoint names
    dropped: list[str] = field(default_factory=list)
    hot_token_map: bool = False


def resolve_eagle3_names(names: list[str], version: tuple[int, int, int], params: set[str]) -> Resolution:
    """Where each checkpoint tensor lands, in load_weights' order (``srt/models/llama_eagle3.py``
    ``LlamaForCausalLMEagle3.load_weights``; legacy ``midlayer`` map from 0.5.12, PR #24663)."""
    res = Resolution(params=params)
    for original in names:
        name = original
        if version >= (0, 5, 12):  # PR #24663's legacy map
            name = re.sub(r"(^|\.)midlayer\.", r"\1layers.0.", name)
            for old, new in (("aux_norm_low", "fc_norm.0"), ("aux_norm_mid", "fc_norm.1"),
                             ("aux_norm_high", "fc_norm.2")):
                name = name.replace(old, new)
        if "d2t" in name:
            res.hot_token_map = True
            continue
        if "t2d" in name:
            continue
        for old, new in STACKED:
            if old in name:
                name = name.replace(old, new)
                break
        if name in params:
            res.loaded.setdefault(name, []).append(original)
        elif "model." + name in params:
            res.loaded.setdefault("model." + name, []).append(original)
        else:
            res.dropped.append(original)  # SGLang says nothing here
    return res


# --------------------------------------------------------------------------------------------
# the target's side of EAGLE-3: aux hidden state capture (``set_eagle3_layers_to_capture``;
# kimi_k25 gains it in 0.5.10, PR #19689)

_CLASS = re.compile(r"^class\s+(\w+)\s*(?:\(([^)]*)\))?\s*:", re.M)
_TOP_LEVEL = re.compile(r"^\S", re.M)
_HOOK = re.compile(r"^\s+def\s+set_eagle3_layers_to_capture\s*\(", re.M)


def _model_classes() -> dict[str, tuple[list[str], bool]]:
    """class -> (bases, defines set_eagle3_layers_to_capture), from THIS install's model sources.

    Read as text from sglang/srt/models/*.py next to this file: the sandbox installs the sources
    of the simulated version (kimi_k25 gains the hook in 0.5.10), so the answer follows the files,
    not a table, just as in real SGLang where the method either exists on the model or not.
    """
    models = os.path.join(os.path.dirname(os.path.abspath(__file__)), "srt", "models")
    classes: dict[str, tuple[list[str], bool]] = {}
    for name in sorted(os.listdir(models)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(models, name)) as f:
            text = f.read()
        for m in _CLASS.finditer(text):
            end = _TOP_LEVEL.search(text, m.end())
            body = text[m.end():end.start() if end else len(text)]
            bases = [b.strip().split(".")[-1] for b in (m.group(2) or "").split(",") if b.strip()]
            classes.setdefault(m.group(1), (bases, bool(_HOOK.search(body))))
    return classes


def _has_hook(classes: dict[str, tuple[list[str], bool]], name: str, depth: int = 0) -> bool:
    if name not in classes or depth > 16:
        return False
    bases, hook = classes[name]
    return hook or any(_has_hook(classes, b, depth + 1) for b in bases)


def target_capture(target_config: dict, version: tuple[int, int, int]) -> str | None:
    """Why the target sends one hidden state instead of the aux ones, or None when it captures."""
    archs = [a for a in target_config.get("architectures") or [] if isinstance(a, str)]
    classes = _model_classes()
    known = [a for a in archs if a in classes]
    if not known:
        raise ValueError(f"Model architectures {archs} are not supported for now. "
                         f"Supported architectures: {sorted(classes)}")
    arch = known[0]
    if _has_hook(classes, arch):
        return None
    if version >= (0, 5, 23):
        raise ValueError(f"Model {arch} does not support EAGLE3 aux hidden state capture "
                         "(no set_eagle3_layers_to_capture)")
    # 0.5.22 and older skip capture without a word: fc is bypassed (7168 == 7168).
    return f"target {arch} has no set_eagle3_layers_to_capture: one hidden state, fc bypassed"


def _target_layers(target_config: dict) -> int | None:
    text = target_config.get("text_config") if isinstance(target_config.get("text_config"), dict) else {}
    value = text.get("num_hidden_layers", target_config.get("num_hidden_layers"))
    return value if isinstance(value, int) else None


def cuda_graph_capture_bug(draft_config: dict, target_config: dict, version: tuple[int, int, int],
                           cuda_graph_disabled: bool) -> str | None:
    """PR #22836 (fixed in 0.5.11): graphed decode captured the default layers, not custom ids."""
    eagle = draft_config.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    layers = _target_layers(target_config)
    if ids is None or version >= (0, 5, 11) or cuda_graph_disabled:
        return None
    if layers is not None and list(ids) == [2, layers // 2, layers - 3]:
        return None
    return f"custom aux layer ids {ids} ignored under CUDA graphs (SGLang <= 0.5.10, PR #22836)"


@dataclass
class Speculation:
    algorithm: str | None
    draft_tokens: int = 1
    accept_p: float = 0.0  # per-extra-token acceptance; 0 => accept len 1.00
    collapse_reason: str | None = None
    debug: list[str] = field(default_factory=list)
    draft_arch: str = ""
    crash_during_load: bool = False
    crash_on_generate: bool = False
    step_s: float = SIM_STEP_S
    draft_quantization: str | None = None
    #: the draft load's ValueError (an unquantized drafter inheriting a quantization that needs a file)
    draft_load_error: str | None = None
    #: SGLANG_SIMULATE_ACC_LEN: the accept length reported whatever the drafter does
    simulated_accept: float | None = None
    #: positions the drafter drafts well at (its window); later steps accept only the bonus token
    draft_window: int | None = None
    #: SIMULATION-prompt-kinds: this drafter's extra-token factor per prompt kind (prompt_kinds.py)
    kind_factors: dict = field(default_factory=dict)
    #: the draft and target config.json the server launched with (a weight update keeps them)
    draft_config: dict = field(default_factory=dict)
    target_config: dict = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return self.algorithm is not None


def drafter_markers(draft_dir: str) -> dict[str, str]:
    """SIMULATION-* files in the drafter directory: name -> stripped content."""
    found = {}
    for name in MARKERS:
        path = os.path.join(draft_dir, f"SIMULATION-{name}")
        if os.path.isfile(path):
            with open(path) as f:
                found[name] = f.read().strip()
    return found


MARKERS = ("crash-during-load", "crash-on-generate", "accept-nothing", "decode-speed", "prompt-kinds")


def read_drafter_markers(markers: dict[str, str], spec: "Speculation") -> None:
    """SIMULATION markers of the drafter (see the module docstring): read from its directory at
    launch, carried in the stand-in's weight-update payload on a swap."""
    def marker(name: str) -> str | None:
        return markers.get(name)

    if marker("crash-during-load") is not None:
        spec.crash_during_load = True
    if marker("crash-on-generate") is not None:
        spec.crash_on_generate = True
    if marker("accept-nothing") is not None:
        spec.accept_p = 0.0
        spec.collapse_reason = "SIMULATION-accept-nothing marker in the drafter"
    speed = marker("decode-speed")
    if speed is not None:
        factor = float(speed)
        if not 0 < factor <= 10:
            raise ValueError(f"SIMULATION-decode-speed must be in (0, 10], got {speed!r}")
        spec.step_s = SIM_STEP_S / factor
    kinds = marker("prompt-kinds")
    if kinds is not None:
        spec.kind_factors = prompt_kinds.parse_marker(kinds)


def analyse_speculation(args: argparse.Namespace, version: str) -> Speculation:
    algo = args.speculative_algorithm
    if algo is None:
        return Speculation(None)
    spec = Speculation(algo, draft_tokens=args.speculative_num_draft_tokens)
    if algo == "NGRAM":
        spec.accept_p = 0.30
        return spec
    draft_dir = args.speculative_draft_model_path
    check_model_dir(draft_dir)
    config = read_json(os.path.join(draft_dir, "config.json"))
    spec.draft_arch = ",".join(config.get("architectures") or ["?"])
    names, digest = checkpoint_tensor_names(draft_dir)
    target = read_json(os.path.join(args.model_path, "config.json"))
    if args.quantization == "unquant":
        target_quant = None
    else:  # --quantization, else what the target's config.json declares
        target_quant = args.quantization or pitfalls.declared_quantization(target)
    spec.draft_quantization, spec.draft_load_error = pitfalls.draft_load_error(
        target_quant, getattr(args, "speculative_draft_model_quantization", None), config, draft_dir)
    spec.simulated_accept = pitfalls.simulated_accept_length()
    spec.draft_window = pitfalls.draft_window(config, target)
    spec.draft_config, spec.target_config = config, target
    return draft_weights_effect(spec, args, version, names, digest, drafter_markers(draft_dir))


def draft_weights_effect(spec: Speculation, args: argparse.Namespace, version: str, names: list[str],
                         digest: str, markers: dict[str, str]) -> Speculation:
    """What the drafter's tensors do to acceptance, given the draft config the server launched with.

    Run at launch, and again by a weight-update session (srt/managers/weight_update.py) with the
    names, header digest and markers the payload carries: a swapped drafter is judged by exactly
    the loader rules a launch with it would be (a tensor the loader drops is dropped on a swap too).
    """
    config, target = spec.draft_config, spec.target_config
    jitter = int(digest[:8], 16) / 0xFFFFFFFF
    spec.accept_p = 0.64 + 0.04 * min(jitter, 0.999)
    read_drafter_markers(markers, spec)
    algo = spec.algorithm
    if spec.collapse_reason or not is_eagle3_drafter(config):
        return spec
    if algo == "EAGLE":
        # EAGLE (not EAGLE3) sends one hidden state to an EAGLE-3 draft: fc is bypassed (PR #21272).
        spec.accept_p = 0.0
        spec.collapse_reason = "EAGLE algorithm with an EAGLE-3 drafter: one hidden state"
        return spec
    vt = version_tuple(version)
    capture = target_capture(target, vt)
    if capture is not None:
        spec.accept_p = 0.0
        spec.collapse_reason = capture
        return spec
    graph_bug = cuda_graph_capture_bug(config, target, vt, args.disable_cuda_graph)
    if graph_bug is not None:
        spec.accept_p = 0.0
        spec.collapse_reason = graph_bug
        return spec
    layers = drafter_num_layers(config)
    params = eagle3_params(vt, layers, config)
    res = resolve_eagle3_names(names, vt, params)
    for name in res.dropped:
        spec.debug.append(f"eagle3 load_weights: no parameter for checkpoint tensor {name!r}; skipped")
    layer_prefixes = ["model.midlayer."] if vt < (0, 5, 12) else [f"model.layers.{i}." for i in range(layers)]
    critical = {"model.fc.weight", "lm_head.weight"}
    for i, prefix in enumerate(layer_prefixes):
        for sub in LAYER_PARAMS:
            if i > 0 and sub == "input_layernorm.weight":
                continue  # layers N > 0 never use it
            if i > 0 and sub == "hidden_norm.weight":
                continue  # handled below: a silent degradation, not a collapse
            critical.add(prefix + sub)
    missing = sorted(critical - set(res.loaded))
    dropped_layer = [n for n in res.dropped if re.search(r"(^|\.)(midlayer|layers\.\d+)\.", n)]
    if missing or dropped_layer:
        spec.accept_p = 0.0
        spec.collapse_reason = (f"{len(missing)} draft parameters kept their random init "
                                f"({', '.join(missing[:3])}{'...' if len(missing) > 3 else ''})")
        spec.debug.append(f"eagle3: never loaded: {missing}")
        return spec
    if vt >= (0, 5, 12) and layers > 1:
        unset = [p for p in (f"model.layers.{i}.hidden_norm.weight" for i in range(1, layers))
                 if p not in res.loaded]
        if unset:  # speculators' layer N>0 pre-attention norm went to input_layernorm
            spec.accept_p *= 0.55
            spec.debug.append(f"eagle3: hidden_norm left at 1.0 for {unset}")
    vocab = pitfalls.vocab_collapse(config, target, res.hot_token_map, args.speculative_token_map)
    if vocab is not None:
        spec.accept_p = 0.0
        spec.collapse_reason = vocab
        return spec
    if "model.norm.weight" not in res.loaded:
        spec.accept_p *= 0.85
    return spec


# --------------------------------------------------------------------------------------------
# the simulated GPUs (see sim_nvidia_smi.py for the same scan)


def load_sim_config() -> dict:
    path = os.environ.get("SGLANG_SIM_CONFIG") or os.path.expanduser("~/.sim/config.json")
    try:
        config = read_json(path)
    except OSError as exc:
        raise RuntimeError(f"SIMULATION: no sandbox sim config at {path} ({exc.strerror}); "
                           "the stand-in SGLang only runs on a deployctl sandbox host") from None
    sim_dir = os.path.dirname(os.path.abspath(path))
    config.setdefault("alloc_dir", os.path.join(sim_dir, "alloc"))
    config.setdefault("gpu_total_mib", 143771)
    config.setdefault("sim_dir", sim_dir)
    return config


def gpu_usage_by_others(config: dict, exclude: set[int]) -> dict[int, int]:
    """MiB in use per simulated GPU by live holders of its device file (not in ``exclude``)."""
    count = int(config["gpu_count"])
    wanted = {}
    for i in range(count):
        p = os.path.join(config["gpu_dir"], f"nvidia{i}")
        wanted[p] = i
        wanted[os.path.realpath(p)] = i
    used = {i: 0 for i in range(count)}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude or int(entry) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        seen = set()
        for fd in fds:
            try:
                gpu = wanted.get(os.readlink(f"/proc/{entry}/fd/{fd}"))
            except OSError:
                continue
            if gpu is None or gpu in seen:
                continue
            seen.add(gpu)
            try:
                with open(os.path.join(config["alloc_dir"], f"{entry}.{gpu}")) as f:
                    used[gpu] += int(f.read().strip() or "0")
            except (OSError, ValueError):
                used[gpu] += 512
    return used


# The C module _signal, not signal: the signal module's IntEnum wrappers import enum, about a third
# of each rank's 15 ms of CPU to start (Python 3.11, 2026-12-06), and every launch starts one per GPU.
# Dying with the parent: SGLang's ranks set PR_SET_PDEATHSIG to SIGKILL (sglang/srt/utils
# kill_itself_when_parent_died); prctl needs ctypes here, 2.8 of a rank's ~10 ms of CPU (2026-12-07,
# about 1,500 ranks a suite run). The same outcome without it: the parent holds the only write end of
# the LIFELINE pipe, so the rank's blocking read returns EOF the moment the parent is gone, however it
# died (SIGKILL included), and the rank SIGKILLs itself; a parent gone before the read is EOF at once.
CHILD_PROGRAM = r"""
import os, sys
import _signal as signal
dev, ctl, alloc_dir, parent, gpu, lifeline = sys.argv[1:7]
if os.getppid() != int(parent):
    os._exit(1)
held = [open(dev, "rb"), open(ctl, "rb")]
def _term(signum, frame):
    for suffix in ("", ".util"):
        try:
            os.unlink(os.path.join(alloc_dir, "%d.%s%s" % (os.getpid(), gpu, suffix)))
        except OSError:
            pass
    os._exit(0)
signal.signal(signal.SIGTERM, _term)
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdout.write("ready\n")
sys.stdout.flush()
while os.read(int(lifeline), 1):
    pass
os.kill(os.getpid(), signal.SIGKILL)
"""

#: the write ends of the ranks' lifelines, held open (never written) for this process's whole life
_LIFELINES: list[int] = []


@dataclass
class Rank:
    tp: int
    gpu: int
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid


def write_alloc(config: dict, rank: Rank, mib: int) -> None:
    path = os.path.join(config["alloc_dir"], f"{rank.pid}.{rank.gpu}")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(f"{int(mib)}\n")
        os.replace(tmp, path)
    except OSError:
        pass


def clear_alloc(config: dict, rank: Rank) -> None:
    for suffix in ("", ".util"):
        try:
            os.unlink(os.path.join(config["alloc_dir"], f"{rank.pid}.{rank.gpu}{suffix}"))
        except OSError:
            pass


def spawn_ranks(config: dict, gpus: list[int]) -> list[Rank]:
    ranks = []
    ctl = os.path.join(config["gpu_dir"], "nvidiactl")
    lifeline, keep = os.pipe()  # both close-on-exec: only the ranks get the read end (pass_fds)
    _LIFELINES.append(keep)
    try:
        for tp, gpu in enumerate(gpus):
            dev = os.path.join(config["gpu_dir"], f"nvidia{gpu}")
            proc = subprocess.Popen(
                [f"sglang::scheduler_TP{tp}", "-I", "-S", "-c", CHILD_PROGRAM, dev, ctl,
                 config["alloc_dir"], str(os.getpid()), str(gpu), str(lifeline)],
                executable=sys.executable or "/usr/bin/python3", stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, text=True, pass_fds=(lifeline,))
            ranks.append(Rank(tp, gpu, proc))
    finally:
        os.close(lifeline)
    for rank in ranks:
        line = rank.proc.stdout.readline() if rank.proc.stdout else ""
        if rank.proc.stdout:
            rank.proc.stdout.close()
        if line.strip() != "ready":
            raise RuntimeError(f"scheduler TP{rank.tp} did not start (exit {rank.proc.poll()})")
    return ranks


def stop_ranks(config: dict, ranks: list[Rank], timeout: float = 5.0) -> None:
    for rank in ranks:
        if rank.proc.poll() is None:
            try:
                rank.proc.terminate()
            except OSError:
                pass
    deadline = time.monotonic() + timeout
    for rank in ranks:
        try:
            rank.proc.wait(max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.proc.kill()
            rank.proc.wait()
        clear_alloc(config, rank)


def scheduler_exception(tp: int, frames: list[tuple[str, int, str, str]], final: str) -> None:
    lines = ["Scheduler hit an exception: Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(final)
    log("\n".join(lines) + "\n", tp=tp)
    log("Received sigquit from a child process. It usually means the child failed.")


def _srt(path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "srt", path)


LOAD_FRAMES = [
    (_srt("managers/scheduler.py"), 2950, "run_scheduler_process",
     "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)"),
    (_srt("managers/scheduler.py"), 345, "__init__", "self.tp_worker = TpWorkerClass("),
    (_srt("managers/tp_worker.py"), 95, "__init__", "self.model_runner = ModelRunner("),
    (_srt("model_executor/model_runner.py"), 312, "__init__", "self.initialize(min_per_gpu_memory)"),
    (_srt("model_executor/model_runner.py"), 388, "initialize", "self.load_model()"),
    (_srt("model_loader/loader.py"), 594, "load_model", "self.load_weights_and_postprocess("),
]


def capacity_gib(total_mib: int) -> float:
    return total_mib / 1024 * (139.81 / (143771 / 1024))  # torch reports 139.81 GiB on an H200


def oom_message(gpu: int, total_mib: int) -> str:
    cap = capacity_gib(total_mib)
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {gpu} has a "
            f"total capacity of {cap:.2f} GiB of which 1.06 GiB is free. Including non-PyTorch "
            f"memory, this process has {cap - 1.07:.2f} GiB memory in use. Of the allocated memory "
            f"{cap - 3.61:.2f} GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but "
            "unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


# --------------------------------------------------------------------------------------------
# the engine: decode simulation and the numbers SGLang reports


def accept_factor() -> float:
    """The acceptance decay knob: ``~/.sim/accept_factor`` (beside the sim config) holding F in (0, 1].

    From the next request on, each verify step keeps only F of its accepted draft tokens, so the
    accept length falls from L to about 1 + F (L - 1) while the server keeps serving with the same
    PID, as upstream saw after HiCache loadback (sglang#32176: 4.49 -> 1.59) or over hours
    (#28771: 3.4 -> 1.9). No file (or a bad one): 1.0."""
    config = os.environ.get("SGLANG_SIM_CONFIG") or os.path.expanduser("~/.sim/config.json")
    try:
        with open(os.path.join(os.path.dirname(config), "accept_factor"), encoding="utf-8") as handle:
            value = float(handle.read(64).strip())
    except (OSError, ValueError):
        return 1.0
    return value if 0.0 < value <= 1.0 else 1.0


def answer_override(path: str) -> tuple[int, bytes, float] | None:
    """The hostile-answer knob (issue 38): ``~/.sim/answers.json`` (beside the sim config) maps an
    HTTP path to ``{"status": 200, "body": TEXT or "deep", "sleep": S}``: the request is handled as
    usual (a weight update really loads), then, after S seconds, answered with TEXT (``deep``: JSON
    nested 100,000 levels) instead. No file, a bad one or another path: None."""
    config = os.environ.get("SGLANG_SIM_CONFIG") or os.path.expanduser("~/.sim/config.json")
    try:
        with open(os.path.join(os.path.dirname(config), "answers.json"), encoding="utf-8") as handle:
            entry = json.loads(handle.read(1 << 20)).get(path)
        if not isinstance(entry, dict):
            return None
        body = entry.get("body", "")
        raw = (b"[" * 100_000 + b"]" * 100_000) if body == "deep" else str(body).encode()
        return int(entry.get("status", 200)), raw, float(entry.get("sleep", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _prom_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class MetricsState:
    """What SGLang's Prometheus collectors hold (srt/metrics/collector.py, 0.5.23), for /metrics with
    --enable-metrics: the scheduler's gauges are set at each decode log line (so
    ``sglang:spec_accept_length`` is the last interval's, not the average since start that
    /server_info reports), the tokenizer's counters grow per finished request."""

    def __init__(self) -> None:
        self.accept_length = 0.0
        self.accept_rate = 0.0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        #: sglang:inter_token_latency_seconds (a histogram: the decode time per output token, per request)
        self.itl_sum = 0.0
        self.itl_count = 0
        self.itl_buckets = [0] * len(ITL_BUCKETS)
        self.created = time.time()
        self._v = 0.5

    def decode_logged(self, accept: float | None, rate: float) -> None:
        if accept is not None:
            self.accept_length, self.accept_rate = accept, rate

    def finished(self, prompt_tokens: int, completion_tokens: int, decode_s: float = 0.0) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += completion_tokens
        self.requests += 1
        if completion_tokens > 1 and decode_s > 0:
            # SGLang observes one inter-token gap per streamed output chunk; the stand-in observes the
            # request's mean gap once per output token (the histogram's mean is what deployctl reads)
            gap = decode_s / completion_tokens
            self.itl_sum += gap * completion_tokens
            self.itl_count += completion_tokens
            for i, bound in enumerate(ITL_BUCKETS):
                if gap <= bound:
                    self.itl_buckets[i] += completion_tokens

    def decayed(self, accepted: int, factor: float) -> int:
        if factor >= 1.0 or accepted <= 1:
            return accepted
        extra = (accepted - 1) * factor
        self._v = (self._v + 0.7548776662466927) % 1.0  # low-discrepancy: the mean is kept
        return 1 + int(extra) + (1 if self._v < extra - int(extra) else 0)

    def render(self, model: str, running: int, gen_throughput: float) -> str:
        name = _prom_label(model)
        scheduler = f'{{engine_type="unified",model_name="{name}",pp_rank="0",tp_rank="0"}}'
        tokenizer = f'{{model_name="{name}"}}'
        rows = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.", scheduler, running),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", scheduler, 0),
            ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", scheduler, gen_throughput),
            ("sglang:spec_accept_length", "gauge", "The average acceptance length of speculative decoding.",
             scheduler, self.accept_length),
            ("sglang:spec_accept_rate", "gauge", "The average acceptance rate of speculative decoding "
             "(`accepted tokens / total draft tokens` in batch).", scheduler, self.accept_rate),
        ]
        out = []
        for metric, kind, doc, labels, value in rows:
            out += [f"# HELP {metric} {doc}", f"# TYPE {metric} {kind}", f"{metric}{labels} {float(value)}"]
        for base, doc, value in (("sglang:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
                                 ("sglang:generation_tokens", "Number of generation tokens processed.",
                                  self.generation_tokens),
                                 ("sglang:num_requests", "Number of requests processed.", self.requests)):
            # prometheus_client: a Counter exposes NAME_total and NAME_created
            out += [f"# HELP {base}_total {doc}", f"# TYPE {base}_total counter",
                    f"{base}_total{tokenizer} {float(value)}", f"{base}_created{tokenizer} {self.created}"]
        metric = "sglang:inter_token_latency_seconds"
        out += [f"# HELP {metric} Histogram of inter-token latency in seconds.", f"# TYPE {metric} histogram"]
        for bound, count in zip(ITL_BUCKETS, self.itl_buckets):
            out.append(f'{metric}_bucket{{le="{bound}",model_name="{name}"}} {float(count)}')
        out += [f'{metric}_bucket{{le="+Inf",model_name="{name}"}} {float(self.itl_count)}',
                f"{metric}_count{tokenizer} {float(self.itl_count)}", f"{metric}_sum{tokenizer} {self.itl_sum}"]
        return "\n".join(out) + "\n"


#: sglang:inter_token_latency_seconds' bucket bounds (a subset of SGLang's, srt/metrics/collector.py)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2)


class Engine:
    def __init__(self, args: argparse.Namespace, version: str, spec: Speculation,
                 base_config: dict, seed: float):
        self.args = args
        self.version = version
        self.spec = spec
        self.base_config = base_config
        self.lock = threading.Lock()
        self.ready = False
        self.schedulers_alive = True
        self.running = 0
        self.total_tokens_in_use = 0
        self.interval_steps = 0
        self.interval_tokens = 0
        self.flush_steps = 0
        self.flush_accepted = 0
        self.avg_accept: float | None = None
        self.last_gen_throughput = 0.0
        self._u = seed % 1.0
        self._w = (seed * 7.0) % 1.0
        self.metrics_state = MetricsState()
        self.weight_version = args.weight_version
        self.weight_updates = WeightUpdater(self, version)
        self.model_update_lock = ModelUpdateLock()

    def swap_draft(self, names: list[str], digest: str, markers: dict[str, str]) -> None:
        """Load a new drafter's tensors into the running draft model (SGLang's draft runners call
        the draft model's own load_weights): acceptance follows from the same rules as a launch."""
        fresh = dataclasses.replace(self.spec, accept_p=0.0, collapse_reason=None, debug=[], kind_factors={},
                                    crash_during_load=False, crash_on_generate=False, step_s=SIM_STEP_S)
        fresh = draft_weights_effect(fresh, self.args, self.version, names, digest, markers)
        if self.args.log_level.lower() == "debug":
            for line in fresh.debug:
                log(f"DEBUG: {line}")
        with self.lock:
            self.spec = fresh

    # Low-discrepancy draws keep the average close to its expectation after a few steps.
    def _accepted_this_step(self, position: int = 0) -> int:
        if not self.spec.enabled:
            return 1
        p, t = self.spec.accept_p, self.spec.draft_tokens
        simulated = self.spec.simulated_accept
        if simulated is not None:  # SGLANG_SIMULATE_ACC_LEN: the drafter does not matter
            self._u = (self._u + 0.6180339887498949) % 1.0
            whole = int(math.floor(simulated))
            return max(1, min(t, whole + (1 if self._u < simulated - whole else 0)))
        window = self.spec.draft_window
        if window is not None and position >= window:
            return 1  # past the drafter's window its drafts are noise (sglang#6783)
        if p <= 0.0 or t <= 1:
            return 1
        self._u = (self._u + 0.6180339887498949) % 1.0
        u = max(self._u, 1e-12)
        return 1 + min(t - 1, int(math.floor(math.log(u) / math.log(p))))

    def _accept_rate(self, accept_len: float) -> float:
        t = max(1, self.spec.draft_tokens)
        if version_tuple(self.version) < (0, 5, 12):
            return accept_len / t
        return (accept_len - 1) / max(1, t - 1)

    def _decode_log_line(self) -> None:
        """Print one 'Decode batch.' line for the steps since the last one (lock held)."""
        if self.interval_steps == 0:
            return
        accept = self.interval_tokens / self.interval_steps
        throughput = self.interval_tokens / (self.interval_steps * self.spec.step_s)
        self.last_gen_throughput = throughput
        self.metrics_state.decode_logged(accept if self.spec.enabled else None, self._accept_rate(accept))
        tokens = max(1, self.total_tokens_in_use)
        parts = [f"Decode batch. #running-req: {max(1, self.running)}", f"#token: {tokens}",
                 f"token usage: {tokens / MAX_TOTAL_TOKENS:.2f}"]
        if self.spec.enabled:
            parts += [f"accept len: {accept:.2f}", f"accept rate: {self._accept_rate(accept):.2f}"]
            self.avg_accept = self.flush_accepted / self.flush_steps if self.flush_steps else None
        parts += [f"cuda graph: {not self.args.disable_cuda_graph}",
                  f"gen throughput (token/s): {throughput:.2f}", "#queue-req: 0"]
        log(", ".join(parts), tp=0)
        self.interval_steps = 0
        self.interval_tokens = 0

    def generate(self, prompt_tokens: int, max_new_tokens: int, emit=None, text: str = "") -> tuple[str, dict]:
        """One request; ``emit(text_so_far)`` (streaming) is called as the simulated time passes. ``text``:
        the prompt, whose kind scales the drafter's acceptance (prompt_kinds.py; token ids: instruct, 1.0).

        Holds the model-update lock's reader side for the whole answer (SGLang 0.5.21 - 0.5.23
        ``TokenizerManager.generate_request``): a weight-update call waits for it and holds new ones back."""
        self.model_update_lock.acquire_reader()
        try:
            return self._generate(prompt_tokens, max_new_tokens, emit, text)
        finally:
            self.model_update_lock.release_reader()

    def _generate(self, prompt_tokens: int, max_new_tokens: int, emit=None, text: str = "") -> tuple[str, dict]:
        kind = prompt_kinds.kind_of(text) if text else "instruct"
        kind_factor = prompt_kinds.factor(kind, self.spec.kind_factors)
        with self.lock:
            self.running += 1
            self.total_tokens_in_use += prompt_tokens
            log(f"Prefill batch. #new-seq: 1, #new-token: {prompt_tokens}, #cached-token: 0, "
                f"token usage: {self.total_tokens_in_use / MAX_TOTAL_TOKENS:.2f}, "
                f"#running-req: {self.running - 1}, #queue-req: 0", tp=0)
        produced = steps = 0
        printed = False
        interval = max(1, self.args.decode_log_interval)
        decay = accept_factor()
        try:
            while produced < max_new_tokens:
                with self.lock:
                    k = self._accepted_this_step(prompt_tokens + produced)
                    if self.spec.enabled and self.spec.simulated_accept is None:
                        self._w = (self._w + 0.5698402909980532) % 1.0
                        k = prompt_kinds.scaled(k, kind_factor, self.spec.draft_tokens, self._w)
                    k = self.metrics_state.decayed(k, decay)
                    steps += 1
                    produced += k
                    self.total_tokens_in_use += k
                    self.interval_steps += 1
                    self.interval_tokens += k
                    if self.spec.enabled:
                        self.flush_steps += 1
                        self.flush_accepted += k
                    if self.interval_steps >= interval:
                        self._decode_log_line()
                        printed = True
            with self.lock:
                if not printed and steps:
                    self._decode_log_line()
            sim_latency = 0.05 + prompt_tokens * 0.0001 + steps * self.spec.step_s
            scale = float(os.environ.get("SGLANG_SIM_TIME_SCALE", "0.02"))
            wait = min(30.0, sim_latency * scale) if scale > 0 else 0.0
            if emit is None:
                if wait:  # the request stays "running" while its simulated time passes
                    time.sleep(wait)
            else:
                chunks = max(1, min(8, max_new_tokens))
                for c in range(1, chunks + 1):
                    time.sleep(wait / chunks)
                    done = max_new_tokens * c // chunks
                    emit(" ".join(FILLER[(i * 7 + prompt_tokens) % len(FILLER)] for i in range(done)))
        finally:
            with self.lock:
                self.running -= 1
                self.total_tokens_in_use = max(0, self.total_tokens_in_use - prompt_tokens - produced)
        with self.lock:
            self.metrics_state.finished(prompt_tokens, max_new_tokens, steps * self.spec.step_s)
        text = " ".join(FILLER[(i * 7 + prompt_tokens) % len(FILLER)] for i in range(max_new_tokens))
        meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": max_new_tokens},
                "prompt_tokens": prompt_tokens, "completion_tokens": max_new_tokens,
                "cached_tokens": 0, "e2e_latency": round(sim_latency, 6)}
        if self.spec.enabled:
            meta["spec_verify_ct"] = steps
        return text, meta

    def flush(self) -> bool:
        with self.lock:
            if self.running:
                return False
            self.flush_steps = self.flush_accepted = 0
            self.interval_steps = self.interval_tokens = 0
            self.avg_accept = None
            return True

    def server_info(self) -> dict:
        info = dict(vars(self.args))
        internal: dict[str, object] = {
            "last_gen_throughput": round(self.last_gen_throughput, 4),
            "memory_usage": {"weight": round(WEIGHTS_MIB / 1024, 2), "kvcache": 40.11,
                             "token_capacity": MAX_TOTAL_TOKENS, "graph": round(GRAPH_MIB / 1024, 2)},
            "effective_max_running_requests_per_dp": self.args.max_running_requests or 2048,
        }
        with self.lock:
            if self.avg_accept is not None:
                internal["avg_spec_accept_length"] = round(self.avg_accept, 6)
        info["internal_states"] = [internal]
        info["version"] = self.version
        info["simulated"] = True
        return info

    def loads(self) -> dict:
        # SGLang 0.5.23 GET /v1/loads: one entry per DP rank; a drained worker has all zero.
        with self.lock:
            running, tokens = self.running, self.total_tokens_in_use
        return {"timestamp": time.time(), "loads": [{
            "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": 0, "num_total_tokens": tokens,
            "token_usage": round(tokens / MAX_TOTAL_TOKENS, 6), "simulated": True}]}

    def model_info(self) -> dict:
        return {"model_path": self.args.model_path, "tokenizer_path": self.args.tokenizer_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": self.weight_version,
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": self.base_config.get("model_type"),
                "architectures": self.base_config.get("architectures")}

    def metrics(self) -> str:
        with self.lock:
            return self.metrics_state.render(self.args.served_model_name, self.running, self.last_gen_throughput)


# --------------------------------------------------------------------------------------------
# HTTP


def _words(value) -> int:
    if isinstance(value, str):
        return max(1, len(value.split()))
    if isinstance(value, list):
        return max(1, len(value))
    return 1


KNOWN_PATHS = {"/health", "/health_generate", "/model_info", "/get_model_info", "/server_info",
               "/get_server_info", "/v1/models", "/generate", "/v1/completions",
               "/v1/chat/completions", "/flush_cache", "/v1/loads"}


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # uvicorn sets SO_REUSEADDR too

    def __init__(self, address: tuple[str, int], engine: Engine):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler, bind_and_activate=False)
        self.engine = engine

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve our name (getfqdn); nothing here needs DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    server: SimHTTPServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        pass

    def _send(self, code: int, body: bytes = b"", content_type: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        host, port = self.client_address[:2]
        phrase = self.responses.get(code, ("",))[0]
        log(f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}')

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj).encode())

    def _json_or_override(self, path: str, code: int, obj) -> None:
        override = answer_override(path)
        if override is None:
            self._json(code, obj)
            return
        status, raw, sleep = override
        time.sleep(max(0.0, min(sleep, 60.0)))
        self._send(status, raw)

    def _body(self) -> dict | None:
        length = int(self.headers.get("content-length") or 0)
        data = self.rfile.read(length) if length else b""
        if not data:
            return {}
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def _healthy(self) -> bool:
        engine = self.server.engine
        return engine.ready and engine.schedulers_alive

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self._route("POST")

    def _route(self, method: str) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        if method == "POST" or self.headers.get("content-length"):
            body = self._body()
        else:
            body = {}
        if not decide_request_auth(method=method, path=path, authorization_header=self.headers.get("Authorization"),
                                   api_key=getattr(engine.args, "api_key", None),
                                   admin_api_key=getattr(engine.args, "admin_api_key", None)):
            self._json(401, {"error": "Unauthorized"})
        elif path in ("/health", "/health_generate") and method == "GET":
            self._send(200 if self._healthy() else 503)
        elif path in ("/model_info", "/get_model_info") and method == "GET":
            self._json_or_override(path, 200, engine.model_info())
        elif path in ("/server_info", "/get_server_info") and method == "GET":
            self._json(200, engine.server_info())
        elif path == "/v1/models" and method == "GET":
            self._json(200, {"object": "list", "data": [{
                "id": engine.args.served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": engine.args.model_path,
                "max_model_len": engine.args.context_length or 262144}]})
        elif path == "/v1/loads" and method == "GET":
            self._json(200, engine.loads())
        elif path == "/flush_cache":
            if engine.flush():
                self._send(200, b"Cache flushed.\nPlease check backend logs for more details. (When "
                                b"there are running or waiting requests, the operation will not be "
                                b"performed.)\n", "text/plain")
            else:
                self._send(400, b"Cache not flushed. Please check backend logs for more details. "
                                b"(When there are running or waiting requests, the operation will "
                                b"not be performed.)\n", "text/plain")
        elif path in WEIGHT_UPDATE_PATHS and engine.weight_updates.serves(path):
            if method != "POST":
                self._json(405, {"detail": "Method Not Allowed"})
            else:
                code, answer = engine.weight_updates.handle(path, body)
                self._json_or_override(path, code, answer)
        elif path == "/metrics" and method == "GET" and engine.args.enable_metrics:
            self._send(200, engine.metrics().encode(), "text/plain; version=0.0.4")
        elif path in ("/generate", "/v1/completions", "/v1/chat/completions") and method == "POST":
            self._generate(path, body)
        elif path in KNOWN_PATHS:
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            self._json(404, {"detail": "Not Found"})

    def _generate(self, path: str, body: dict | None) -> None:
        engine = self.server.engine
        if body is None:
            self._json(400, {"error": {"message": "request body is not a JSON object"}})
            return
        if not engine.schedulers_alive:
            self._json(503, {"error": {"message": "The server is not healthy (a scheduler died)."}})
            return
        if engine.spec.crash_on_generate:
            # SIMULATION-crash-on-generate: the whole server dies on its first request (the ranks
            # follow through PR_SET_PDEATHSIG), after /health already said 200.
            scheduler_exception(0, [(_srt("managers/scheduler.py"), 1170, "event_loop_overlap",
                                     "batch_result = self.run_batch(batch)")],
                                "RuntimeError: CUDA error: an illegal memory access was encountered")
            os._exit(1)
        if body.get("stream"):
            if path != "/generate" or not isinstance(body.get("text", body.get("input_ids", "")), str):
                self._json(400, {"object": "error", "type": "BadRequestError", "code": 400,
                                 "message": "SIMULATION: the stand-in streams only /generate with one text"})
                return
            self._stream_generate(body)
            return
        if path == "/generate":
            prompt = body.get("text", body.get("input_ids", ""))
            params = body.get("sampling_params") or {}
            n = int(params.get("max_new_tokens", 128))
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                results = []
                for item in prompt:
                    text, meta = engine.generate(_words(item), n, text=item)
                    results.append({"text": text, "meta_info": meta})
                self._json(200, results)
                return
            text, meta = engine.generate(_words(prompt), n, text=prompt if isinstance(prompt, str) else "")
            self._json(200, {"text": text, "meta_info": meta})
            return
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if path == "/v1/completions":
            prompt_tokens = _words(body.get("prompt", ""))
        else:
            prompt_tokens = sum(_words(m.get("content", "")) for m in body.get("messages") or []
                                if isinstance(m, dict))
        text, meta = engine.generate(max(1, prompt_tokens), n)
        usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": n,
                 "total_tokens": meta["prompt_tokens"] + n, "prompt_tokens_details": None}
        base = {"id": meta["id"], "created": int(time.time()),
                "model": body.get("model") or engine.args.served_model_name, "usage": usage}
        if path == "/v1/completions":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                      "matched_stop": None}
            self._json(200, {**base, "object": "text_completion", "choices": [choice]})
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": "length", "matched_stop": None}
            self._json(200, {**base, "object": "chat.completion", "choices": [choice]})


    def _stream_generate(self, body: dict) -> None:
        """/generate with stream: server-sent events over chunked encoding, as SGLang's
        StreamingResponse sends them: ``data: {"text": <text so far>, "meta_info": ...}`` per chunk,
        then ``data: [DONE]``. A server stopped mid-stream cuts the connection without the final
        chunk, so a client (or the router) sees a broken stream, as with the real server."""
        engine = self.server.engine
        params = body.get("sampling_params") or {}
        n = int(params.get("max_new_tokens", 128))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        rid = uuid.uuid4().hex

        def emit(text: str) -> None:
            chunk(b"data: " + json.dumps({"text": text, "meta_info": {"id": rid}}).encode() + b"\n\n")

        prompt = body.get("text", "")
        text, meta = engine.generate(_words(prompt), n, emit=emit, text=prompt if isinstance(prompt, str) else "")
        chunk(b"data: " + json.dumps({"text": text, "meta_info": meta}).encode() + b"\n\n")
        chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        host, port = self.client_address[:2]
        log(f'INFO:     {host}:{port} - "POST /generate HTTP/1.1" 200 OK (stream)')


# --------------------------------------------------------------------------------------------
# main


STOP = threading.Event()
#: set (with a message) when a node of a multi-node server lost its peer
PEER_LOST: list[str] = []


def _watch_peer(sock: socket.socket, who: str) -> None:
    try:
        while sock.recv(64):
            pass
    except OSError:
        pass
    PEER_LOST.append(f"RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection closed by peer ({who})")


def rendezvous(args) -> str | None:
    """torch.distributed's TCP store on rank 0's --dist-init-addr; returns an error or None."""
    host, port = args.dist_init_addr.rsplit(":", 1)
    timeout = float(os.environ.get("SGLANG_SIM_DIST_TIMEOUT", "300"))
    deadline = time.monotonic() + timeout
    if args.node_rank == 0:
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, int(port)))
        except OSError as exc:
            return f"RuntimeError: The server socket has failed to listen on any local network address. {exc}"
        listener.listen(args.nnodes)
        listener.settimeout(0.2)
        peers = 0
        log(f"dist init: waiting for {args.nnodes - 1} node(s) on {args.dist_init_addr}", tp=0)
        while peers < args.nnodes - 1:
            if STOP.is_set():
                return "interrupted"
            if time.monotonic() > deadline:
                return f"torch.distributed.DistStoreError: Timed out after {timeout:g} s waiting for {args.nnodes} nodes"
            try:
                conn, addr = listener.accept()
            except socket.timeout:
                continue
            peers += 1
            log(f"dist init: node {peers} joined from {addr[0]}", tp=0)
            threading.Thread(target=_watch_peer, args=(conn, f"node at {addr[0]}"), daemon=True).start()
        return None
    while True:
        if STOP.is_set():
            return "interrupted"
        try:
            conn = socket.create_connection((host, int(port)), timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline:
                return f"torch.distributed.DistNetworkError: cannot reach {args.dist_init_addr} after {timeout:g} s"
            time.sleep(0.2)
    conn.settimeout(None)
    log(f"dist init: node rank {args.node_rank} connected to {args.dist_init_addr}", tp=0)
    threading.Thread(target=_watch_peer, args=(conn, f"node rank 0 at {args.dist_init_addr}"), daemon=True).start()
    return None


def _on_signal(signum, frame) -> None:
    STOP.set()


def _bind_failed(host: str, port: int, exc: OSError) -> int:
    raw(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
        f"('{host}', {port}): {(exc.strerror or str(exc)).lower()}")
    return 1


def _crash_requested(config: dict) -> bool:
    return (os.environ.get("SGLANG_SIM_CRASH_DURING_LOAD", "") not in ("", "0")
            or os.path.exists(os.path.join(config["sim_dir"], "crash_during_load")))


def _fmt_elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def main(argv: list[str] | None = None) -> int:
    from sglang.version import __version__ as version

    args = build_parser(version).parse_args(argv)
    args.sim_version = version
    log(f"SIMULATED SGLang {version}: deployctl sandbox TEST DOUBLE (no GPU, no model weights; "
        "see sglang/launch_server.py)")
    warnings = finalize_args(args)
    if "SGLANG_ENABLE_SPEC_V2" in os.environ and (0, 5, 14) <= version_tuple(version) <= (0, 5, 22):
        # PR #27964 removed it in 0.5.14; the notice is gone again in 0.5.23
        warnings.append("SGLANG_ENABLE_SPEC_V2 has been removed: speculative decoding always runs the V2 "
                        "worker; use --disable-overlap-schedule for the synchronous path")
    for warning in warnings:
        log(f"WARNING: {warning}")
    shown = ", ".join(f"{k}={v!r}" for k, v in vars(args).items())
    log(f"server_args=ServerArgs({shown})")
    debug = args.log_level.lower() == "debug"

    check_model_dir(args.model_path)
    base_config = read_json(os.path.join(args.model_path, "config.json"))
    spec = analyse_speculation(args, version)
    if debug:
        for line in spec.debug:
            log(f"DEBUG: {line}")
    config = load_sim_config()
    seed = int(hashlib.sha256(f"{spec.accept_p}:{args.random_seed}".encode()).hexdigest()[:8], 16) / 2**32
    engine = Engine(args, version, spec, base_config, seed)

    server = None
    if args.node_rank == 0:  # only rank 0 of a multi-node server serves HTTP
        try:
            server = SimHTTPServer((args.host, args.port), engine)
        except OSError as exc:
            return _bind_failed(args.host, args.port, exc)
        try:
            server.server_bind()
        except OSError as exc:
            server.server_close()
            return _bind_failed(args.host, args.port, exc)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    ranks: list[Rank] = []
    try:
        return _run(args, version, config, engine, server, ranks, spec)
    finally:
        stop_ranks(config, ranks)
        if server is not None:
            server.server_close()


def _run(args, version, config, engine: Engine, server: SimHTTPServer, ranks: list[Rank],
         spec: Speculation) -> int:
    # --tp-size is the whole server's: each of --nnodes nodes runs its share of the ranks; data
    # parallel replicas multiply it unless DP attention runs them inside the TP group, pipeline
    # stages always do (SGLang's tp x pp x dp GPU arithmetic)
    dp = 1 if args.enable_dp_attention else args.dp_size
    world = args.tp_size * dp * args.pp_size // max(1, args.nnodes)
    count = int(config["gpu_count"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = [int(x) for x in visible.split(",") if x.strip()] if visible else list(range(count))
    gpus = []
    for r in range(world):
        idx = args.base_gpu_id + r
        gpu = physical[idx] if idx < len(physical) else None
        if gpu is None or not 0 <= gpu < count:
            scheduler_exception(r, LOAD_FRAMES[:3] + [
                (_srt("distributed/parallel_state.py"), 1187, "init_distributed_environment",
                 "torch.cuda.set_device(local_rank)")],
                "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be "
                "asynchronously reported at some other API call, so the stacktrace below might be "
                "incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")
            return 1
        gpus.append(gpu)

    total = int(config["gpu_total_mib"])
    log("Init torch distributed begin.", tp=0)
    if args.nnodes > 1:
        failed = rendezvous(args)
        if failed == "interrupted":
            return 0
        if failed:
            scheduler_exception(0, LOAD_FRAMES[:3], failed)
            return 1
    others = gpu_usage_by_others(config, exclude=set())
    ranks.extend(spawn_ranks(config, gpus))
    free = [total - others[g] for g in gpus]
    for r, gpu in enumerate(gpus):
        if world > 1 and min(free) < free[r] * 0.9:
            scheduler_exception(r, LOAD_FRAMES[:4], (
                "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
                f"processes. min_per_gpu_memory={min(free) / 1024:.3f}, "
                f"local_gpu_memory={free[r] / 1024:.3f}, local_gpu_memory * 0.9={free[r] * 0.9 / 1024:.3f}"))
            return 1
    log("Init torch distributed ends. mem usage=0.00 GB", tp=0)

    mem_frac = args.mem_fraction_static
    final_mib = min(total, int(total * mem_frac) + GRAPH_MIB)
    load_s = max(0.0, float(os.environ.get("SGLANG_SIM_LOAD_SECONDS", "1.0")))
    steps = max(1, round(load_s / 0.5))
    crash = _crash_requested(config) or spec.crash_during_load
    log(f"Load weight begin. avail mem={capacity_gib(free[0]):.2f} GB", tp=0)
    started = time.monotonic()
    raw(f"Loading safetensors checkpoint shards:   0% Completed | 0/{CHECKPOINT_SHARDS} [00:00<?, ?it/s]")
    for j in range(1, steps + 1):
        if STOP.wait(load_s / steps):
            log("Received SIGTERM while loading; shutting down.")
            return 0
        if PEER_LOST:
            scheduler_exception(0, LOAD_FRAMES[:4], PEER_LOST[0])
            return 1
        dead = [r for r in ranks if r.proc.poll() is not None]
        if dead:
            log(f"Child process unexpectedly failed with exitcode={dead[0].proc.returncode}. "
                f"pid={dead[0].pid}")
            return 1
        if crash and j >= max(1, steps // 2):
            rank = ranks[min(3, len(ranks) - 1)]
            scheduler_exception(rank.tp, LOAD_FRAMES + [
                (_srt("models/deepseek_v2.py"), 2871, "load_weights",
                 "weight_loader(param, loaded_weight, shard_id)")], oom_message(rank.gpu, total))
            return 1
        done = round(CHECKPOINT_SHARDS * j / steps)
        elapsed = time.monotonic() - started
        rate = done / elapsed if elapsed > 0 else 0.0
        remaining = (CHECKPOINT_SHARDS - done) / rate if rate else 0.0
        raw(f"Loading safetensors checkpoint shards: {100 * done // CHECKPOINT_SHARDS:3d}% Completed | "
            f"{done}/{CHECKPOINT_SHARDS} [{_fmt_elapsed(elapsed)}<{_fmt_elapsed(remaining)}, "
            f"{rate:5.2f}it/s]")
        for rank in ranks:
            write_alloc(config, rank, 512 + WEIGHTS_MIB * j // steps)

    for r, rank in enumerate(ranks):
        rest = free[r] - total * (1 - mem_frac) - WEIGHTS_MIB
        if rest <= 0:
            scheduler_exception(rank.tp, LOAD_FRAMES[:4], "RuntimeError: Not enough memory. Please try "
                                "to increase --mem-fraction-static.")
            return 1
    arch = ",".join(engine.base_config.get("architectures") or ["?"])
    log(f"Load weight end. type={arch}, dtype=torch.bfloat16, avail mem="
        f"{capacity_gib(free[0] - WEIGHTS_MIB):.2f} GB, mem usage={WEIGHTS_MIB / 1024:.2f} GB.", tp=0)
    if spec.enabled and spec.algorithm != "NGRAM":
        draft_arch = spec.draft_arch or "?"
        if "Eagle3" in draft_arch or "Speculator" in draft_arch:
            draft_arch = "LlamaForCausalLMEagle3"
        log(f"Load weight begin. avail mem={capacity_gib(free[0] - WEIGHTS_MIB):.2f} GB", tp=0)
        if spec.draft_load_error:
            scheduler_exception(0, LOAD_FRAMES + [
                (_srt("model_loader/weight_utils.py"), 389, "get_quant_config",
                 'raise ValueError(f"Cannot find the config file for {model_config.quantization}")')],
                f"ValueError: {spec.draft_load_error}")
            return 1
        quant = f", quant={spec.draft_quantization}" if spec.draft_quantization else ""
        log(f"Load weight end. type={draft_arch}{quant}, dtype=torch.bfloat16, avail mem="
            f"{capacity_gib(free[0] - WEIGHTS_MIB) - 0.01:.2f} GB, mem usage=0.01 GB.", tp=0)
    for rank in ranks:
        write_alloc(config, rank, final_mib)
    kv_gib = (final_mib - WEIGHTS_MIB - GRAPH_MIB) / 1024
    log(f"KV Cache is allocated. #tokens: {MAX_TOTAL_TOKENS}, KV size: {kv_gib:.2f} GB", tp=0)
    if not args.disable_cuda_graph:
        log("Capture cuda graph begin. This can take up to several minutes. avail mem="
            f"{capacity_gib(total - final_mib + GRAPH_MIB):.2f} GB", tp=0)
        log(f"Capture cuda graph end. Time elapsed: 0.01 s. mem usage={GRAPH_MIB / 1024:.2f} GB. "
            f"avail mem={capacity_gib(total - final_mib):.2f} GB.", tp=0)
    log(f"max_total_num_tokens={MAX_TOTAL_TOKENS}, chunked_prefill_size={args.chunked_prefill_size}, "
        f"max_prefill_tokens=16384, max_running_requests={args.max_running_requests or 2048}, "
        f"context_len={args.context_length or 262144}, "
        f"available_gpu_mem={capacity_gib(total - final_mib):.2f} GB", tp=0)

    if server is None:
        log(f"node rank {args.node_rank}: weights loaded; no HTTP server on this node (rank 0 serves)")
        while not STOP.wait(0.2):
            if PEER_LOST:
                scheduler_exception(0, LOAD_FRAMES[:1], PEER_LOST[0])
                return 1
        return 0
    try:
        server.server_activate()
    except OSError as exc:
        return _bind_failed(args.host, args.port, exc)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     name="uvicorn", daemon=True).start()
    log(f"INFO:     Started server process [{os.getpid()}]")
    log("INFO:     Waiting for application startup.")
    log("INFO:     Application startup complete.")
    log(f"INFO:     Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    log('INFO:     127.0.0.1:0 - "GET /get_model_info HTTP/1.1" 200 OK')
    warmup = max(0.0, float(os.environ.get("SGLANG_SIM_WARMUP_SECONDS", "0.3")))
    if STOP.wait(warmup):
        return _shutdown(server)
    log('INFO:     127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    engine.ready = True
    log("The server is fired up and ready to roll!")

    while not STOP.wait(0.2):
        if PEER_LOST:
            scheduler_exception(0, LOAD_FRAMES[:1], PEER_LOST[0])
            return 1
        dead = [r for r in ranks if r.proc.poll() is not None]
        if dead and engine.schedulers_alive:
            engine.schedulers_alive = False
            for rank in dead:
                log(f"Child process unexpectedly failed with exitcode={rank.proc.returncode}. pid={rank.pid}")
                clear_alloc(config, rank)
    return _shutdown(server)


def _shutdown(server: SimHTTPServer) -> int:
    log("INFO:     Shutting down")
    server.shutdown()
    log("INFO:     Waiting for application shutdown.")
    log("INFO:     Application shutdown complete.")
    log(f"INFO:     Finished server process [{os.getpid()}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
