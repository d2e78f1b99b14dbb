"""The doctor's checks of what the stop and the steps after it will meet, decided before anything is stopped.

Each guards a way a redeploy took a healthy host down (issue 17), all pure functions over the facts
the doctor's one command read (deploy/facts/doctor.py):

- ``gpu-memory``: GPU memory that no process the stop would end accounts for (a leaked CUDA context,
  a process of another container or user). wait-gpus-free would wait for it forever after the healthy
  server was stopped, and so would the rollback.
- ``other-servers``: a server of another run (the state dir's deployment record names it) or one
  deployctl did not start on the host's GPUs: stop-stale and ``fuser -k`` would take it down.
- ``extra-args``: an option the installed SGLang does not have, ``--help``, a lone ``--``, an option
  deployctl sets, a missing value, a value outside the option's choices or that its type function
  refuses, a ``--config`` file SGLang would stop on or that sets any of these: SGLang exits at launch,
  after the old server was stopped. The options are the facts' one reading of the installed SGLang's
  parser (deploy/remote/sglang_cli.py), which the parallelism check reads too.
- ``parallelism``: tp x dp x pp more GPUs than the host has, or ``--base-gpu-id`` placing a rank past
  the plan's GPUs (SGLang fails to start its ranks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from deploy.doctor.checks import Check, DoctorInput, run_checks
from deploy.doctor.sglang_options import Parsed, context_of, installed_options, judge_extra_args, option, parse_extra_args  # noqa: F401  (Parsed: re-exported)
from deploy.base.errors import RemoteOutputError
from deploy.facts.gpus import attach_holders, parse_compute_apps, parse_gpu_rows


@dataclass(frozen=True)
class StopPlan:
    """What the playbook will do after the doctor (its settings), for the checks that depend on it."""

    #: wait-gpus-free's threshold_mib: memory on a GPU at or under it counts as free
    threshold_mib: int = 0
    #: --replace: a server of another run or not deployctl's on the GPUs may be stopped
    replace: bool = False
    #: free-gpus' kill_other_users: it kills other users' holders too (never unless the run says so, issue 39)
    kill_other_users: bool = False


@dataclass(frozen=True)
class GpuMemory:
    index: int
    used_mib: int
    #: what the processes the stop would end hold (stop-stale, fuser -k as the deploy user)
    ended_mib: int
    #: a process the stop ends reports no memory figure ([N/A]): what it holds is unknown
    unknown: bool
    #: the listed holders the stop cannot end: "pid 7 (uid 1001: another user's)"
    others: tuple[str, ...]

    @property
    def unaccounted_mib(self) -> int:
        return max(0, self.used_mib - self.ended_mib)


def gpu_memory(d: DoctorInput, kill_other_users: bool = False) -> list[GpuMemory] | str:
    """Per GPU: used memory, what the stop would free, who else holds it; the reason when unknown."""
    holders = d.facts.gpu_holders
    smi = d.facts.nvidia_smi
    if holders is None:
        return "the host's facts have no GPU holders (an older doctor program)"
    if not smi.found or smi.exit_code != 0:
        return "nvidia-smi did not answer (see the nvidia-smi check)"
    if holders.apps.exit_code != 0:
        return f"nvidia-smi's compute-apps query failed: {holders.apps.error or holders.apps.stderr.strip()[:200]}"
    try:
        rows = attach_holders(parse_gpu_rows(smi.stdout, d.host.gpus, source=d.host.name),
                              parse_compute_apps(holders.apps.stdout, source=d.host.name), source=d.host.name)
    except RemoteOutputError as exc:
        return str(exc)
    result = []
    for row in rows:
        ended, unknown, others = 0, False, []
        for app in row.holders:
            proc = holders.processes.get(str(app.pid))
            if proc is None or not proc.visible:
                others.append(f"pid {app.pid} {app.process_name} (not a process of this host's PID namespace: "
                              "another container's?)")
            elif proc.uid != holders.uid and not kill_other_users:
                # free-gpus kills only the deploy user's holders, root's run included (issue 39)
                others.append(f"pid {app.pid} {app.process_name} (uid {proc.uid}: another user's)")
            elif app.used_mib is None:
                unknown = True
            else:
                ended += app.used_mib
        result.append(GpuMemory(row.index, row.used_mib, ended, unknown, tuple(others)))
    return result


def gpu_baseline(d: DoctorInput, kill_other_users: bool = False) -> dict[int, int]:
    """GPU index -> MiB that the stop cannot free (held before anything was stopped): what a wait
    for free GPUs, a rollback's included, must not wait for."""
    memory = gpu_memory(d, kill_other_users)
    if isinstance(memory, str):
        return {}
    return {m.index: m.unaccounted_mib for m in memory if m.unaccounted_mib and not m.unknown}


