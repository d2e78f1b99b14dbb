"""Run-level phases: steps that run once per run and see every host of it, between host phases.

A run is a list of phases executed in order with a barrier between them:

- ``HostPhase(hosts)``: the playbook on those hosts, in parallel (the per-host steps, each host
  under its host lock, with converge and rollback as in a plain run);
- ``RunPhase(name, body)``: one builder over the whole run (every host's report so far, the
  router host's connection, the run's typed ``FleetMemory``), e.g. take a batch out of the router,
  drain it, put it back. ``plan`` walks the same body with a ``PlanContext`` (no connection: every
  command it may send, each with its condition, and every decision); the run with a ``RunContext``.
  So the plan and the run cannot disagree about what a phase sends: there is one body to read.

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
from deploy.host.records import CanaryMark, CanaryWindow, LastGood
from deploy.facts.router import DownRouter, EndToEnd, RouterState
from deploy.ssh.transport import HostConnection, JumpConnections

#: host outcomes after which the host serves a verified deployment (the new one, the same one,
#: or the last good one it was rolled back to) and may take requests again
SERVING_OUTCOMES = ("ok", "converged", "rolled-back", "regression")


@dataclass
class Rotation:
    """One replica's time out of the router's rotation, for the report (monotonic seconds)."""

    #: when the router stopped sending it new requests (router.remove's answer)
    out: float | None = None
    #: when it was listed healthy again (router-add, a router restart, the canary going back)
    back: float | None = None
    #: when the pre-drain probe found it unchanged: it never left the router
    kept: float | None = None

    def still_out(self) -> bool:
        return self.out is not None and (self.back is None or self.back < self.out)


@dataclass(slots=True)
class FleetMemory:
    """What one run-level phase hands to a later one (slots: a misspelt name fails at once)."""

    #: host name -> its ssh_config HostName, read once per run (no connection): where the router reaches it
    addresses: dict[str, str | None] | None = None
    #: the router host's connection (open_router), closed at the end of the run
    router_conn: Any = None
    #: hosts the pre-drain probe found unchanged: they stay in the router and only converge
    kept: set[str] = field(default_factory=set)
    #: the batch's router-remove found the router running (its drain has something to wait for)
    router_running: bool = False
    #: the PID of the router this run has seen (or started); None: not running yet
    router_pid: int | None = None
    #: a phase saw that router die: the next phase that puts a batch back starts it again
    router_died: bool = False
    #: the end-to-end request's answer
    end_to_end: EndToEnd | None = None
    #: the canary's window: its figures against the others', the decision and why (fleet/canary.py)
    canary: CanaryWindow | None = None
    #: host name -> the last good record the canary would go back to
    canary_last_good: dict[str, LastGood] = field(default_factory=dict)
    #: host name -> the canary mark written on it
    canary_marks: dict[str, CanaryMark] = field(default_factory=dict)


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
    #: per host: when it left and re-entered the router, for the report
    rotation: dict[str, Rotation] = field(default_factory=dict)
    memory: FleetMemory = field(default_factory=FleetMemory)


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
    """A run-level phase, defined once: ``body(ctx)`` is its one builder. The run walks it with a
    ``RunContext`` (facts known: it sends exactly the commands it needs and takes each decision);
    ``plan`` walks the same body with a ``PlanContext`` (facts unknown: every command it may send,
    each with the condition it is sent under, and every decision it may take). pyinfra's shape: one
    generator of commands that the dry run and the run both iterate."""

    name: str
    body: Callable[[Any], str]
    #: runs even after an earlier phase failed (puts a rolled-back host back into the router)
    always: bool = False

    def action(self, state: RunState) -> str:
        return self.body(RunContext(state))


Phase = HostPhase | RunPhase


@dataclass
class RunResult:
    reports: list[HostReport]
    phases: list[PhaseRecord]
    error: DeployError | None = None
    rotation: dict[str, Rotation] = field(default_factory=dict)
    #: the canary's window (fleet/canary.py): its figures against the others', the decision and why
    canary: CanaryWindow | None = None

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
    kept = frozenset(state.memory.kept) & {h.name for h in phase.hosts}
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
                     state.memory.canary)


@dataclass
class DownResult:
    """``down`` behind a router (fleet/rolling.py run_down): the hosts' reports, what became of the router."""

    reports: list[HostReport]
    router: DownRouter
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
        state.memory.router_conn = conn
        state.router = RouterHost(conn, host, state.run, lambda m: state.progress(spec.host, "router", m))
    return state.router


