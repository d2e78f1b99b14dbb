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
- the sender keeps one copy of the drafter on each GPU until the call returns (CUDA IPC).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from deploy.config.models import Run
from deploy.facts.drafter_swap import SwapInspection
from deploy.host.deployment import SWAP_SAME, DesiredDeployment, drafter_unknown

SWAP_SINCE = (0, 5, 21)
ADMIN_FLAG = "--admin-api-key"


@dataclass(frozen=True)
class SwapDecision:
    path: Literal["swap", "reload"]
    reason: str
    #: the decision still needs the host's inspection (drafters, GPU memory) to be final
    pending: bool = False


@dataclass(frozen=True)
class RunningServer:
    """What the host runs: its deployment record and whether that server serves."""

    record: dict[str, Any] | None
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
        return SwapDecision("reload", f"the host runs run {record.get('run')!r}'s deployment, not this run's")
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
    same = desired.with_drafter(record.get("drafter_path"), record.get("drafter_fingerprint"))
    changed = same.differences(record, SWAP_SAME)
    if changed:
        have = list(record.get("argv") or [])
        detail = f" ({_argv_change(list(same.argv), have)})" if "argv" in changed else ""
        if "sglang version" in changed:
            detail += f" (SGLang {record.get('sglang_version')} -> {version})"
        return SwapDecision("reload", f"changed besides the drafter: {', '.join(changed)}{detail}")
    if has_admin_key(list(record.get("argv") or [])) is False:
        return SwapDecision("reload", f"the server was launched with {ADMIN_FLAG} but deployctl has no key for it")
    if inspection is None:
        return SwapDecision("swap", "only the drafter changed so far; the host's drafters and GPU memory are "
                                    "checked next", pending=True)
    return _judge_drafters(run, desired, record, inspection)


def _judge_drafters(run: Run, desired: DesiredDeployment, record: dict, seen: SwapInspection) -> SwapDecision:
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
    need_mib = -(-new.bytes // (1 << 20))
    by_index = {g.index: g for g in seen.gpus}
    missing = sorted(wanted - set(by_index))
    if missing:
        return SwapDecision("reload", f"GPU {missing[0]} of the server is not listed by nvidia-smi")
    short = [g for g in (by_index[i] for i in sorted(wanted)) if g.free_mib < need_mib]
    if short:
        g = short[0]
        return SwapDecision("reload", f"not enough free GPU memory for a copy of the drafter on each GPU "
                                      f"(GPU {g.index}: {g.free_mib} MiB free, {need_mib} MiB needed)")
    return SwapDecision("swap", f"only the drafter's tensors changed ({str(record.get('drafter_fingerprint'))[:12]} -> "
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

