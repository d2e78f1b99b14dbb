"""The doctor's verdicts: pure functions over the facts a host reported (deploy/facts/doctor.py).

Each check returns pass / warn / fail with a one-line reason (more lines may follow) and the fix.
A check that cannot decide (a file unreadable, the SGLang version unknown) warns and says so; it
never passes silently. Version boundaries are the SGLang releases (0.5.6 - 0.5.23 wheels)
where each behaviour was seen, with the PR where one is known, cited at each check.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Optional

from deploy.config.models import reserved_option_for
from deploy.doctor import speculation
from deploy.doctor.sglang_options import extra_arg
from deploy.doctor.verdict import Check, DoctorInput, Status, version_tuple  # noqa: F401  (Status: re-exported)
from deploy.base.errors import RemoteOutputError
from deploy.facts.doctor import base_architectures
from deploy.facts.gpus import parse_gpu_rows
from deploy.remote import fixer
from deploy.remote.fixer import config as fixer_config
from deploy.remote.fixer import loader as fixer_loader
from deploy.host.sglang_argv import serve_address, speculative_plan, unseen_holder

#: SGLang 0.5.6-0.5.11 build only model.midlayer and raise this for num_hidden_layers != 1.
ONE_LAYER_LIMIT = "EAGLE3 currently only supports 1 layer"
#: PR #22836: CUDA-graph capture ignored custom aux layer ids; fixed in 0.5.11.
CUDA_GRAPH_FIXED = (0, 5, 11)
WILDCARDS = ("0.0.0.0", "::", "")


def _installed(d: DoctorInput) -> Optional[tuple[int, int, int]]:
    return version_tuple(d.sglang.version) if d.sglang else None


def _version_text(d: DoctorInput) -> str:
    return f"SGLang {d.sglang.version}" if d.sglang and d.sglang.version else "the installed SGLang"


def _base_dims(d: DoctorInput) -> dict[str, Any]:
    """num_hidden_layers / hidden_size / vocab_size of the target (a multimodal config nests them)."""
    config = d.facts.base_model.config or {}
    nested = config.get("text_config")
    text: dict = nested if isinstance(nested, dict) else {}
    dims = {}
    for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        value = text.get(key, config.get(key))
        dims[key] = value if isinstance(value, int) and not isinstance(value, bool) else None
    return dims


def _drafter_files(d: DoctorInput) -> Optional[dict[str, dict[str, list[int]]]]:
    files = d.facts.drafter.files
    if not files or any(v is None for v in files.values()):
        return None
    return files  # type: ignore[return-value]


def _simulated(d: DoctorInput):
    """(verification, config, shapes) as the drafter will be after the key fix, for the installed
    SGLang; None when the version or the headers are unknown; the fixer's refusal as text."""
    files = _drafter_files(d)
    version = d.sglang.version if d.sglang and d.sglang.version else None
    if d.run.sglang_generation != "auto":
        version = d.run.sglang_generation  # the fix-keys step verifies against the same choice
    if files is None or version is None:
        return None
    try:
        return fixer.simulate_fixed(files, d.facts.drafter.config, version, d.hidden_states_from)
    except fixer.FixError as exc:
        return str(exc)


def check_launch_env(d: DoctorInput) -> Check:
    facts = d.facts.launch_env
    if facts is None:
        return Check("launch-env", "warn", "cannot decide: the host facts did not try the launch's environment")
    where = f"with the run's env ({', '.join(facts.names)})" if facts.names else "in the host's environment"
    if facts.error:
        return Check("launch-env", "fail", f"the launch's preamble could not run {where}: {facts.error}",
                     "check runs[].env and the host's /bin/sh")
    if facts.missing:
        return Check("launch-env", "fail", f"{where} the launch script cannot find {', '.join(facts.missing)}",
                     "set runs[].env PATH to a full value that has them (env values are never expanded), or "
                     "runs[].sglang_python to an absolute path")
    return Check("launch-env", "pass", f"setsid, nohup and {d.run.sglang_python} found {where}")


# ---------------------------------------------------------------------------------------------
# 1. versions