def close_router(state: RunState) -> None:
    conn, state.memory.router_conn = state.memory.router_conn, None
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



# -- the two walks of a phase's builder ------------------------------------------------------------


def network(state: RunState, host: Host) -> Host:
    """``host`` as the network sees it (an ssh_config alias resolved to its HostName, read from
    ssh_config once per run, no connection): its worker URL is where the router reaches it."""
    if state.memory.addresses is None:
        from deploy.engine.plan import describe_endpoints

        endpoints = describe_endpoints(state.config.hosts_of(state.run), state.config)
        state.memory.addresses = {name: e.get("hostname", {}).get("value") for name, e in endpoints.items()}
    return network_host(host, state.memory.addresses.get(host.name) or host.address)


def rotation_of(ctx: Any, host: Host) -> Rotation:
    return ctx.rotation.setdefault(host.name, Rotation())


def left_at(ctx: Any, host: Host) -> float | None:
    """When ``host`` was taken out of the router in this run (None: it was not)."""
    marks = ctx.rotation.get(host.name)
    return marks.out if marks is not None else None


class RunContext:
    """A phase's builder walked by the run: the router host's connection, the run's memory; each
    command is sent and each decision taken on what the hosts answer."""

    planning = False

    def __init__(self, state: RunState):
        self.state = state
        self.config, self.run, self.stamp = state.config, state.run, state.stamp
        self.memory, self.reports, self.rotation = state.memory, state.reports, state.rotation

    @property
    def router(self) -> Any:
        return open_router(self.state)

    @property
    def force(self) -> bool:
        return bool(self.state.options.force)

    def network(self, host: Host) -> Host:
        return network(self.state, host)

    def url(self, host: Host) -> str:
        from deploy.fleet.router import worker_url

        return worker_url(self.run, self.network(host))

    def serving(self, hosts: Sequence[Host]) -> list[Host]:
        """The hosts this run redeployed that serve a verified deployment."""
        return [h for h in hosts if h.name in self.reports and self.reports[h.name].outcome in SERVING_OUTCOMES]

    def only_when(self, condition: bool, when: str) -> Iterator[None]:
        """``for _ in ctx.only_when(condition, why):`` the block runs when ``condition`` holds (the plan
        lists its commands with ``why``). Its block never returns: the plan walks past it."""
        if condition:
            yield None

    def stops(self, condition: bool, why: str, otherwise: str | None = None) -> bool:
        """The phase ends here when ``condition`` holds (the plan lists the decision and walks on,
        each later command with ``otherwise``)."""
        return condition

    def refuse(self, refusal: Callable[[], DeployError | None], why: str) -> None:
        """Raise ``refusal()``'s error, if any: the run asks it on the facts it read (the plan lists it)."""
        error = refusal()
        if error is not None:
            raise error

    def on_hosts(self, hosts: Sequence[Host], work: Callable[[Host], Any],
                 planned: Callable[[Host], Sequence[Any]], cancel: bool = False) -> list[Any]:
        """``work`` on each host in parallel (its own connection); ``planned(host)``: what it sends there."""
        return for_each_host(list(hosts), work, self.config.ssh.max_parallel,
                             cancel=self.state.cancelled if cancel else None)

    def on_host(self, host: Host, work: Callable[[Host], Any], planned: Callable[[Host], Sequence[Any]]) -> Any:
        return work(host)

    def router_checks(self) -> list[Any]:
        from deploy.fleet.doctor import router_checks

        router = self.router
        return router_checks(router.conn, router.host, self.run)

    def watch(self, when: str) -> RouterState | None:
        from deploy.fleet.router_watch import watch

        return watch(self.state, self.router, when)

    def router_lost(self, when: str) -> str | None:
        """router_watch.lost_or_restarted over the run's replicas, at their worker URLs."""
        from deploy.fleet.router_watch import lost_or_restarted

        return lost_or_restarted(self.state, self.router, when, self.config.hosts_of(self.run), self.url,
                                 lambda h: bool(self.serving([h])) or h.name not in self.reports)

    def started(self, pid: int) -> None:
        from deploy.fleet.router_watch import started

        started(self.state, pid)

    def say(self, host: str, step: str, message: str) -> None:
        self.state.progress(host, step, message)