def check_gpu_memory(d: DoctorInput, plan: StopPlan) -> Check:
    memory = gpu_memory(d, plan.kill_other_users)
    if isinstance(memory, str):
        return Check("gpu-memory", "warn", f"cannot decide whether the stop frees the GPUs: {memory}")
    holders = d.facts.gpu_holders
    assert holders is not None
    if holders.server.alive and not any(m.ended_mib or m.unknown for m in memory) and \
            any(m.used_mib > plan.threshold_mib for m in memory):
        # Our own server runs, yet nvidia-smi attributes no memory to any process we can see: a container
        # without the host's PID namespace lists none. Every byte would look held by a stranger.
        return Check("gpu-memory", "warn", f"cannot decide: the server deployctl launched (pid {holders.server.pid}) "
                     "runs, but nvidia-smi attributes no GPU memory to a process of this host (a container without "
                     "the host's PID namespace?)", "run deployctl where nvidia-smi lists the server's processes")
    stuck = [m for m in memory if m.unaccounted_mib > plan.threshold_mib and not m.unknown]
    if not stuck:
        held = sum(m.ended_mib for m in memory)
        return Check("gpu-memory", "pass", f"the stop frees every GPU to <= {plan.threshold_mib} MiB "
                     f"({held} MiB held by processes it ends)")
    parts = []
    for m in stuck:
        who = "; ".join(m.others) if m.others else "no listed process (a leaked context, or a process nvidia-smi "\
                                                   "cannot attribute)"
        parts.append(f"GPU {m.index}: {m.unaccounted_mib} MiB of {m.used_mib} MiB held by {who}")
    worst = max(m.unaccounted_mib for m in stuck)
    return Check("gpu-memory", "fail",
                 f"{len(stuck)} GPU(s) would not be freed by the stop: wait-gpus-free waits for <= "
                 f"{plan.threshold_mib} MiB and would time out after the running server was stopped\n"
                 + "\n".join(parts),
                 f"end those holders, reset the GPU (nvidia-smi --gpu-reset -i N, as root, nothing else on it), "
                 f"reboot the host, or set wait-gpus-free's threshold_mib to {worst} or more in your playbook")


def check_gpu_holders(d: DoctorInput, plan: StopPlan) -> Check:
    """Every process free-gpus would kill, named (user, pid, command) before anything is stopped, and each holder
    of another user it leaves alone (issue 39: deploying as root, it SIGKILLed uid 65534's process unnamed)."""
    holders = d.facts.gpu_holders
    if holders is None:
        return Check("gpu-holders", "warn", "cannot decide: the host's facts have no GPU holders")
    server = holders.server
    killed: list[str] = []
    spared: list[str] = []
    for h in holders.device_holders:
        if server.pid is not None and (h.pid == server.pid or h.session == server.pid):
            continue  # the server (and its ranks) stop-stale stops first
        who = f"pid {h.pid} (user {h.user or '?'}, uid {h.uid if h.uid is not None else '?'}): {(h.cmdline or '?')[:200]}"
        (killed if h.uid == holders.uid or plan.kill_other_users else spared).append(who)
    lines = [f"free-gpus would kill {who}" for who in killed] + \
        [f"left alone (another user's; free-gpus kill_other_users: true to kill it): {who}" for who in spared]
    if not lines:
        return Check("gpu-holders", "pass", "free-gpus would kill nothing but the server stop-stale stops")
    return Check("gpu-holders", "warn" if spared else "pass", f"{len(killed)} process(es) free-gpus would kill, {len(spared)} of other "
                 "users left alone\n" + "\n".join(lines))