def check_sglang_version(d: DoctorInput) -> Check:
    s = d.sglang
    if s is None or not s.found:
        why = d.sglang_error or f"SGLang is not installed for {d.run.sglang_python!r} (no sglang package on its path)"
        return Check("sglang-version", "fail", why,
                     "set the run's sglang_python to the interpreter that has SGLang (a venv's bin/python)")
    if not s.version:
        return Check("sglang-version", "warn",
                     f"cannot decide: SGLang's version is unknown ({s.version_error}); version-dependent "
                     "checks below cannot decide either",
                     "reinstall SGLang with pip so its package metadata (dist-info) is present")
    installed = version_tuple(s.version)
    if installed is None:
        return Check("sglang-version", "warn", f"cannot decide: SGLang reports version {s.version!r}",
                     "reinstall SGLang from a release")
    if installed < fixer.OLDEST_SUPPORTED:
        return Check("sglang-version", "fail", f"SGLang {s.version} is older than 0.5.6, whose EAGLE-3 loader "
                     "deployctl was checked against", "upgrade SGLang to 0.5.11 or newer")
    return Check("sglang-version", "pass",
                 f"SGLang {s.version} (package metadata) at {s.package_dir}, python {s.python.version}")


def check_python(d: DoctorInput) -> Check:
    version = version_tuple(d.facts.python.version)
    if version is None or version[:2] < (3, 8):
        return Check("host-python", "fail", f"the host's {d.host.python!r} is Python {d.facts.python.version}; "
                     "the host-side helpers need 3.8+", "set hosts[].python to a Python 3.8+ interpreter")
    return Check("host-python", "pass", f"{d.host.python} is Python {d.facts.python.version}")


# ---------------------------------------------------------------------------------------------
# 2. drafter weights and layers

def check_drafter_config(d: DoctorInput) -> Check:
    drafter = d.facts.drafter
    if drafter.config is None:
        return Check("drafter-config", "fail", f"cannot read {drafter.path}/config.json: {drafter.config_error}",
                     "point the run's drafter at a checkpoint directory with a config.json")
    kind = fixer_config.config_kind(drafter.config)
    archs = drafter.config.get("architectures")
    if kind == "sglang":
        return Check("drafter-config", "pass", f"SGLang form ({fixer.SGLANG_ARCH})")
    if kind == "speculators":
        if d.fix_keys_will_run:
            return Check("drafter-config", "pass", f"speculators form ({archs}); the fix-keys step converts it "
                         f"to {fixer.SGLANG_ARCH} before launch")
        return Check("drafter-config", "warn", f"speculators form ({archs}): SGLang cannot load it as is",
                     "run `deployctl fix-keys` on it (or `deployctl up`, whose fix-keys step converts it)")
    return Check("drafter-config", "fail", f"config.json architectures is {archs!r}; not an EAGLE-3 drafter "
                 f"SGLang's {fixer.SGLANG_ARCH} loads", "deploy an EAGLE-3 drafter (speculators or SGLang form)")


def check_drafter_layers(d: DoctorInput) -> Check:
    config = d.facts.drafter.config
    if config is None:
        return Check("drafter-layers", "warn", "cannot decide: the drafter's config.json is unreadable")
    effective = fixer_loader.effective_config(config)
    layers = effective.get("num_hidden_layers", 1)
    installed = _installed(d)
    if not isinstance(layers, int):
        return Check("drafter-layers", "fail", f"num_hidden_layers is {layers!r}, expected an integer",
                     "fix the drafter's config.json")
    if installed is None:
        if layers == 1:
            return Check("drafter-layers", "pass", "1 decoder layer (every SGLang version serves it)")
        return Check("drafter-layers", "warn", f"cannot decide: {layers} decoder layers need SGLang 0.5.12+ and "
                     "the installed version is unknown")
    if layers != 1 and installed < fixer.FIRST_MODERN:
        return Check("drafter-layers", "fail",
                     f"{ONE_LAYER_LIMIT}: {_version_text(d)} (0.5.11 and older) refuses this {layers}-layer "
                     "drafter at startup",
                     "upgrade SGLang to 0.5.12+, or deploy a 1-layer drafter")
    return Check("drafter-layers", "pass", f"{layers} decoder layer(s), served by {_version_text(d)}")


