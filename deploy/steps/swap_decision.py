"""Swap or reload: the one decision whether a new drafter goes into the running server.

``swap_decision`` takes the desired deployment (``deploy/host/deployment.py``: the one value of what
this run launches, ``launch.desired``) and the running one (the host's deployment record and its
server's state) as inputs, and compares them with the desired deployment's own ``differences``
(with the running drafter put back: ``with_drafter``), so "only the drafter changed" cannot drift
from what converge and the launch mean by the same deployment. Every verb asks it: the ``swap-drafter`` step before it
sends anything, ``plan`` (without host facts: the decision then says what it still has to check).

Why each refusal (SGLang 0.5.21 - 0.5.23, read from the wheels; docs/drafter-swap.md):
- the session API (``/begin_weight_update`` with ``selector``) first appears in 0.5.21;
- a tensor update reloads tensors only: the draft model's config, shapes and the launch argv stay
  as started, so anything but the drafter's tensors changing needs a launch;
- the hot-token map (``d2t``) is copied by the EAGLE worker at start-up
  (``speculative/eagle_worker_v2.py``: ``self.hot_token_id = draft_runner.model.hot_token_id.to(...)``),
  so a new map loaded later is silently not used;
- a multi-node server's other ranks live on other hosts, where a CUDA-IPC sender cannot reach;
- the sender keeps one copy of the drafter on each GPU until the call returns (CUDA IPC), in a CUDA
  context of its own on each of those GPUs (``SENDER_CONTEXT_MIB``);
- real SGLang's tokenizer asserts ``dp_size == 1`` before a tensor update (0.5.23
  ``srt/managers/tokenizer_control_mixin.py`` ``update_weights_from_tensor``: "data-parallel replicas
  are not supported for update weights from tensor"; 0.5.21: ``dp_size == 1 or enable_dp_attention``),
  an AssertionError answered 500 after begin_weight_update succeeded;
- the runner refuses a tensor update while the HPC-Ops bf16xfp32 GEMM weight cache is on (0.5.21 -
  0.5.23 ``model_runner_components/weight_updater.py`` ``_unsupported_derived_weight_cache_error``;
  ``SGLANG_OPT_BF16_FP32_GEMM_ALGO=hpc``) and raises under ``--weight-cache-mode`` other than off
  (``_assert_weight_cache_inactive``; 0.5.23 refuses that mode with speculative decoding at start-up
  anyway, ``srt/arg_groups/model_path_hook.py``);

``--api-key`` is no refusal: the sender sends it on the NORMAL routes (/server_info, /model_info) and,
without an admin key, on the session routes (``decide_request_auth``, srt/utils/auth.py, 0.5.21 =
0.5.23), and verify-acceptance, which verifies the swap, sends it too (read on the host from the
deployment record, host_ops.server_api_key). It was refused here while verify sent no key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from deploy.config.models import Run
from deploy.facts.drafter_swap import SwapInspection
from deploy.host.deployment import SWAP_SAME, DesiredDeployment, drafter_unknown
from deploy.host.records import DeploymentRecord

SWAP_SINCE = (0, 5, 21)
ADMIN_FLAG = "--admin-api-key"
#: SGLang's aliases of --dp-size (srt/server_args.py, 0.5.21 - 0.5.23)
DP_FLAGS = ("--dp-size", "--data-parallel-size", "--dp")
#: what the sender's own CUDA context takes on each GPU it copies the drafter to (torch's context,
#: cuBLAS-free: several hundred MiB on H100/H200 with CUDA 12 lazy loading; measured by
#: tests/device/swap_drafter_gpu.py as memory before/after). Counted on top of the drafter's bytes.
SENDER_CONTEXT_MIB = 768


@dataclass(frozen=True)
class SwapDecision:
    path: Literal["swap", "reload"]
    reason: str
    #: the decision still needs the host's inspection (drafters, GPU memory) to be final
    pending: bool = False


@dataclass(frozen=True)
class RunningServer:
    """What the host runs: its deployment record and whether that server serves."""

    record: DeploymentRecord | None
    alive: bool
    health: int | None
    pid: int | None


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    nums = [int(x) for x in re.findall(r"\d+", text)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))


def _argv_change(want: list[str], have: list[str]) -> str:
    """What differs in two argvs, for the reason (the rule is ``DesiredDeployment.differences``)."""
    added = [x for x in want if x not in have]
    removed = [x for x in have if x not in want]
    parts = ([f"adds {' '.join(added[:4])}"] if added else []) + ([f"drops {' '.join(removed[:4])}"] if removed else [])
    return "; ".join(parts) or "reorders arguments"


def has_admin_key(argv: list[str]) -> bool | None:
    """None: the server needs no admin key; True: the argv carries it; False: the flag has no value."""
    for i, arg in enumerate(argv):
        if arg == ADMIN_FLAG:
            return i + 1 < len(argv) and bool(argv[i + 1]) and not argv[i + 1].startswith("--")
        if arg.startswith(ADMIN_FLAG + "="):
            return bool(arg.split("=", 1)[1])
    return None


def flag_value(argv: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the last of ``flags`` in ``argv`` (``--flag value`` or ``--flag=value``), as argparse keeps."""
    value = None
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
    return value


