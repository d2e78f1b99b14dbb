"""Run-level phases: steps that run once per run and see every host of it, between host phases.

A run is a list of phases executed in order with a barrier between them:

- ``HostPhase(hosts)``: the playbook on those hosts, in parallel (the per-host steps, each host
  under its host lock, with converge and rollback as in a plain run);
- ``RunPhase(name, action)``: one action with the whole run's state (every host's report so far,
  the router host's connection), e.g. take a batch out of the router, drain it, put it back.

A failing phase stops the run; the phases after it do not run (their hosts stay untouched).
Rolling redeploys (``--serial N``) and the router are built from these; see ``fleet_phases``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from deploy.config.models import Config, Host, Run
from deploy.base.errors import DeployError, ExitCode, Interrupted
from deploy.engine.fanout import for_each_host
from deploy.engine.records import HostReport, Progress, RunOptions, StepRecord
from deploy.engine.session import network_host, run_on_host
from deploy.engine.playbook import Playbook
from deploy.ssh.transport import HostConnection, JumpConnections

#: host outcomes after which the host serves a verified deployment (the new one, the same one,
#: or the last good one it was rolled back to) and may take requests again
SERVING_OUTCOMES = ("ok", "converged", "rolled-back", "regression")


@dataclass
class RunState:
    config: Config
    run: Run
    playbook: Playbook
    options: RunOptions
    progress: Progress
    jumps: JumpConnections
    cancelled: threading.Event
    stamp: str
    reports: dict[str, HostReport] = field(default_factory=dict)
    #: the router host's connection (opened by the first phase that needs it)
    router: Any = None
    #: per host: when it left and re-entered the router (monotonic seconds), for the report
    rotation: dict[str, dict[str, float]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class PhaseRecord:
    name: str
    status: str  # ok | failed | not-run
    detail: str = ""
    duration_s: float = 0.0
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.name, "status": self.status, "detail": self.detail,
                "duration_s": round(self.duration_s, 3), "exit_code": self.exit_code}


@dataclass(frozen=True)
class HostPhase:
    hosts: tuple[Host, ...]
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or "hosts " + ",".join(h.name for h in self.hosts)


@dataclass(frozen=True)
class RunPhase:
    name: str
    action: Callable[[RunState], str]
    #: runs even after an earlier phase failed (puts a rolled-back host back into the router)
    always: bool = False
    #: the commands ``action`` may send, as (host name, action) for ``plan`` (fleet/plan.py)
    plan: Callable[[Any], list[tuple[str, Any]]] | None = None


Phase = HostPhase | RunPhase


@dataclass
class RunResult:
    reports: list[HostReport]
    phases: list[PhaseRecord]
    error: DeployError | None = None
    rotation: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the canary's window (fleet/canary.py): its figures against the others', the decision and why
    canary: dict[str, Any] | None = None

    def exit_code(self) -> ExitCode:
        for report in self.reports:
            if report.error is not None:
                return ExitCode(report.error.exit_code)
        return ExitCode(self.error.exit_code) if self.error is not None else ExitCode.OK


#: first lines whose following lines are deployctl's own and belong on the progress line too: the
#: router's log tail (router_watch.py) and the fleet pre-flight's problems (rolling.py PreflightFailed).
#: Not a server's log tail ("Last 50 lines of ...:"): SGLang's, often a Python traceback
QUOTED_AFTER = ("its log ends:", "each keeps serving what it served:")


class Barrier:
    """Run-level phases as barriers: a phase runs ``work`` on each of its host sessions in parallel,
    and the next phase starts only when every one has finished; the first failing phase stops the
    ones after it (recorded as not-run). ``work(session)`` returns a DeployError (or raises one)
    to fail its host; ``blame``: that error also becomes the session's report error.

    The one barrier loop of the fleet: node groups (nodes.py) and their rollback use ``phase``;
    ``run_phases`` records its phases through ``ok`` and ``failed``.
    """

    def __init__(self, records: list[PhaseRecord], progress: Progress, parallel: int,
                 cancel: threading.Event | None = None, blame: bool = True):
        self.records, self.progress, self.parallel, self.cancel, self.blame = records, progress, parallel, cancel, blame
        self.error: DeployError | None = None

    def phase(self, sessions: Sequence[Any], name: str, work: Callable[[Any], DeployError | None]) -> bool:
        if self.error is not None:
            self.records.append(PhaseRecord(name, "not-run"))
            return False
        started = time.monotonic()
        self.progress("*", name, "start")
        by_name = {s.host.name: s for s in sessions}
        outcomes = for_each_host([s.host for s in sessions], lambda h: work(by_name[h.name]), self.parallel,
                                 cancel=self.cancel)
        failed = None
        for outcome in outcomes:
            problem = outcome.error or outcome.value
            if problem is not None:
                if self.blame:
                    session = by_name[outcome.host.name]
                    session.report.error = session.report.error or problem
                failed = failed or problem
        if failed is not None:
            self.failed(name, failed, started)
            return False
        self.ok(name, "", started, say=False)
        return True

    def ok(self, name: str, detail: str, started: float, say: bool = True) -> None:
        self.records.append(PhaseRecord(name, "ok", detail, time.monotonic() - started))
        if say:
            self.progress("*", name, f"ok: {detail}")

    def failed(self, name: str, error: DeployError, started: float, detail: str | None = None,
               said: str | None = None) -> None:
        """``detail``: the record's (the error's first line by default); ``said``: the progress line's."""
        self.error = self.error or error
        lines = str(error).splitlines() or [""]
        first = lines[0]
        self.records.append(PhaseRecord(name, "failed", first if detail is None else detail,
                                        time.monotonic() - started, int(error.exit_code)))
        # a message whose first line introduces the lines after it (the router's log tail, "its log
        # ends:", router_watch.py; the pre-flight's problems, "each keeps serving what it served:")
        # keeps them on the progress line too (the one line on stderr under --json: issue 37 found it
        # ending at the colon), joined and bounded. A host phase's failure says only where the run
        # stopped (``said``): a server's log tail stays in the report (SGLang's, often a traceback).
        quoted = lines[1:31] if first.rstrip().endswith(QUOTED_AFTER) else []
        shown = first[:300] + "".join(f" | {line[:300]}" for line in quoted)
        self.progress("*", name, f"FAILED: {shown[:4000]}" if said is None else f"FAILED: {said}")


