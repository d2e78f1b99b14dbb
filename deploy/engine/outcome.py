"""After a host's steps: what it serves (deploy/engine/serving.py) and its quarantine record.

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
from deploy.base.errors import DeployError, ExitCode
from deploy.engine.serving import Serving, decide

if TYPE_CHECKING:
    from deploy.steps.memory import StepMemory


def verified_pid(report: HostReport, memory: StepMemory) -> int | None:
    """The server this run verified: its own deployment, or the one its rollback restored."""
    restored = memory.restored
    if restored is not None and restored.pid is not None:
        return restored.pid
    if any(s.name == "verify-acceptance" and s.status == "ok" for s in report.steps):
        return memory.pid
    return None


def launched_pids(memory: StepMemory) -> frozenset[int]:
    """The servers this run launched: its own launch, its rollback's."""
    pids = [memory.pid if memory.launched else None, memory.rollback_pid]
    return frozenset(p for p in pids if isinstance(p, int))


def failed_verifications(report: HostReport, memory: StepMemory) -> dict[int, str]:
    """PID -> the first line of what its verify-acceptance said, for each verification that failed in this run
    (the run's own on the server it launched or converged to; the rollback's on the server it relaunched)."""
    failed: dict[int, str] = {}
    for records, pid in ((report.steps, memory.pid), (report.rollback, memory.rollback_pid)):
        step = next((s for s in records if s.name == "verify-acceptance" and s.status == "failed"), None)
        # issue 39: a verification a signal cut short did not fail ("failed verification ... interrupted")
        if step is not None and isinstance(pid, int) and step.exit_code not in SIGNAL_EXITS:
            failed[pid] = (step.detail.splitlines() or ["failed"])[0][:300]
    return failed


def interrupted_verifications(report: HostReport, memory: StepMemory) -> frozenset[int]:
    """The PIDs whose verify-acceptance a signal stopped in this run (neither verified nor failed)."""
    return frozenset(pid for records, pid in ((report.steps, memory.pid), (report.rollback, memory.rollback_pid))
                     if isinstance(pid, int) and any(s.name == "verify-acceptance" and s.status == "failed"
                                                     and s.exit_code in SIGNAL_EXITS for s in records))


def serving_of(report: HostReport, memory: StepMemory, options: RunOptions, state=None,
               state_error: str | None = None) -> Serving:
    """The headline's one decision, from what was verified in THIS run (launch, rollback, converge)."""
    snapshot = memory.snapshot
    stopped = any(s.name == "stop-stale" and s.status == "ok" for s in (*report.steps, *report.rollback))
    return decide(verified_pid=verified_pid(report, memory), state=state, state_error=state_error, stopped=stopped,
                  last_good=getattr(snapshot, "last_good", None), down=options.command == "down",
                  launched=launched_pids(memory), failed=failed_verifications(report, memory))


#: the steps whose result decides what the host serves; interrupted inside one, the run cannot know it
#: (cut inside free-gpus, the server is stopped or untouched and nothing launched all the same)
#: swap-drafter too: cut while its tensors went out, the server's drafter is unknown (issue 38)
CHANGING_STEPS = ("stop-stale", "launch", "swap-drafter")
SIGNAL_EXITS = (int(ExitCode.INTERRUPTED), int(ExitCode.TERMINATED), int(ExitCode.HANGUP))
NOT_READ = "not read again after the interruption"


