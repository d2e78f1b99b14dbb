"""After a host's steps: what it serves (deploy/serving.py) and its quarantine record.

``serving_of`` turns a finished session (its report, step memory and the server-state read) into
the one answer every headline, JSON report and history row shows. ``update_quarantine`` puts the
drafter fingerprint of a deployment that failed after its launch into the host's quarantine
(deploy/steps/quarantine.py; restart and nightly then refuse it, exit 13), and takes a verified one
out again.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from deploy.config.models import Run
from deploy.engine.records import HostReport, Progress, RunOptions
from deploy.errors import DeployError
from deploy.serving import Serving, decide


def verified_pid(report: HostReport, memory: dict[str, Any]) -> int | None:
    """The server this run verified: its own deployment, or the one its rollback restored."""
    restored = memory.get("restored")
    if isinstance(restored, dict) and isinstance(restored.get("pid"), int):
        return restored["pid"]
    if any(s.name == "verify-acceptance" and s.status == "ok" for s in report.steps):
        pid = memory.get("pid")
        return pid if isinstance(pid, int) else None
    return None


def launched_pids(memory: dict[str, Any]) -> frozenset[int]:
    """The servers this run launched: its own launch, its rollback's."""
    pids = [memory.get("pid") if memory.get("launched") else None, memory.get("rollback_pid")]
    return frozenset(p for p in pids if isinstance(p, int))


def failed_verifications(report: HostReport, memory: dict[str, Any]) -> dict[int, str]:
    """PID -> the first line of what its verify-acceptance said, for each verification that failed in this run
    (the run's own on the server it launched or converged to; the rollback's on the server it relaunched)."""
    failed: dict[int, str] = {}
    for records, pid in ((report.steps, memory.get("pid")), (report.rollback, memory.get("rollback_pid"))):
        step = next((s for s in records if s.name == "verify-acceptance" and s.status == "failed"), None)
        if step is not None and isinstance(pid, int):
            failed[pid] = (step.detail.splitlines() or ["failed"])[0][:300]
    return failed


def serving_of(report: HostReport, memory: dict[str, Any], options: RunOptions, state=None,
               state_error: str | None = None) -> Serving:
    """The headline's one decision, from what was verified in THIS run (launch, rollback, converge)."""
    snapshot = memory.get("snapshot")
    stopped = any(s.name == "stop-stale" and s.status == "ok" for s in (*report.steps, *report.rollback))
    return decide(verified_pid=verified_pid(report, memory), state=state, state_error=state_error, stopped=stopped,
                  last_good=getattr(snapshot, "last_good", None), down=options.command == "down",
                  launched=launched_pids(memory), failed=failed_verifications(report, memory))


def after_interruption(report: HostReport, memory: dict[str, Any]) -> tuple[str, Serving]:
    """(left running, serving) of a host whose run a signal stopped, from what THIS run knows, without
    another read of the host: the server's PID, who launched it and whether this run verified it
    (before issue 28: "left running: unknown", while history said ``serving``)."""
    verified = verified_pid(report, memory)
    pid = memory.get("rollback_pid") if isinstance(memory.get("rollback_pid"), int) else memory.get("pid")
    if not isinstance(pid, int):
        stopped = any(s.name == "stop-stale" and s.status == "ok" for s in (*report.steps, *report.rollback))
        before = "the server that ran before was stopped by this run" if stopped else \
            "the server that ran before (if any) was not stopped"
        return (f"no server launched by this run ({before}); not read again after the interruption",
                Serving("unknown", None, f"interrupted: {before}; not read again"))
    whose = "launched by this run" if pid in launched_pids(memory) else "the server this run found running"
    if verified == pid:
        return (f"SGLang pid {pid} ({whose}, verified in this run); not read again after the interruption",
                Serving("serving", pid, "verified in this run before the interruption; not read again"))
    why = failed_verifications(report, memory).get(pid)
    state = f"failed verification in this run: {why}" if why else "not verified in this run"
    return (f"SGLang pid {pid} ({whose}, {state}); not read again after the interruption",
            Serving("unverified", pid, f"{whose}, {state}; interrupted, not read again"))


def unreached(error: DeployError, why: str) -> Serving:
    return Serving("unknown", None, f"{why}: {str(error).splitlines()[0][:200]}")


def update_quarantine(report: HostReport, options: RunOptions, failed_step: str, conn, run: Run,
                      memory: dict[str, Any], progress: Progress) -> None:
    """One exec, under the run's host lock, only when the record changes; a failure to write it is a
    warning (the record guards later runs, it is never a reason to fail this one)."""
    from deploy.facts.quarantine import parse_quarantine, parse_update, update_command
    from deploy.steps import quarantine

    host = report.host

    def update(op: str, fingerprint: str, entry: dict | None = None) -> None:
        parse_update(conn.check(update_command(host.python, host.state_dir, op, fingerprint, entry), timeout=30,
                                what="quarantine").stdout, host.name)

    fingerprint = memory.get("drafter_fingerprint")
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
        known = memory.get("quarantine")
        if known is None:
            known = parse_quarantine(getattr(memory.get("snapshot"), "quarantine", None), host.name, "quarantine.json")
        if fingerprint and fingerprint in known:
            update("remove", fingerprint)
            progress(host.name, "quarantine", f"fingerprint {fingerprint[:16]} verified: out of the quarantine")
    except DeployError as exc:
        report.warnings.append(f"could not update the quarantine record: {exc}")