class PlanContext:
    """A phase's builder walked by ``plan``: no connection. Every command the run may send is listed
    with the conditions it is sent under (``only_when``, ``stops``' ``otherwise``) and every decision
    the run may take (``stops``, ``refuse``). The router answers as the plan assumes (running, listing
    every replica the walk has not taken out: fleet/router_plan.py), and the memory and rotation
    evolve as the run's would, so later phases see what earlier ones left (a removed worker's drain)."""

    planning = True
    force = False

    def __init__(self, view: Any):
        from deploy.fleet.router_plan import PlannedRouter

        self.view = view
        self.config, self.run, self.stamp = view.config, view.run, view.stamp
        self.memory = FleetMemory()
        self.reports: dict[str, HostReport] = {}
        self.rotation: dict[str, Rotation] = {}
        self.rows: list[tuple[str, Any]] = []
        self.decisions: list[str] = []
        self.conditions: list[str] = []
        self.urls: dict[str, str] = {}
        self.router: Any = PlannedRouter(self) if view.calls is not None else None

    def walk(self, phase: RunPhase) -> tuple[list[tuple[str, Any]], list[str]]:
        """(host name, command) rows and decisions of ``phase``, in the order its body takes them."""
        self.rows, self.decisions, self.conditions = [], [], []
        if self.router is not None:
            self.router.package_read = False  # the run's first router call may come in any phase
        phase.body(self)
        return self.rows, self.decisions

    def send(self, host: str, action: Any, when: str | None = None) -> None:
        parts = [*self.conditions, *([when or action.when] if when or action.when else [])]
        self.rows.append((host, dataclasses.replace(action, when="; ".join(parts)) if parts else action))

    def network(self, host: Host) -> Host:
        return self.view.network(host)

    def url(self, host: Host) -> str:
        from deploy.fleet.router import worker_url

        # once per host: a roll's plan asks each replica's URL in every batch (issue 37: plan's CPU per host)
        url = self.urls.get(host.name)
        if url is None:
            url = self.urls[host.name] = worker_url(self.run, self.network(host))
        return url

    def serving(self, hosts: Sequence[Host]) -> list[Host]:
        return list(hosts)  # the plan assumes each host's playbook succeeds (plan_failure lists the rest)

    def only_when(self, condition: bool, when: str) -> Iterator[None]:
        self.conditions.append(when)
        try:
            yield None
        finally:
            self.conditions.remove(when)

    def stops(self, condition: bool, why: str, otherwise: str | None = None) -> bool:
        self.decisions.append(f"ends here when {why}")
        if otherwise:
            self.conditions.append(otherwise)
        return False

    def refuse(self, refusal: Callable[[], DeployError | None], why: str) -> None:
        self.decisions.append(f"refuses when {why}")

    def on_hosts(self, hosts: Sequence[Host], work: Callable[[Host], Any],
                 planned: Callable[[Host], Sequence[Any]], cancel: bool = False) -> list[Any]:
        for host in hosts:
            for action in planned(host):
                self.send(host.name, action)
        return []

    def on_host(self, host: Host, work: Callable[[Host], Any], planned: Callable[[Host], Sequence[Any]]) -> Any:
        self.on_hosts([host], work, planned)
        return None

    def router_checks(self) -> list[Any]:
        return self.router.checks()

    def watch(self, when: str) -> RouterState | None:
        return self.router.watch(when)

    def router_lost(self, when: str) -> str | None:
        self.router.lost_or_restarted(when, [self.url(h) for h in self.config.hosts_of(self.run)])
        return None

    def started(self, pid: int) -> None:
        # the leaving workers stay: the walk goes on into the branch where the router was running
        self.memory.router_pid, self.memory.router_died = pid, False

    def say(self, host: str, step: str, message: str) -> None:
        pass