def check_drafter_weights(d: DoctorInput) -> Check:
    drafter = d.facts.drafter
    if not drafter.readable:
        return Check("drafter-weights", "warn", f"cannot decide: {drafter.path} is not readable")
    if drafter.files_error or _drafter_files(d) is None:
        return Check("drafter-weights", "fail" if drafter.files_error else "warn",
                     f"cannot read the drafter's safetensors headers: {drafter.files_error or 'no .safetensors file'}",
                     "check the checkpoint (deployctl fix-keys PATH --check locally)")
    simulated = _simulated(d)
    if simulated is None:
        return Check("drafter-weights", "warn", "cannot decide: SGLang's version is unknown, so its loader "
                     "cannot be simulated", "make SGLang's package metadata readable (pip install)")
    if isinstance(simulated, str):
        return Check("drafter-weights", "fail", f"the key fix would refuse the drafter: {simulated}",
                     "fix the checkpoint, then rerun")
    verification, _, _ = simulated
    after = "after the key fix, "
    if verification["ok"]:
        return Check("drafter-weights", "pass", f"{after}every tensor lands on a parameter of "
                     f"{_version_text(d)}'s {fixer.SGLANG_ARCH} and every parameter gets one")
    problems = verification["problems"] or [f"dropped: {verification['dropped']}, missing: {verification['missing']}"]
    first = problems[0]
    if any("only supports 1 layer" in p for p in problems):
        # the fixer words it as a sentence; the limit itself must lead the reason
        first = f"{ONE_LAYER_LIMIT} ({_version_text(d)}); " + first
    return Check("drafter-weights", "fail", "\n".join([first] + problems[1:6]),
                 "see the first line; `deployctl fix-keys PATH --sglang-version V` lists every gap locally")


# ---------------------------------------------------------------------------------------------
# 3. aux hidden states, 5. the CUDA-graph capture bug

def _aux_ids(d: DoctorInput) -> tuple[Optional[list[int]], Optional[dict], Optional[dict]]:
    """(eagle_config ids, config as SGLang will read it, shapes) — after fix-keys when it runs."""
    simulated = _simulated(d)
    if isinstance(simulated, tuple):
        _, config, shapes = simulated
    else:
        config, files = d.facts.drafter.config, _drafter_files(d)
        shapes = {k: v for f in (files or {}).values() for k, v in f.items()} if files else None
        if config is not None and fixer_config.config_kind(config) == "speculators":
            try:
                config, _, _ = fixer_config.convert_config(config, d.hidden_states_from, shapes or {}, "config.json")
            except fixer.FixError:
                pass
    eagle = (config or {}).get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return (ids if isinstance(ids, list) else None), config, shapes