def unservable(argv: list[str], env: dict[str, str], version: tuple[int, ...]) -> str | None:
    """Why real SGLang's weight-update session cannot serve this server, read from its launch argv
    and environment (the asserts and refusals of the 0.5.21 - 0.5.23 wheels), or None."""
    dp = flag_value(argv, DP_FLAGS)
    if dp is not None and dp.isdigit() and int(dp) > 1:
        # 0.5.23 tokenizer_control_mixin.py update_weights_from_tensor: assert dp_size == 1 (a 500 after
        # begin succeeded). 0.5.21 also let dp attention through; 0.5.22 was not read: refused for all.
        return (f"--dp-size {dp}: SGLang's update_weights_from_tensor asserts dp_size == 1 (0.5.23; 0.5.21 "
                "with --enable-dp-attention only)")
    mode = flag_value(argv, ("--weight-cache-mode",))
    if mode is not None and mode != "off":
        return (f"--weight-cache-mode {mode}: SGLang refuses in-place weight updates while the weight cache is "
                "active (model_runner_components/weight_updater.py, 0.5.21 - 0.5.23)")
    if env.get("SGLANG_OPT_BF16_FP32_GEMM_ALGO") == "hpc":
        return ("SGLANG_OPT_BF16_FP32_GEMM_ALGO=hpc in the run's env: SGLang refuses online weight updates while "
                "the HPC-Ops bf16xfp32 GEMM caches weight splits (0.5.21 - 0.5.23)")
    return None


def requested_mode(run: Run, override: str | None) -> tuple[str, str]:
    """(swap|reload, where that came from): the command's flag, else the run's ``drafter_update``."""
    if override == "swap":
        return "swap", "--swap-drafter"
    if override == "reload":
        return "reload", "--reload"
    return run.drafter_update, f"drafter_update: {run.drafter_update}"


def swap_decision(run: Run, desired: DesiredDeployment, running: RunningServer | None,
                  inspection: SwapInspection | None = None, override: str | None = None) -> SwapDecision:
    """Swap the drafter into the running server, or reload (stop, launch) -- and why.

    ``running`` None: not read yet (plan); ``inspection`` None: the host's drafters and GPUs not read yet."""
    mode, source = requested_mode(run, override)
    if mode != "swap":
        return SwapDecision("reload", f"{source} (opt in with drafter_update: swap or restart --swap-drafter; "
                                      "not yet seen on real GPUs)")
    if run.nodes:
        return SwapDecision("reload", "a multi-node server: its other ranks are on other hosts, out of a "
                                      "same-host CUDA-IPC sender's reach")
    if running is None:
        return SwapDecision("swap", f"{source}: swap if the host runs this run's deployment and only the "
                                    "drafter's tensors changed (checked on the host), else reload", pending=True)
    record = running.record
    if record is None:
        return SwapDecision("reload", "no deployment is recorded on this host")
    if desired.differences(record, ("run",)):
        return SwapDecision("reload", f"the host runs run {record.run!r}'s deployment, not this run's")
    if drafter_unknown(record):  # swap-failed, or swapping: a swap cut short (a signal, a crash)
        return SwapDecision("reload", "a swap failed on this server before: which drafter it holds is unknown")
    if not running.alive or running.health != 200:
        return SwapDecision("reload", "the recorded server is not serving "
                                      f"({'not running' if not running.alive else f'/health {running.health}'})")
    version = desired.sglang_version
    parsed = _version(version)
    if parsed is None:
        return SwapDecision("reload", "SGLang's version is unknown")
    if parsed < SWAP_SINCE:
        return SwapDecision("reload", f"SGLang {version} has no weight-update session with a draft selector "
                                      "(since 0.5.21)")
    if not desired.differences(record, ("drafter_fingerprint",)):
        return SwapDecision("reload", "the drafter did not change; something else did")
    # the desired deployment with the running drafter put back: anything it still differs in needs a launch
    same = desired.with_drafter(record.drafter_path, record.drafter_fingerprint)
    changed = same.differences(record, SWAP_SAME)
    if changed:
        have = list(record.argv)
        detail = f" ({_argv_change(list(same.argv), have)})" if "argv" in changed else ""
        if "sglang version" in changed:
            detail += f" (SGLang {record.sglang_version} -> {version})"
        return SwapDecision("reload", f"changed besides the drafter: {', '.join(changed)}{detail}")
    if has_admin_key(list(record.argv)) is False:
        return SwapDecision("reload", f"the server was launched with {ADMIN_FLAG} but deployctl has no key for it")
    cannot = unservable(list(record.argv), run.env, parsed)
    if cannot is not None:
        return SwapDecision("reload", cannot)
    if inspection is None:
        return SwapDecision("swap", "only the drafter changed so far; the host's drafters and GPU memory are "
                                    "checked next", pending=True)
    return _judge_drafters(run, desired, record, inspection)


