"""After a host's steps: what it serves (deploy/serving.py) and its quarantine record.

``serving_of`` turns a finished session (its report, step memory and the server-state read) into
the one answer every headline, JSON report and history row shows. ``update_quarantine`` puts the
drafter fingerprint of a deployment that failed after its launch into the host's quarantine
(deploy/steps/quarantine.py; restart and nightly then refuse it, exit 13), and takes a verified one
out again.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING

from deploy.config.models import Run
from deploy.engine.records import HostReport, Progress, RunOptions
from deploy.errors import DeployError
from deploy.serving import Serving, decide

if TYPE_CHECKING:
    from deploy.steps.memory import StepMemory


def verified_pid(report: HostReport, memory: StepMemory) -> int | None:
    """The server this run verified: its own deployment, or the one its rollback restored."""
    restored = memory.restored
    if isinstance(restored, dict) and isinstance(restored.get("pid"), int):
        return restored["pid"]
    if any(s.name == "verify-acceptance" and s.status == "ok" for s in report.steps):
        return memory.pid
    return None


def serving_of(report: HostReport, memory: StepMemory, options: RunOptions, state=None,
               state_error: str | None = None) -> Serving:
    snapshot = memory.snapshot
    return decide(verified_pid=verified_pid(report, memory), state=state, state_error=state_error,
                  stopped=any(s.name == "stop-stale" and s.status == "ok" for s in report.steps),
                  last_good=getattr(snapshot, "last_good", None), down=options.command == "down")


def unreached(error: DeployError, why: str) -> Serving:
    return Serving("unknown", None, f"{why}: {str(error).splitlines()[0][:200]}")


def update_quarantine(report: HostReport, options: RunOptions, failed_step: str, conn, run: Run,
                      memory: StepMemory, progress: Progress) -> None:
    """One exec, under the run's host lock, only when the record changes; a failure to write it is a
    warning (the record guards later runs, it is never a reason to fail this one)."""
    from deploy.facts.quarantine import parse_quarantine, parse_update, update_command
    from deploy.steps import quarantine

    host = report.host

    def update(op: str, fingerprint: str, entry: dict | None = None) -> None:
        parse_update(conn.check(update_command(host.python, host.state_dir, op, fingerprint, entry), timeout=30,
                                what="quarantine").stdout, host.name)

    fingerprint = memory.drafter_fingerprint
    try:
        if report.error is not None:
            found = quarantine.failure_entry(options.command, run.name, failed_step, report.cause or report.error,
                                             memory, datetime.now(timezone.utc).isoformat(timespec="seconds"))
            if found is not None:
                update("add", *found)
                note = (f"quarantined drafter fingerprint {found[0][:16]} on this host: restart and nightly will not "
                        "redeploy it until the checkpoint changes (or --retry-failed)")
                report.warnings.append(note)
                progress(host.name, "quarantine", note)
            return
        known = memory.quarantine
        if known is None:
            known = parse_quarantine(getattr(memory.snapshot, "quarantine", None), host.name, "quarantine.json")
        if fingerprint and fingerprint in known:
            update("remove", fingerprint)
            progress(host.name, "quarantine", f"fingerprint {fingerprint[:16]} verified: out of the quarantine")
    except DeployError as exc:
        report.warnings.append(f"could not update the quarantine record: {exc}")
