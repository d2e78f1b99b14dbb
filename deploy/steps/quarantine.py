"""quarantine: a drafter that failed on this host before is not redeployed every night.

After a crash-on-load rollback (exit 11) every following nightly stopped the good server again, loaded
the same bad checkpoint and rolled back: one outage per night until a person noticed. A fingerprint
whose deployment failed verification or was rolled back is recorded on the host (the orchestrator
writes ``<state_dir>/quarantine.json``, deploy/facts/quarantine.py); this step, before stop-stale,
refuses to redeploy it (exit 13, nothing stopped, the message names the fingerprint and when and how
it failed) until the checkpoint changes (a new fingerprint) or ``--retry-failed``. A deployment that
then verifies leaves the quarantine. Skipped when converge found the server already running as desired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deploy.base.errors import DeployError, Quarantined
from deploy.facts.quarantine import parse_quarantine, quarantine_path, read_command
from deploy.host.records import QuarantineEntry, QuarantineRecord
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.steps.failure_cause import failure_cause

if TYPE_CHECKING:
    from deploy.steps.memory import StepMemory

NAME = "quarantine"

#: skipped when converge found the server already running as desired
CONVERGE_SKIPS = True

#: what is quarantined, as the plan says it (the decision: deploy/steps/failure_cause.py)
QUARANTINED_CAUSES = ("the new deployment crashed or failed to load, never became ready, accepted below the threshold "
                      "or regressed conclusively (not a benchmark harness, host or connection failure)")


class Settings(StepSettings):
    #: --retry-failed: deploy a quarantined fingerprint anyway (it leaves the quarantine when it verifies)
    retry_failed: bool = False


def read_action(ctx: StepContext) -> Command:
    return Command(description=f"read the quarantine record ({quarantine_path(ctx.paths.root)}): a drafter fingerprint "
                               "that failed here before is not redeployed (exit 13; --retry-failed)",
                   when="doctor did not read it in this run", command=read_command(ctx.paths.root), timeout_s=30)


def plan(ctx: StepContext) -> list[Command]:
    return [read_action(ctx)]


def entries(ctx: StepContext) -> QuarantineRecord:
    snapshot = ctx.memory.snapshot
    text = getattr(snapshot, "quarantine", None) if snapshot is not None else None
    if snapshot is None or not getattr(snapshot, "quarantine_read", False):
        text = ctx.execute(read_action(ctx)).stdout
    return parse_quarantine(text, ctx.host.name, quarantine_path(ctx.paths.root))


def describe(fingerprint: str, entry: QuarantineEntry) -> str:
    def known(value: object) -> object:
        return "?" if value is None else value

    return (f"drafter fingerprint {fingerprint[:16]} failed on this host at {entry.failed_at} "
            f"({known(entry.verb)} of run {known(entry.run)!r}, exit {known(entry.exit_code)}: "
            f"{str(known(entry.reason))[:200]})")


def run(ctx: StepContext) -> StepOutcome:
    fingerprint = ctx.memory.drafter_fingerprint
    known = entries(ctx)
    ctx.memory.quarantine = known
    if not fingerprint:
        return StepOutcome("ok", "no drafter fingerprint in this run: nothing to compare",
                           {"entries": len(known.entries)})
    entry = known.entries.get(fingerprint)
    if entry is None:
        return StepOutcome("ok", f"fingerprint {fingerprint[:16]} is not quarantined", {"entries": len(known.entries)})
    if ctx.settings.retry_failed:
        ctx.progress(f"--retry-failed: redeploying {describe(fingerprint, entry)}")
        return StepOutcome("ok", f"--retry-failed: retrying quarantined fingerprint {fingerprint[:16]}",
                           {"entries": len(known.entries), "retrying": fingerprint})
    from deploy.steps.doctor import left_as_it_was

    raise Quarantined(f"{ctx.host.name}: {describe(fingerprint, entry)}; not redeployed: nothing was stopped, "
                      f"{left_as_it_was(ctx.memory.snapshot)}. Change the checkpoint, or pass --retry-failed "
                      "to try it again")


def failure_entry(verb: str, run_name: str, failed_step: str, error: DeployError, memory: StepMemory,
                  failed_at: str) -> tuple[str, QuarantineEntry] | None:
    """(fingerprint, entry) to quarantine after a failed run, or None: only a deployment that was
    launched in this run and failed for a cause that is the checkpoint's (failure_cause), of a
    fingerprint that is not the host's last good one."""
    fingerprint = memory.drafter_fingerprint
    if not fingerprint or memory.converged or not memory.launched:
        return None
    cause = failure_cause(failed_step, error)
    if not cause.quarantines:
        return None
    snapshot = memory.snapshot
    good = snapshot.last_good if snapshot is not None else None
    if good is not None and good.drafter_fingerprint == fingerprint:
        return None  # the last good deployment itself: quarantining it would leave nothing to deploy
    entry = QuarantineEntry(failed_at=failed_at, verb=verb, run=run_name, exit_code=int(error.exit_code),
                            reason=f"{failed_step} ({cause.value}): {str(error).splitlines()[0][:300]}",
                            drafter_path=memory.drafter_path)
    return fingerprint, entry

