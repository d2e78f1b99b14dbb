"""Running a playbook on a run's hosts: one session per host, hosts in parallel (``run_playbook``),
and the verbs that change hosts around it (``run_locked``: local lock, host locks, history).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from deploy.config.models import Config, Host, Run
from deploy.engine.records import HostReport, Progress, RunOptions, launch_stamp
from deploy.engine.session import run_on_host
from deploy.base.errors import DeployError, ExitCode, LockHeld
from deploy.engine.fanout import exit_code, for_each_host
from deploy.ssh.transport import JumpConnections

if TYPE_CHECKING:
    from deploy.engine.playbook import Playbook

__all__ = ["RunReport", "exit_code", "mark_interrupted", "run_locked", "run_playbook"]


@dataclass
class RunReport:
    """What ``run_locked`` returns, whatever ran: every host's report and, when a runner ran (a fleet's
    phases, a node group, ``down`` behind a router: deploy/fleet/), the runner's own result, whose
    ``exit_code()`` then decides (a run-level failure, the router's pre-flight, fails the run)."""

    reports: list[HostReport]
    #: the runner's result (fleet.phases.RunResult or DownResult); None: one parallel playbook ran
    phased: Any = None

    def exit_code(self) -> ExitCode:
        if self.phased is not None:
            return ExitCode(self.phased.exit_code())
        return exit_code(self.reports)


def run_playbook(config: Config, playbook: Playbook, run: Run, hosts: Sequence[Host],
                 progress: Progress, options: RunOptions | None = None) -> list[HostReport]:
    stamp = launch_stamp()
    cancelled = threading.Event()
    with JumpConnections() as jumps:  # one connection per jump host, shared by its targets
        outcomes = for_each_host(
            hosts, lambda h: run_on_host(config, playbook, run, h, stamp, progress, cancelled, jumps,
                                         options),
            config.ssh.max_parallel, cancel=cancelled,
        )
    reports = []
    for outcome in outcomes:
        if outcome.value is not None:
            reports.append(outcome.value)
        else:
            reports.append(HostReport(outcome.host, error=outcome.error))
    return reports


def mark_interrupted(reports: Sequence[HostReport], code: int, signal_name: str = "") -> None:
    """A host the interruption (Ctrl-C 130, SIGTERM 143, SIGHUP 129) cut short is reported, and recorded
    in history, as interrupted with the signal's exit code; a host that had finished keeps its outcome."""
    from deploy.base.errors import Interrupted

    cause = f"terminated by {signal_name}" if signal_name else "interrupted"
    for report in reports:
        unfinished = any(s.status == "not-run" for s in report.steps)
        if report.error is None and unfinished:
            report.error = Interrupted(f"{report.host.name}: {cause} before its steps finished")
        if isinstance(report.error, Interrupted):
            report.error = Interrupted(str(report.error), exit_code=ExitCode(code))


def run_locked(config_path, config: Config, command: str, playbook: Playbook, run: Run, hosts: Sequence[Host],
               progress: Progress, *, rollback: bool = True, force: bool = False, runner=None) -> RunReport:
    """Run a playbook that changes hosts: local lock per config and run, host locks, history.

    ``runner(options)``: a fleet's run-level phases instead of one parallel playbook
    (deploy/fleet/); its result (with ``reports`` and ``exit_code()``) is the RunReport's ``phased``.
    """
    from contextlib import ExitStack

    from deploy.local import history
    from deploy.engine.locks import local_lock, local_scopes, owner_info

    owner = owner_info(command, run.name)
    started = datetime.now(timezone.utc)
    with ExitStack() as held:
        try:
            # per host (and router): an operator's run on other hosts of the same config and run proceeds
            scopes = local_scopes([h.name for h in hosts], run.router.host if run.router is not None else None)
            held.enter_context(local_lock(config_path, run.name, owner, scopes))
        except LockHeld as refused:
            try:
                history.append({"time": started.isoformat(timespec="seconds"), "verb": command, "run": run.name,
                                "host": host.name, "draft_tokens": run.draft_tokens, "outcome": "locked",
                                "exit_code": int(refused.exit_code), "duration_s": 0.0} for host in hosts)
            except (OSError, DeployError):
                pass
            raise
        try:
            options = RunOptions(command=command, lock=True, owner=owner, rollback=rollback, force=force)
            if runner is not None:
                phased = runner(options)
                result = RunReport(phased.reports, phased)
            else:
                result = RunReport(run_playbook(config, playbook, run, hosts, progress, options))
            reports = result.reports
        except KeyboardInterrupt as interrupt:
            # Ctrl-C: no rollback, but say what each host was left running, and record it.
            partial = [o.value for o in getattr(interrupt, "outcomes", []) if o.value is not None]
            mark_interrupted(partial, getattr(interrupt, "exit_code", ExitCode.INTERRUPTED), str(interrupt))
            for report in partial:
                progress(report.host.name, "interrupted", f"left running: {report.left_running or 'unknown'}")
            try:
                history.append(history.records_for(command, run.name, partial, started))
            except (OSError, DeployError):
                pass
            raise
    try:
        history.append(history.records_for(command, run.name, reports, started))
    except (OSError, DeployError) as exc:  # history is a record, never a reason to fail the deploy
        progress("*", "history", f"WARNING: could not append to {history.history_path()}: {exc}")
    return result
