"""stop-stale: SIGTERM, a grace period, then SIGKILL for stale python3 processes.

Scope ``user`` is the hand-run procedure's ``killall python3`` (every python3 process of the deploy user),
which also catches SGLang's renamed TP workers that ``killall`` misses; ``pidfile`` stops only the
server deployctl launched (and its session). The helper never kills itself or its parents.
"""

from __future__ import annotations

from typing import Literal

from deploy.base.errors import RemoteCommandFailed, RemoteOutputError
from deploy.facts.server import deployment_path
from deploy.facts.host_helper import parse_stop_report, stop_processes_command
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings

NAME = "stop-stale"


#: skipped when converge found the server already running as desired
CONVERGE_SKIPS = True


class Settings(StepSettings):
    scope: Literal["user", "pidfile"] = "pidfile"
    #: seconds between SIGTERM and SIGKILL; default: the run's timeouts.stop_grace_s
    grace_s: float | None = None
    #: scope user: processes whose command line contains one of these are left alone. As root,
    #: "every python3" also means the distribution's own daemons (Debian/Ubuntu ship these two).
    exclude: list[str] = ["networkd-dispatcher", "unattended-upgrade"]


def grace(ctx: StepContext) -> float:
    return ctx.settings.grace_s if ctx.settings.grace_s is not None else ctx.run.timeouts.stop_grace_s


def command(ctx: StepContext) -> str:
    return stop_processes_command(ctx.host.python, ctx.paths.helper("host_ops.py"), ctx.settings.scope, grace(ctx),
                                  pidfile=ctx.paths.pidfile, exclude=ctx.settings.exclude,
                                  record=deployment_path(ctx.paths.root))


def action(ctx: StepContext) -> Command:
    return Command(description=f"stop stale python3 processes (scope {ctx.settings.scope})", command=command(ctx),
                   timeout_s=ctx.timeout(grace(ctx) + 60), what="stop-processes")


def plan(ctx: StepContext) -> list[Command]:
    return [action(ctx)]


def run(ctx: StepContext) -> StepOutcome:
    result = ctx.execute(action(ctx))
    report = parse_stop_report(result.stdout, ctx.host.name)
    processes = [p.model_dump(exclude_none=True) for p in report.processes]
    for proc in processes:
        ctx.progress(f"SIG{proc['signal']} {proc['pid']} {proc['cmdline'][:120]}")
    survivors = [p for p in processes if not p["exited"]]
    if survivors:
        listing = "; ".join(f"{p['pid']} {p['cmdline'][:80]} ({p.get('error', 'still alive')})" for p in survivors)
        raise RemoteOutputError(f"{ctx.host.name}: processes survived SIGKILL: {listing}")
    killed = sum(1 for p in processes if p["signal"] == "KILL")
    detail = f"stopped {len(processes)} process(es)" + (f", {killed} needed SIGKILL" if killed else "")
    if report.pid_check == "elsewhere":
        # The PID file does not name the server deployctl launched, but a process with its exact
        # command line runs: nothing was signalled, and "stopped" would be false (HOSTILE, issue 22).
        raise RemoteCommandFailed(f"{ctx.host.name}: {report.note}; nothing was signalled (running: {report.running}). "
                                  "Stop it by hand, or put its PID into the PID file, then run this again")
    if report.note and not processes:
        detail = report.note
    return StepOutcome("ok", detail, {"processes": processes, "note": report.note})