def _default_ids(layers: int) -> list[int]:
    return [2, layers // 2, layers - 3]


def check_aux_hidden_states(d: DoctorInput) -> Check:
    ids, config, shapes = _aux_ids(d)
    dims = _base_dims(d)
    if config is None:
        return Check("aux-hidden-states", "warn", "cannot decide: the drafter's config.json is unreadable")
    problems = []
    if ids is None:
        top = config.get("eagle_aux_hidden_state_layer_ids")
        if top is not None:
            problems.append(f"eagle_aux_hidden_state_layer_ids {top} is at the top level, where SGLang's Llama "
                            "draft path does not read it (it belongs in eagle_config)")
    elif not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        problems.append(f"eagle_config.eagle_aux_hidden_state_layer_ids must be non-negative integers, got {ids!r}")
    layers = dims["num_hidden_layers"]
    if ids and layers is not None:
        over = [i for i in ids if isinstance(i, int) and i >= layers]
        if over:
            problems.append(f"aux layer id(s) {over} are not below the base model's num_hidden_layers {layers}")
    hidden = dims["hidden_size"]
    n_aux = len(ids) if ids else 3
    target_hidden = config.get("target_hidden_size") or hidden
    fc = (shapes or {}).get("fc.weight") or (shapes or {}).get("model.fc.weight")
    if fc is not None and isinstance(target_hidden, int) and len(fc) == 2 and fc[1] != n_aux * target_hidden:
        problems.append(f"fc.weight input width {fc[1]} != hidden size {target_hidden} x {n_aux} aux layers "
                        f"= {n_aux * target_hidden}")
    if problems:
        return Check("aux-hidden-states", "fail", "; ".join(problems),
                     "put the ids the drafter was trained with in eagle_config (fix-keys does this)")
    if layers is None or hidden is None:
        return Check("aux-hidden-states", "warn", "cannot decide: the base model's config.json has no "
                     "num_hidden_layers/hidden_size (top level or text_config)")
    if ids is None:
        return Check("aux-hidden-states", "warn", f"no eagle_config ids: the target captures SGLang's default "
                     f"layers {_default_ids(layers)}", "set eagle_config.eagle_aux_hidden_state_layer_ids")
    return Check("aux-hidden-states", "pass", f"ids {ids} in eagle_config, all below {layers} layers; fc width "
                 f"{fc[1] if fc else '?'} = {target_hidden} x {n_aux}")


def cuda_graphs_disabled(d: DoctorInput) -> bool:
    return extra_arg(d, "--disable-cuda-graph") is not None


def check_cuda_graph_capture(d: DoctorInput) -> Check:
    ids, _, _ = _aux_ids(d)
    layers = _base_dims(d)["num_hidden_layers"]
    custom = ids is not None and (layers is None or list(ids) != _default_ids(layers))
    installed = _installed(d)
    if not custom:
        return Check("cuda-graph-capture", "pass", "the drafter uses SGLang's default aux layers: the CUDA-graph "
                     "capture bug (PR #22836) does not change them")
    if cuda_graphs_disabled(d):
        return Check("cuda-graph-capture", "pass", "--disable-cuda-graph is set: decode captures the custom ids")
    if installed is None:
        return Check("cuda-graph-capture", "warn", f"cannot decide: custom aux ids {ids} and the SGLang version is "
                     "unknown (0.5.10 and older ignore them under CUDA graphs)",
                     "make SGLang's version readable, or add --disable-cuda-graph to extra_args")
    if installed < CUDA_GRAPH_FIXED:
        return Check("cuda-graph-capture", "fail",
                     f"{_version_text(d)} (0.5.10 or older) ignores custom aux ids {ids} under CUDA graphs "
                     "(PR #22836): graphed decode captures the default layers and acceptance is zero",
                     "upgrade SGLang to 0.5.11+, or add --disable-cuda-graph to the run's extra_args")
    return Check("cuda-graph-capture", "pass", f"custom aux ids {ids}; {_version_text(d)} has the PR #22836 fix")


# ---------------------------------------------------------------------------------------------
# 4. target capture

def check_target_capture(d: DoctorInput) -> Check:
    base = d.facts.base_model
    archs = base_architectures(d.facts)
    if base.config is None:
        return Check("target-capture", "warn", f"cannot decide: {base.path}/config.json is unreadable "
                     f"({base.config_error or 'missing'})")
    if not archs:
        return Check("target-capture", "warn", "cannot decide: the base model's config.json has no architectures")
    if d.sglang is None or not d.sglang.models_dir:
        return Check("target-capture", "warn", "cannot decide: the installed SGLang's model sources "
                     "(sglang/srt/models) were not found")
    for arch in archs:
        found = d.sglang.architectures.get(arch)
        if found is None or not found.class_found:
            continue
        if found.has_hook:
            return Check("target-capture", "pass", f"{arch} ({found.file}) has set_eagle3_layers_to_capture "
                         f"(via {found.via}) in {_version_text(d)}")
        return Check("target-capture", "fail",
                     f"{arch} ({found.file}) has no set_eagle3_layers_to_capture in {_version_text(d)}: the "
                     "target never captures the aux hidden states and acceptance is ~1.0 (0.5.23 raises instead)",
                     "upgrade SGLang to a version whose model source has it (kimi_k25: 0.5.10+, PR #19689)")
    return Check("target-capture", "warn", f"cannot decide: no class {archs} in {d.sglang.models_dir}")


# ---------------------------------------------------------------------------------------------
# 6. speculative flags, 7. sizes

def check_speculative_flags(d: DoctorInput) -> Check:
    run = d.run
    problems = []
    if run.speculative_algorithm != "EAGLE3":
        problems.append(f"--speculative-algorithm {run.speculative_algorithm}: an EAGLE-3 drafter needs EAGLE3 "
                        "(EAGLE feeds it one hidden state, accept length 1.0, PR #21272)")
    for arg in run.extra_args:
        option = reserved_option_for(arg)
        if option:
            problems.append(f"extra_args {arg!r} would override {option}")
    steps, topk, tokens = speculative_plan(run, d.draft_tokens)
    if topk == 1 and tokens != steps + 1:
        problems.append(f"topk 1 needs draft tokens = steps + 1, got steps {steps}, tokens {tokens}")
    if topk > 1 and tokens > topk * steps + 1:
        problems.append(f"{tokens} draft tokens exceed what {steps} steps x topk {topk} can propose")
    if problems:
        return Check("speculative-flags", "fail", "; ".join(problems), "use EAGLE3 and set these through the run's fields")
    # sglang#36554: EAGLE-3 params left to SGLang's auto choice picked FA3 on Hopper where explicit
    # ones get FlashInfer; deployctl never leaves them to auto (speculative_plan)
    return Check("speculative-flags", "pass", f"EAGLE3, steps {steps}, topk {topk}, draft tokens {tokens}; "
                 "deployctl always sends steps, topk and draft tokens explicitly (left to auto, SGLang picks a "
                 "different attention backend on Hopper, sglang#36554)")


def check_sizes(d: DoctorInput) -> Check:
    config = d.facts.drafter.config
    dims = _base_dims(d)
    if config is None or dims["hidden_size"] is None or dims["vocab_size"] is None:
        return Check("hidden-and-vocab", "warn", "cannot decide: the drafter's or the base model's config.json "
                     "lacks hidden_size/vocab_size")
    effective = fixer_loader.effective_config(config)
    shapes = {k: v for f in (_drafter_files(d) or {}).values() for k, v in f.items()}
    problems = []
    hidden, target = effective.get("hidden_size"), effective.get("target_hidden_size")
    if target is not None and target != dims["hidden_size"]:
        problems.append(f"target_hidden_size {target} != the base model's hidden_size {dims['hidden_size']}")
    elif target is None and hidden != dims["hidden_size"]:
        problems.append(f"drafter hidden_size {hidden} != the base model's {dims['hidden_size']} and "
                        "target_hidden_size is unset")
    vocab = dims["vocab_size"]
    draft_vocab = effective.get("draft_vocab_size")
    if draft_vocab is None and shapes.get("lm_head.weight"):
        draft_vocab = shapes["lm_head.weight"][0]
    if isinstance(draft_vocab, int) and draft_vocab > vocab:
        problems.append(f"draft_vocab_size {draft_vocab} > the base model's vocab_size {vocab}")
    if shapes.get("d2t") is not None and shapes["d2t"] != [draft_vocab]:
        problems.append(f"d2t has shape {shapes['d2t']}, expected [draft_vocab_size {draft_vocab}]")
    if shapes.get("t2d") is not None and shapes["t2d"] != [vocab]:
        problems.append(f"t2d has shape {shapes['t2d']}, expected [the base model's vocab_size {vocab}]")
    if effective.get("vocab_size") not in (None, vocab):
        problems.append(f"drafter vocab_size {effective.get('vocab_size')} != the base model's {vocab}")
    if problems:
        return Check("hidden-and-vocab", "fail", "; ".join(problems), "deploy the drafter trained for this base model")
    return Check("hidden-and-vocab", "pass", f"hidden {dims['hidden_size']}, vocab {vocab}, draft vocab {draft_vocab}")


# ---------------------------------------------------------------------------------------------
# 8. the host

def check_nvidia_smi(d: DoctorInput) -> Check:
    smi = d.facts.nvidia_smi
    if not smi.found:
        return Check("nvidia-smi", "fail", f"nvidia-smi is not on PATH: {smi.error}",
                     "install the NVIDIA driver utilities, or fix PATH for the deploy user")
    if smi.exit_code != 0:
        detail = (smi.stdout + smi.stderr).strip().splitlines()
        return Check("nvidia-smi", "fail", f"nvidia-smi failed (exit {smi.exit_code}): {detail[0] if detail else smi.error}",
                     "fix the driver (nvidia-smi must run) before deploying")
    try:
        rows = parse_gpu_rows(smi.stdout, d.host.gpus, source=d.host.name)
    except RemoteOutputError as exc:
        return Check("nvidia-smi", "fail", str(exc), f"set hosts[].gpus to the GPU count nvidia-smi reports")
    return Check("nvidia-smi", "pass", f"{len(rows)} GPUs, as configured")


def check_gpu_devices(d: DoctorInput) -> Check:
    g = d.facts.gpu_devices
    if not g.matches:
        return Check("gpu-devices", "fail", f"gpu_devices {g.pattern!r} matches no file: free-gpus would free nothing",
                     "set hosts[].gpu_devices to the GPU device files (e.g. /dev/nvidia*)")
    return Check("gpu-devices", "pass", f"{g.pattern} matches {len(g.matches)} file(s)")


def check_tp_size(d: DoctorInput) -> Check:
    nodes = len(d.run.nodes)
    if nodes > 1:
        # one server over N nodes (--nnodes): SGLang splits the tensor-parallel group evenly, tp_size / N GPUs per node
        if d.run.tp_size % nodes:
            return Check("tp-size", "fail", f"tp_size {d.run.tp_size} is not a multiple of the run's {nodes} nodes "
                         "(SGLang splits tensor parallelism evenly across --nnodes)",
                         f"set tp_size to {nodes} x the GPUs each node gives the server")
        per_node = d.run.tp_size // nodes
        if per_node > d.host.gpus:
            return Check("tp-size", "fail", f"tp_size {d.run.tp_size} over {nodes} nodes needs {per_node} GPUs per node; "
                         f"this host has {d.host.gpus}", "lower the run's tp_size or add nodes")
        return Check("tp-size", "pass", f"tp_size {d.run.tp_size} over {nodes} nodes: {per_node} of this host's "
                     f"{d.host.gpus} GPUs")
    if d.run.tp_size > d.host.gpus:
        return Check("tp-size", "fail", f"tp_size {d.run.tp_size} > the host's {d.host.gpus} GPUs",
                     "lower the run's tp_size or use a host with more GPUs")
    return Check("tp-size", "pass", f"tp_size {d.run.tp_size} fits {d.host.gpus} GPUs")


def binds_overlap(listener: str, serve: str) -> bool:
    """Would binding ``serve`` fail with ``listener`` listening on the same port (a wildcard takes
    every address; an IPv4-mapped IPv6 address is its IPv4 one)?"""
    if listener in WILDCARDS or serve in WILDCARDS:
        return True
    try:
        a, b = ipaddress.ip_address(listener), ipaddress.ip_address(serve)
    except ValueError:
        return listener == serve
    mapped = getattr(a, "ipv4_mapped", None)
    return a == b or (mapped is not None and mapped == b)


def check_serve_port(d: DoctorInput) -> Check:
    p = d.facts.port
    serve = serve_address(d.run, d.host)
    clashing = [entry for entry in p.listeners if binds_overlap(entry.address, serve)]
    if clashing and d.facts.serve_host.port_free:
        # the kernel let the host bind it just now: what /proc/net/tcp lists on the port is on an
        # address a bind of serve_host does not take (the sandbox's hosts share one table)
        clashing = []
    if p.errors and not clashing:
        return Check("serve-port", "warn", f"cannot decide whether port {p.port} is free: {'; '.join(p.errors)}")
    if not clashing:
        return Check("serve-port", "pass", f"{serve}:{p.port} is free")
    server = p.server.pid if p.server.alive else None
    foreign = []
    for entry in clashing:
        if not entry.holders:
            foreign.append(f"{entry.address}:{p.port} by {unseen_holder(entry.uid, p.uid)} (socket inode {entry.inode})")
        for holder in entry.holders:
            if server is not None and (holder.pid == server or holder.session == server):
                continue
            foreign.append(f"{entry.address}:{p.port} by pid {holder.pid} ({holder.cmdline or '?'})")
    if foreign:
        return Check("serve-port", "fail", f"port {p.port} is held by another process: {'; '.join(foreign)}",
                     "stop that process, or set the run's port to a free one")
    return Check("serve-port", "pass", f"{serve}:{p.port} is held by the server deployctl launched (pid {server}); "
                 "the deploy replaces it")


def check_serve_host(d: DoctorInput) -> Check:
    b = d.facts.serve_host
    if b.address in WILDCARDS:
        return Check("serve-host", "pass", f"{b.address} (every address)")
    if not b.bindable:
        return Check("serve-host", "fail", f"serve_host {b.address!r} is not an address of this host: {b.error}",
                     "set the run's serve_host to one of the host's addresses, 0.0.0.0, or leave it unset")
    return Check("serve-host", "pass", f"{b.address} is an address of this host")


def check_model_paths(d: DoctorInput) -> list[Check]:
    checks = []
    for name, m in (("base-model", d.facts.base_model), ("drafter", d.facts.drafter)):
        if not m.exists:
            checks.append(Check(name, "fail", f"{m.path} does not exist on the host (or is not a directory)",
                                f"set the run's {name.replace('-', '_')} to the checkpoint directory on the host"))
        elif not m.readable:
            checks.append(Check(name, "fail", f"{m.path} is not readable by {d.host.user}", "fix its permissions"))
        elif m.config is None:
            checks.append(Check(name, "fail", f"{m.path}/config.json: {m.config_error}",
                                "a checkpoint directory needs a readable config.json"))
        else:
            checks.append(Check(name, "pass", f"{m.path} readable"))
    return checks


def check_dirs(d: DoctorInput) -> list[Check]:
    checks = []
    for role, facts in sorted(d.facts.dirs.items(), key=lambda kv: kv[0] != "state"):
        name = f"{role}-dir"
        if facts.error and not facts.is_dir and facts.exists:
            checks.append(Check(name, "fail", f"{facts.path}: {facts.error}", "remove or rename it"))
        elif not facts.writable:
            checks.append(Check(name, "fail", f"{facts.path} is not writable by {d.host.user} (checked {facts.checked})",
                                "fix its permissions or set hosts[].state_dir elsewhere"))
        elif facts.free_mib is None:
            checks.append(Check(name, "warn", f"cannot decide free space under {facts.checked}: {facts.error}"))
        elif facts.free_mib < d.host.min_free_mib:
            checks.append(Check(name, "fail", f"{facts.checked} has {facts.free_mib} MiB free, under the "
                                f"configured minimum {d.host.min_free_mib} MiB (hosts[].min_free_mib)",
                                "free disk space there, or lower hosts[].min_free_mib"))
        else:
            checks.append(Check(name, "pass", f"{facts.path} writable, {facts.free_mib} MiB free"))
    return checks


CHECKS: tuple[Callable[[DoctorInput], Check | list[Check]], ...] = (
    check_sglang_version, check_python, check_launch_env, check_nvidia_smi, check_gpu_devices, check_tp_size, check_serve_port,
    check_serve_host, check_model_paths, check_dirs, check_drafter_config, check_drafter_layers,
    check_drafter_weights, check_aux_hidden_states, check_target_capture, check_cuda_graph_capture,
    check_speculative_flags, check_sizes,
    *speculation.CHECKS,  # the silent EAGLE-3 failures reported since (issue 19)
)


def run_checks(d: DoctorInput) -> list[Check]:
    results: list[Check] = []
    for check in CHECKS:
        outcome = check(d)
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]