def after_interruption(report: HostReport, memory: StepMemory, lost: bool = False) -> tuple[str, Serving] | None:
    """(left running, serving) of a host whose run a signal stopped, from what THIS run did, without
    another command on the host: stopped and launched nothing, or the PID it launched (or found
    running as desired) and whether this run verified it. None when the signal cut stop-stale or
    launch short (its command may have finished on the host): only the host can say then.

    Before issues 28 and 31: "left running: unknown" though the run knew it had stopped the server and
    launched nothing, or knew the PID it had verified, while history said ``serving``.

    ``lost``: the same for a run whose connection was lost (issue 39), said as such."""
    records = (*report.steps, *report.rollback)
    cut_short = (int(ExitCode.CONNECTION),) if lost else SIGNAL_EXITS
    event, cut = ("connection loss", "connection lost") if lost else ("interruption", "interrupted")
    not_read = f"not read again after the {event}"
    if any(s.name in CHANGING_STEPS and s.status == "failed" and s.exit_code in cut_short for s in records):
        return None
    if any(s.name == "swap-drafter" and s.data.get("sent") is True for s in records):
        return None  # a swap sent tensors and was not verified: never "what it served before"
    verified = verified_pid(report, memory)
    launched = launched_pids(memory)
    pid = memory.rollback_pid if isinstance(memory.rollback_pid, int) else memory.pid
    if isinstance(pid, int) and (pid in launched or memory.converged):
        whose = "launched by this run" if pid in launched else "the server this run found running as desired, untouched"
        if verified == pid:
            return (f"SGLang pid {pid} ({whose}, verified in this run); {not_read}",
                    Serving("serving", pid, f"verified in this run before the {event}; not read again"))
        why = failed_verifications(report, memory).get(pid)
        ready = any(s.name == "wait-ready" and s.status == "ok" for s in records)
        if why:
            state = f"failed verification in this run: {why}"
        elif pid in interrupted_verifications(report, memory):
            state = "verification interrupted, not verified in this run"
        else:
            state = f"not verified in this run: {'ready' if ready else 'not ready yet'}"
        return (f"SGLang pid {pid} ({whose}, {state}); {not_read}",
                Serving("unverified", pid, f"{whose}, {state}; {cut}, not read again"))
    stop = next((s for s in records if s.name == "stop-stale" and s.status == "ok"), None)
    stopped = [p.get("pid") for p in (stop.data.get("processes") or [])] if stop is not None else []
    if stopped:
        # the server converge found first: stop-stale lists the processes in /proc's order, and once PIDs
        # have wrapped around, the server's TP ranks (started after it) can come before it and push it out
        # of the eight named (seen 2026-12-07: "pid 308, 309, ..., 318" for a server of pid 32745)
        converge = next((s for s in records if s.name == "converge"), None)
        recorded = converge.data.get("recorded_pid") if converge is not None else None
        stopped.sort(key=lambda p: p != recorded)
        listed = ", ".join(str(p) for p in stopped[:8]) + (f" and {len(stopped) - 8} more" if len(stopped) > 8 else "")
        return (f"nothing: this run stopped the server (pid {listed}) and launched nothing; {not_read}",
                Serving("nothing", None, f"this run stopped the server and launched nothing; {cut}"))
    freed = next((s for s in records if s.name == "free-gpus" and s.status == "ok" and s.data.get("killed")), None)
    if freed is not None:
        return None  # it killed GPU holders but stopped no server: only the host can say what still serves
    return (f"what it served before: this run stopped nothing and launched nothing; {not_read}",
            Serving("unknown", None, f"{cut} before anything was stopped: what served before still does; "
                                     "not read again"))


def unreached(error: DeployError, why: str) -> Serving:
    return Serving("unknown", None, f"{why}: {str(error).splitlines()[0][:200]}")


def update_quarantine(report: HostReport, options: RunOptions, failed_step: str, conn, run: Run,
                      memory: StepMemory, progress: Progress) -> None:
    """One exec, under the run's host lock, only when the record changes; a failure to write it is a
    warning (the record guards later runs, it is never a reason to fail this one)."""
    from deploy.facts.quarantine import parse_quarantine, parse_update, update_command
    from deploy.host.records import QuarantineEntry
    from deploy.steps import quarantine

    host = report.host

    def update(op: str, fingerprint: str, entry: QuarantineEntry | None = None) -> None:
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
        if fingerprint and fingerprint in known.entries:
            update("remove", fingerprint)
            progress(host.name, "quarantine", f"fingerprint {fingerprint[:16]} verified: out of the quarantine")
    except DeployError as exc:
        report.warnings.append(f"could not update the quarantine record: {exc}")