#: command lines of model servers (a stand-in SGLang's too): what stop-stale must not take down unasked
SERVER_CMDLINE = re.compile(r"sglang|vllm|text-generation-launcher|tritonserver", re.I)


def check_other_servers(d: DoctorInput, plan: StopPlan) -> Check:
    holders = d.facts.gpu_holders
    if holders is None:
        return Check("other-servers", "warn", "cannot decide: the host's facts have no GPU holders")
    server = holders.server
    found = []
    if server.alive and server.run is not None and server.run != d.run.name:
        found.append(f"pid {server.pid} serves run {server.run!r} (the deployment record in {d.host.state_dir}): "
                     f"{server.cmdline or '?'}")
    seen = set()
    for pid_text, proc in sorted(holders.processes.items(), key=lambda kv: int(kv[0])):
        pid = int(pid_text)
        if not proc.visible or not SERVER_CMDLINE.search(proc.cmdline or ""):
            continue
        if server.pid is not None and (pid == server.pid or proc.session == server.pid):
            continue  # the server deployctl launched (or its TP ranks, in its session)
        session = proc.session if proc.session is not None else pid
        if session in seen:
            continue  # one server: its TP ranks share its session
        seen.add(session)
        found.append(f"pid {pid} holds GPUs and was not started by deployctl for this state dir: "
                     f"{(proc.cmdline or '?')[:200]}")
    if not found:
        return Check("other-servers", "pass", "no server of another run, and none deployctl did not start, on the GPUs")
    if plan.replace:
        return Check("other-servers", "warn", "--replace: stop-stale and free-gpus will stop it\n" + "\n".join(found))
    return Check("other-servers", "fail",
                 f"{len(found)} server(s) this run would stop without being asked to\n" + "\n".join(found),
                 "stop it yourself, give this run another host (or GPUs), or pass --replace to stop it")


# ---------------------------------------------------------------------------------------------
# extra_args against the installed SGLang's own options

DP_OPTIONS = ("--data-parallel-size", "--dp-size")
PP_OPTIONS = ("--pipeline-parallel-size", "--pp-size")
DP_ATTENTION = "--enable-dp-attention"
#: what the parallelism check knows without the installed SGLang's options
_PARALLEL_FALLBACK = [option(list(DP_OPTIONS), value_type="int"), option(list(PP_OPTIONS), value_type="int"),
                      option([DP_ATTENTION], "0")]


def check_extra_args(d: DoctorInput) -> Check:
    if not d.run.extra_args:
        return Check("extra-args", "pass", "no extra_args")
    parsed, where = judge_extra_args(d)
    if parsed is None:
        return Check("extra-args", "warn", f"cannot decide whether SGLang accepts extra_args: {where}",
                     "make the installed SGLang's srt/server_args.py readable")
    version = d.sglang.version if d.sglang is not None else None
    if parsed.problems:
        return Check("extra-args", "fail", f"SGLang {version or '?'} would refuse the run's extra_args at launch, after "
                     "the running server was stopped:\n" + "\n".join(parsed.problems + parsed.doubts),
                     f"fix the run's extra_args (the options are in {where})")
    if parsed.doubts:
        return Check("extra-args", "warn", f"cannot decide whether SGLang {version or '?'} accepts the run's "
                     "extra_args:\n" + "\n".join(parsed.doubts),
                     "check the value against the installed SGLang and its plugins")
    return Check("extra-args", "pass", f"{len(parsed.options)} option(s), each one of the installed SGLang's ({where})")


def _int_option(options: dict[str, Optional[str]], names: tuple[str, ...]) -> tuple[int, str]:
    for name in names:
        if name in options:
            value = options[name] or ""
            if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
                raise ValueError(f"{name} {value!r} is not a positive whole number")
            return int(value), name
    return 1, ""