def _judge_drafters(run: Run, desired: DesiredDeployment, record: DeploymentRecord, seen: SwapInspection) -> SwapDecision:
    old, new = seen.running, seen.new
    for facts, which in ((old, "running"), (new, "new")):
        if facts.error is not None:
            return SwapDecision("reload", f"cannot read the {which} drafter: {facts.error}")
    if old.config != new.config:
        keys = sorted(k for k in set(old.config or {}) | set(new.config or {})
                      if (old.config or {}).get(k) != (new.config or {}).get(k))
        return SwapDecision("reload", f"the drafter's config changed ({', '.join(keys[:5])})")
    if set(old.tensors) != set(new.tensors):
        added = sorted(set(new.tensors) - set(old.tensors))
        gone = sorted(set(old.tensors) - set(new.tensors))
        parts = ([f"new {', '.join(added[:3])}"] if added else []) + ([f"gone {', '.join(gone[:3])}"] if gone else [])
        return SwapDecision("reload", f"the drafter's tensors changed ({'; '.join(parts)})")
    reshaped = sorted(n for n in new.tensors if new.tensors[n] != old.tensors[n])
    if reshaped:
        name = reshaped[0]
        return SwapDecision("reload", f"the drafter's shapes changed ({name}: {old.tensors[name]} -> "
                                      f"{new.tensors[name]}{' and more' if len(reshaped) > 1 else ''})")
    if old.d2t_sha256 != new.d2t_sha256 or old.t2d_sha256 != new.t2d_sha256:
        return SwapDecision("reload", "the draft vocabulary map (d2t/t2d) changed: SGLang keeps the hot-token map "
                                      "it built at start-up")
    if seen.gpus is None:
        return SwapDecision("reload", f"the GPUs' free memory is unknown ({seen.gpu_error})")
    base = base_gpu_id(list(desired.argv))
    wanted = {base + r for r in range(run.tp_size)}
    need_mib = -(-new.bytes // (1 << 20)) + SENDER_CONTEXT_MIB
    by_index = {g.index: g for g in seen.gpus}
    missing = sorted(wanted - set(by_index))
    if missing:
        return SwapDecision("reload", f"GPU {missing[0]} of the server is not listed by nvidia-smi")
    short = [g for g in (by_index[i] for i in sorted(wanted)) if g.free_mib < need_mib]
    if short:
        g = short[0]
        return SwapDecision("reload", f"not enough free GPU memory for a copy of the drafter and the sender's CUDA "
                                      f"context on each GPU (GPU {g.index}: {g.free_mib} MiB free, {need_mib} MiB "
                                      f"needed: the drafter and {SENDER_CONTEXT_MIB} MiB of context)")
    return SwapDecision("swap", f"only the drafter's tensors changed ({str(record.drafter_fingerprint)[:12]} -> "
                                f"{str(desired.drafter_fingerprint)[:12]}; same config, shapes and vocabulary "
                                f"map; {need_mib} MiB per GPU free)")


def base_gpu_id(argv: list[str]) -> int:
    """SGLang's --base-gpu-id (default 0): rank r runs on GPU base + r."""
    for i, arg in enumerate(argv):
        if arg == "--base-gpu-id" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if arg.startswith("--base-gpu-id=") and arg.split("=", 1)[1].isdigit():
            return int(arg.split("=", 1)[1])
    return 0