def _host_phase(state: RunState, phase: HostPhase) -> DeployError | None:
    # hosts kept in the router must only converge (the playbook fails them before stop-stale otherwise)
    kept = frozenset(state.data.get("kept", ())) & {h.name for h in phase.hosts}
    options = dataclasses.replace(state.options, keep_serving=kept)
    try:
        outcomes = for_each_host(
            list(phase.hosts),
            lambda h: run_on_host(state.config, state.playbook, state.run, h, state.stamp,
                                  state.progress, state.cancelled, state.jumps, options),
            state.config.ssh.max_parallel, cancel=state.cancelled)
    except KeyboardInterrupt as interrupt:
        # Ctrl-C mid-batch: the hosts that finished keep their reports; one that did not may have been
        # stopped already, so it counts as not serving (the router must not get it back)
        finished = {o.host.name: o for o in getattr(interrupt, "outcomes", [])}
        for host in phase.hosts:
            outcome = finished.get(host.name)
            state.reports[host.name] = (outcome.value if outcome is not None and outcome.value is not None else
                                        HostReport(host, error=Interrupted(f"{host.name}: interrupted mid-redeploy")))
        raise
    first = None
    for outcome in outcomes:
        report = outcome.value if outcome.value is not None else HostReport(outcome.host, error=outcome.error)
        state.reports[outcome.host.name] = report
        if report.error is not None and first is None:
            first = report.error
    return first


def run_phases(state: RunState, hosts: Sequence[Host], phases: Sequence[Phase]) -> RunResult:
    records: list[PhaseRecord] = []
    try:
        return _run_phases(state, hosts, phases, records)
    except KeyboardInterrupt:
        # Ctrl-C: put back what the interrupted batch took out of the router and still serves (a host
        # whose drain was interrupted was never touched), then stop as asked; a second Ctrl-C ends it
        state.cancelled.set()
        done = len(records)
        for phase in phases[done:]:
            if isinstance(phase, RunPhase) and phase.always:
                try:
                    state.progress("*", phase.name, "Ctrl-C: putting back what this batch took out and still serves")
                    state.progress("*", phase.name, phase.action(state))
                except DeployError as exc:
                    state.progress("*", phase.name, f"FAILED: {str(exc).splitlines()[0][:300]}")
                break
        raise