def check_parallelism(d: DoctorInput) -> Check:
    options, _ = installed_options(d)
    parsed = parse_extra_args(list(d.run.extra_args), options or _PARALLEL_FALLBACK, context_of(d))
    try:
        dp, dp_name = _int_option(parsed.options, DP_OPTIONS)
        pp, pp_name = _int_option(parsed.options, PP_OPTIONS)
    except ValueError as exc:
        return Check("parallelism", "fail", str(exc), "give the option a whole number")
    tp = d.run.tp_size
    nodes = max(1, len(d.run.nodes))
    attention = DP_ATTENTION in parsed.options
    # SGLang: dp replicas multiply the GPUs unless DP attention runs them inside the TP group
    # (--enable-dp-attention: dp <= tp, GPUs = tp x pp); pipeline stages always multiply them.
    needed = tp * pp * (1 if attention else dp)
    per_node = -(-needed // nodes)
    formula = f"tp {tp} x pp {pp}" + ("" if attention else f" x dp {dp}") + (f" over {nodes} nodes" if nodes > 1 else "")
    if attention and dp > tp:
        return Check("parallelism", "fail", f"{dp_name} {dp} exceeds tp {tp}: DP attention splits the TP group",
                     "lower the dp size to a divisor of tp_size")
    if per_node > d.host.gpus:
        return Check("parallelism", "fail", f"{formula} needs {per_node} GPUs on this host, which has {d.host.gpus}: "
                     "SGLang cannot start its ranks", f"lower {dp_name or pp_name or 'tp_size'} (or tp_size) so "
                     f"tp x pp x dp fits {d.host.gpus} GPUs, or add --enable-dp-attention for DP inside the TP group")
    placed = gpu_placement(d, parsed.options, per_node, formula)
    if placed is not None:
        return placed
    return Check("parallelism", "pass", f"{formula} = {needed} GPUs fit this host's {d.host.gpus}")


BASE_GPU_ID, GPU_ID_STEP = "--base-gpu-id", "--gpu-id-step"


def gpu_placement(d: DoctorInput, options: dict[str, Optional[str]], per_node: int, formula: str) -> Optional[Check]:
    """--base-gpu-id / --gpu-id-step against the GPUs the run's plan uses: SGLang puts rank r on GPU
    base + r x step (0.5.12 to 0.5.23) and asserts base >= 0, step >= 1; deployctl's plan and its GPU
    locks count ``hosts[].gpus`` GPUs (or those CUDA_VISIBLE_DEVICES in the run's env leaves)."""
    if BASE_GPU_ID not in options and GPU_ID_STEP not in options:
        return None
    try:
        base = int(options.get(BASE_GPU_ID) or 0)
        step = int(options.get(GPU_ID_STEP) or 1)
    except ValueError:
        return None  # the extra-args check refuses the value itself
    visible = d.run.env.get("CUDA_VISIBLE_DEVICES")
    count = len([v for v in visible.split(",") if v.strip()]) if visible else d.host.gpus
    where = f"CUDA_VISIBLE_DEVICES in the run's env leaves {count}" if visible else f"hosts[].gpus is {d.host.gpus}"
    shown = f"{BASE_GPU_ID} {base}" + (f" {GPU_ID_STEP} {step}" if GPU_ID_STEP in options else "")
    if base < 0 or step < 1:
        return Check("parallelism", "fail", f"{shown}: SGLang asserts base_gpu_id >= 0 and gpu_id_step >= 1 at start-up",
                     f"give {BASE_GPU_ID} a GPU index from 0 to {count - 1}")
    last = base + (per_node - 1) * step
    if last >= count:
        return Check("parallelism", "fail",
                     f"{shown} with {formula} puts the last rank on GPU {last}, but the run's GPU plan has GPUs 0 to "
                     f"{count - 1} ({where}; the GPU locks and free-gpus cover those): SGLang fails to start that rank",
                     f"lower {BASE_GPU_ID} to at most {max(0, count - 1 - (per_node - 1) * step)} or tp_size, or raise "
                     "hosts[].gpus if the host has more")
    return Check("parallelism", "pass", f"{formula} on GPUs {base} to {last} (step {step}) of the plan's {count} "
                 f"({where})")


def all_checks(d: DoctorInput, plan: StopPlan | None = None) -> list[Check]:
    """The doctor's checks (deploy/doctor/checks.py) and these, in one list."""
    plan = plan or StopPlan()
    return run_checks(d) + [check_gpu_memory(d, plan), check_gpu_holders(d, plan), check_other_servers(d, plan),
                            check_extra_args(d), check_parallelism(d)]
