"""The doctor's checks of what the stop and the steps after it will meet, decided before anything is stopped.

Each guards a way a redeploy took a healthy host down (issue 17), all pure functions over the facts
the doctor's one command read (deploy/facts/doctor.py):

- ``gpu-memory``: GPU memory that no process the stop would end accounts for (a leaked CUDA context,
  a process of another container or user). wait-gpus-free would wait for it forever after the healthy
  server was stopped, and so would the rollback.
- ``other-servers``: a server of another run (the state dir's deployment record names it) or one
  deployctl did not start on the host's GPUs: stop-stale and ``fuser -k`` would take it down.
- ``extra-args``: an option the installed SGLang does not have, ``--help``, a lone ``--``, an option
  deployctl sets, a missing value, a value outside the option's choices or not of its type: SGLang's
  argparse exits at launch, after the old server was stopped. The options are the facts' one reading
  of the installed SGLang's parser (deploy/remote/sglang_cli.py), which the parallelism check reads too.
- ``parallelism``: tp x dp x pp more GPUs than the host has (SGLang fails to start its ranks).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Optional

from deploy.config.models import reserved_option_for
from deploy.doctor.checks import Check, DoctorInput, run_checks
from deploy.errors import RemoteOutputError
from deploy.facts.doctor import SglangOption
from deploy.facts.gpus import attach_holders, parse_compute_apps, parse_gpu_rows


@dataclass(frozen=True)
class StopPlan:
    """What the playbook will do after the doctor (its settings), for the checks that depend on it."""

    #: wait-gpus-free's threshold_mib: memory on a GPU at or under it counts as free
    threshold_mib: int = 0
    #: --replace: a server of another run or not deployctl's on the GPUs may be stopped
    replace: bool = False


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


def gpu_memory(d: DoctorInput) -> list[GpuMemory] | str:
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
            elif holders.uid != 0 and proc.uid != holders.uid:
                others.append(f"pid {app.pid} {app.process_name} (uid {proc.uid}: another user's)")
            elif app.used_mib is None:
                unknown = True
            else:
                ended += app.used_mib
        result.append(GpuMemory(row.index, row.used_mib, ended, unknown, tuple(others)))
    return result


def gpu_baseline(d: DoctorInput) -> dict[int, int]:
    """GPU index -> MiB that the stop cannot free (held before anything was stopped): what a wait
    for free GPUs, a rollback's included, must not wait for."""
    memory = gpu_memory(d)
    if isinstance(memory, str):
        return {}
    return {m.index: m.unaccounted_mib for m in memory if m.unaccounted_mib and not m.unknown}


def check_gpu_memory(d: DoctorInput, plan: StopPlan) -> Check:
    memory = gpu_memory(d)
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
#: argparse's own option, in every parser (a unique prefix such as --hel selects it too)
HELP = ["--help", "-h"]
#: a value, not an option, for argparse's _negative_number_matcher: Python 3.8-3.12 ``^-\d+$|^-\d*\.\d+$``,
#: 3.13 ``-\.?\d`` (``-1e3`` too); the host's Python decides, so either counts (never refuse a value it takes)
NEGATIVE_NUMBER = re.compile(r"^-\.?\d")


@dataclass(frozen=True)
class Parsed:
    #: canonical option (the first of its option strings) -> value (None: a flag; several values joined by spaces)
    options: dict[str, Optional[str]]
    #: what SGLang's argparse would exit on at launch
    problems: tuple[str, ...]
    #: what it may accept or refuse (a value outside a list of choices that plugins extend)
    doubts: tuple[str, ...] = ()


def option(names: list[str], nargs: str = "1", choices: Optional[list] = None, value_type: str = "str") -> SglangOption:
    """An option as the facts carry it (for the checks' fallbacks and for tests)."""
    return SglangOption(names=names, nargs=nargs, choices=choices, open_choices=False,
                        type=value_type)  # type: ignore[arg-type]


_HELP = option(HELP, "0")
#: what the parallelism check knows without the installed SGLang's options
_PARALLEL_FALLBACK = [option(list(DP_OPTIONS), value_type="int"), option(list(PP_OPTIONS), value_type="int"),
                      option([DP_ATTENTION], "0")]
MAX_CHOICES_SHOWN = 16