def _run_phases(state: RunState, hosts: Sequence[Host], phases: Sequence[Phase],
                records: list[PhaseRecord]) -> RunResult:
    barrier = Barrier(records, state.progress, state.config.ssh.max_parallel, state.cancelled)
    for phase in phases:
        always = isinstance(phase, RunPhase) and phase.always and not state.cancelled.is_set()
        if (barrier.error is not None or state.cancelled.is_set()) and not always:
            records.append(PhaseRecord(phase.name, "not-run"))
            continue
        started = time.monotonic()
        state.progress("*", phase.name, "start")
        try:
            if isinstance(phase, HostPhase):
                failed = _host_phase(state, phase)
                if failed is not None:
                    barrier.error = failed
                    barrier.failed(phase.name, failed, started,
                                   said="the run stops here; later batches are untouched")
                    continue
                detail = "ok"
            else:
                detail = phase.action(state)
        except DeployError as exc:
            barrier.failed(phase.name, exc, started, detail=str(exc))
            continue
        barrier.ok(phase.name, detail, started)
    error = barrier.error
    reports = []
    for host in hosts:
        report = state.reports.get(host.name)
        if report is None:
            report = HostReport(host, steps=[StepRecord(s.name, "not-run") for s in state.playbook.steps])
            report.warnings.append("not redeployed: the run stopped before this host's batch (it was left as it was)")
        reports.append(report)
    return RunResult(reports, records, error if not any(r.error for r in reports) else None, state.rotation,
                     state.data.get("canary"))


@dataclass
class DownResult:
    """``down`` behind a router (fleet/rolling.py run_down): the hosts' reports, what became of the router."""

    reports: list[HostReport]
    router: dict[str, Any]
    error: DeployError | None = None

    def exit_code(self) -> ExitCode:
        for report in self.reports:
            if report.error is not None:
                return ExitCode(report.error.exit_code)
        return ExitCode(self.error.exit_code) if self.error is not None else ExitCode.OK


def open_router(state: RunState) -> Any:
    """The router host's connection and client, opened once per run."""
    from deploy.fleet.router import RouterHost

    if state.router is None:
        spec = state.run.router
        assert spec is not None
        host = state.config.host(spec.host)
        conn = HostConnection(host, state.config.ssh, state.jumps)
        conn.connect()
        host = network_host(host, conn.endpoint.hostname.value)
        state.data["router_conn"] = conn
        state.router = RouterHost(conn, host, state.run, lambda m: state.progress(spec.host, "router", m))
    return state.router


def close_router(state: RunState) -> None:
    conn = state.data.pop("router_conn", None)
    if conn is not None:
        conn.close()


@dataclass
class TakenLock:
    """A host lock taken on a connection of its own, held until ``release``."""

    conn: Any
    held: Any
    warning: str | None = None

    def release(self) -> None:
        try:
            self.held.close()
        finally:
            self.conn.close()


@contextmanager
def hold_host_locks(config, hosts: Sequence[Host], owner: dict, progress, jumps=None) -> Iterator[dict[str, TakenLock]]:
    """Every host's lock, all or nothing, before a run changes anything (issue 37: `down --host` behind
    a router took the replica out of the router, then failed to get its lock, exit 9). Each lock is
    taken on a connection of its own (the host-side helper holds it while that channel is open) and
    released when the block ends; the first refusal (LockHeld, exit 9; unreachable, exit 4) releases
    the ones already taken and is raised: nothing was changed anywhere."""
    from deploy.engine.locks import acquire_host_lock

    def take(host: Host) -> TakenLock:
        conn = HostConnection(host, config.ssh, jumps)
        try:
            conn.connect()
            held, warning = acquire_host_lock(conn, network_host(host, conn.endpoint.hostname.value), owner)
        except BaseException:
            conn.close()
            raise
        progress(host.name, "lock", "held" + (f" (WARNING: {warning})" if warning else ""))
        return TakenLock(conn, held, warning)

    outcomes = for_each_host(list(hosts), take, config.ssh.max_parallel)
    taken = {o.host.name: o.value for o in outcomes if o.value is not None}
    try:
        refused = next((o.error for o in outcomes if o.error is not None), None)
        if refused is not None:
            raise refused
        yield taken
    finally:
        for lock in taken.values():
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - a lock whose connection already dropped is released anyway
                pass

