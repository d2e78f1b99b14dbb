"""What one step hands to a later one on the same host, typed: every reader and writer is visible to mypy.

One ``StepMemory`` per host session (``engine.session.HostSession.memory``); a rollback, the fleet's
pre-drain probe and a node group's stop run with their own. ``slots``: a misspelt field is an
AttributeError on the first write, never a silent ``None`` on a read (the untyped dict of ~22
string keys in 16 files it replaced, issue 25).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploy.facts.server import RunSnapshot
    from deploy.host.records import (AcceptMeasurement, BenchMeasurement, ControlMeasurement, DeploymentRecord,
                                     DrafterUpdate, GateVerdict, LastGood, QuarantineRecord)


@dataclass(slots=True, kw_only=True)
class StepMemory:
    # -- what the run asks (the session's options) --------------------------------------------------
    #: --force: converge redeploys even when the server runs as desired
    force: bool = False
    #: the fleet kept this replica in the router (its probe found it unchanged): it must only converge
    must_converge: bool = False
    #: the host lock's held channel (``locks.acquire_host_lock``); a dropped one stops the next step
    host_lock: Any = None
    #: (step, steps.base.Action) for every action performed on this host, in order (a rollback's too);
    #: ``Any``: base.py imports this module
    journal: list[tuple[str, Any]] = field(default_factory=list)

    # -- doctor ---------------------------------------------------------------------------------------
    #: the run's state as the doctor read it under the host lock (last good, quarantine, server)
    snapshot: RunSnapshot | None = None
    #: SGLang's version (doctor, fix-keys or converge read it; later steps reuse it)
    sglang_version: str | None = None
    #: the doctor's --speculative-draft-model-quantization decision (an unquantized drafter under a quantized target)
    draft_quantization: str | None = None
    #: per GPU index: MiB no process the stop ends holds; wait-gpus-free (a rollback's too) never waits for it
    gpu_baseline_mib: dict[int, int] | None = None
    #: the doctor's checks as documents (verify-acceptance names likely causes from them)
    doctor_checks: list[dict[str, Any]] | None = None

    # -- fix-keys -------------------------------------------------------------------------------------
    drafter_fingerprint: str | None = None
    #: the drafter's path in the host's store (what the launch passes)
    drafter_path: str | None = None
    #: the host's quarantine record as the quarantine step read it
    quarantine: QuarantineRecord | None = None

    # -- converge / launch ----------------------------------------------------------------------------
    #: converge found the server running as desired: the steps that stop, free or launch are skipped
    converged: bool = False
    #: the server's PID (launched now, or the converged one)
    pid: int | None = None
    #: the server's log (launched now, or the converged one's)
    log: str | None = None
    #: the deployment record of the server (launched now or converged)
    deployment: DeploymentRecord | None = None
    launched: bool = False

    # -- swap-drafter (issue 29) ------------------------------------------------------------------
    #: the new drafter was swapped into the running server and verified: stop/free/launch/wait are skipped
    swapped: bool = False
    #: how the drafter was updated on this host ("swapped" and what was verified, or "reloaded" and why)
    drafter_update: DrafterUpdate | None = None

    # -- verification, benchmark, record-good ---------------------------------------------------------
    verify: AcceptMeasurement | None = None
    bench: BenchMeasurement | None = None
    #: same-night-control (issue 39): the last good deployment's rounds measured tonight, before the stop
    control: ControlMeasurement | None = None
    #: the throughput gate's verdict (deploy/local/throughput_gate.py): record-good keeps the bar when inconclusive
    gate: GateVerdict | None = None
    last_good: LastGood | None = None

    # -- rollback -------------------------------------------------------------------------------------
    #: a rollback's memory: the last good record the launch relaunches exactly (argv, env file)
    rollback_record: LastGood | None = None
    #: the deployment the rollback restored (verified)
    restored: DeploymentRecord | None = None
    rollback_failed: bool = False
    #: the server the rollback launched (the headline: launched by this run's rollback)
    rollback_pid: int | None = None

    def rollback_of(self, good: LastGood) -> StepMemory:
        """A rollback's own memory: the last good record, the host lock, and the GPU memory held
        before the stop (the doctor's read), so the rollback's wait-gpus-free never waits for it."""
        return StepMemory(rollback_record=good, host_lock=self.host_lock,
                          gpu_baseline_mib=self.gpu_baseline_mib, journal=self.journal)