def _resolve(name: str, options: list[SglangOption]) -> tuple[Optional[SglangOption], str]:
    """The option ``name`` selects, as argparse does (exact, else a unique prefix: ``allow_abbrev``,
    SGLang's default); the problem text when none or several."""
    exact = [o for o in options if name in o.names]
    if exact:
        return exact[0], ""
    prefixed = [o for o in options if any(n.startswith(name) for n in o.names)]
    if len(prefixed) == 1:
        return prefixed[0], ""
    if prefixed:
        names = sorted(n for o in prefixed for n in o.names if n.startswith(name))
        return None, f"ambiguous option {name}: it could be {', '.join(names[:6])}"
    close = difflib.get_close_matches(name, [n for o in options for n in o.names], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return None, f"unrecognized option {name}: the installed SGLang has no such option{hint}"


def _is_value(token: str) -> bool:
    """argparse reads a token as an argument, not an option string, when it does not start with '-'
    or looks like a negative number (SGLang has no option that looks like one)."""
    return not token.startswith("-") or bool(NEGATIVE_NUMBER.match(token)) or token == "-"


def _value_problem(spec: SglangOption, shown: str, value: str) -> tuple[str, str]:
    """(problem, doubt) for one value, as argparse converts it by ``type`` and checks ``choices``."""
    converted: object = value
    if spec.type in ("int", "float"):
        try:
            converted = int(value) if spec.type == "int" else float(value)
        except ValueError:
            return f"{shown} {value!r}: SGLang's argparse wants {'an integer' if spec.type == 'int' else 'a number'} " \
                   f"(invalid {spec.type} value)", ""
    if spec.choices is None or spec.type == "other" or converted in spec.choices:
        return "", ""
    allowed = ", ".join(str(c) for c in spec.choices[:MAX_CHOICES_SHOWN])
    allowed += f", ... ({len(spec.choices)} in all)" if len(spec.choices) > MAX_CHOICES_SHOWN else ""
    close = difflib.get_close_matches(value, [str(c) for c in spec.choices], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    text = f"{shown} {value!r}: not one of its choices{hint}; allowed: {allowed}"
    if spec.open_choices:
        return "", text + " (plugins may add choices to this list, so SGLang may still accept it)"
    return f"invalid choice: {text}", ""


def _take_values(spec: SglangOption, args: list[str], i: int) -> tuple[int, Optional[str]]:
    """How many of ``args[i:]`` the option consumes as its values (argparse's nargs), or the problem."""
    following = 0
    while i + following < len(args) and _is_value(args[i + following]) and args[i + following] != "--":
        following += 1
    nargs = spec.nargs
    if nargs == "...":
        return len(args) - i, None
    if nargs in ("?", "unknown"):
        return min(1, following), None
    if nargs == "*":
        return following, None
    if nargs == "+":
        return (following, None) if following else (0, "expected at least one argument")
    count = int(nargs)
    if following < count:
        return 0, "expected one argument" if count == 1 else f"expected {count} arguments"
    return count, None


def parse_extra_args(args: list[str], options: list[SglangOption]) -> Parsed:
    """extra_args read the way SGLang's argparse reads them against the installed SGLang's options."""
    parsed: dict[str, Optional[str]] = {}
    problems: list[str] = []
    doubts: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            problems.append("a lone '--' ends SGLang's options: what follows is an unrecognized argument "
                            "(launch_server takes no positional arguments)")
            continue
        if token == "-h":
            problems.append(f"{token}: SGLang prints its help and exits 0; no server starts")
            continue
        if _is_value(token):
            problems.append(f"{token!r} is not an option (a value must follow its option)")
            continue
        name, eq, explicit = token.partition("=")
        if not name.startswith("--"):
            problems.append(f"{token}: SGLang has no short options (only -h)")
            continue
        spec, problem = _resolve(name, options + [_HELP])
        if spec is _HELP:
            problems.append(f"{token}: that is --help; SGLang prints its help and exits 0, no server starts")
            continue
        if spec is None:
            problems.append(problem)
            i += 1 if not eq and i < len(args) and _is_value(args[i]) else 0
            continue
        canonical = spec.names[0]
        shown = name if name == canonical else f"{name} ({canonical})"
        if eq:
            count, missing = 0, None
            values = [explicit]
            if spec.nargs == "0":
                problems.append(f"{shown} takes no value, got {token!r} (argparse: ignored explicit argument)")
                continue
        else:
            count, missing = _take_values(spec, args, i)
            values = args[i:i + count]
            i += count
        reserved = next((reserved_option_for(n) for n in spec.names if reserved_option_for(n)), None)
        if reserved:
            problems.append(f"{token} is {canonical}, which deployctl sets itself (as {reserved}): set it through "
                            "the run's fields")
            continue
        if missing:
            problems.append(f"{shown}: {missing} (SGLang's argparse exits at launch)")
            continue
        for value in values:
            problem, doubt = _value_problem(spec, shown, value)
            problems += [problem] if problem else []
            doubts += [doubt] if doubt else []
        parsed[canonical] = " ".join(values) if values else None
    return Parsed(parsed, tuple(problems), tuple(doubts))


def _sglang_options(d: DoctorInput) -> tuple[Optional[list[SglangOption]], str]:
    """The installed SGLang's options (the facts' one reading of its parser), or why there are none."""
    cli = d.sglang.cli if d.sglang is not None else None
    if cli is None:
        return None, "the installed SGLang's sources were not found"
    if cli.options is None:
        return None, f"cannot read its options from {cli.file}: {cli.error}"
    return cli.options, cli.file


def check_extra_args(d: DoctorInput) -> Check:
    if not d.run.extra_args:
        return Check("extra-args", "pass", "no extra_args")
    options, where = _sglang_options(d)
    if options is None:
        return Check("extra-args", "warn", f"cannot decide whether SGLang accepts extra_args: {where}",
                     "make the installed SGLang's srt/server_args.py readable")
    parsed = parse_extra_args(list(d.run.extra_args), options)
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
    options, _ = _sglang_options(d)
    parsed = parse_extra_args(list(d.run.extra_args), options or _PARALLEL_FALLBACK)
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
    return Check("parallelism", "pass", f"{formula} = {needed} GPUs fit this host's {d.host.gpus}")


def all_checks(d: DoctorInput, plan: StopPlan | None = None) -> list[Check]:
    """The doctor's checks (deploy/doctor/checks.py) and these, in one list."""
    plan = plan or StopPlan()
    return run_checks(d) + [check_gpu_memory(d, plan), check_other_servers(d, plan), check_extra_args(d),
                            check_parallelism(d)]
