"""The host session: one host's connection, host lock and step memory, and what it does with them.

Per host, for verbs that change it: take the host lock (held for the whole run, rollback
included), run the steps (``converge`` may mark the server "already running as desired": the
steps that stop, free or launch are then skipped), and when a step after ``stop-stale`` fails,
relaunch the host's last good deployment, wait until ready and verify it (exit 11), or say
plainly that the host serves nothing. A failure while a server PID is known is checked: a dead
server is reported as "server died" with its log tail, whichever step noticed. A failed host's
report says what it left running.

``HostSession`` is that session as an object the run-level phases keep across their barriers
(deploy/fleet/: rolling batches, node groups); ``run_on_host`` is the whole playbook on one host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deploy.config.models import Config, Host, Run
from deploy.engine.records import HostReport, Progress, RolledBack, RunOptions, StepRecord
from deploy.base.errors import ConnectionFailed, DeployError, ExitCode, LockHeld, Regression, ServerDied
from deploy.facts.server import (ServerState, last_good_path, parse_record, parse_server_state, read_record_command,
                                 same_deployment, server_state_command)
from deploy.host.state_layout import StatePaths
from deploy.ssh.transport import HostConnection, JumpConnections

if TYPE_CHECKING:  # the playbook and its steps load when a playbook runs: gpu-status, logs and doctor never need them
    from deploy.engine.playbook import Playbook, PlannedStep
    from deploy.steps.base import Command, StepContext
    from deploy.steps.memory import StepMemory
    from deploy.steps.failure_cause import Cause

#: what a rollback runs, with the playbook's settings for each step where it has them
ROLLBACK_STEPS = ("stop-stale", "free-gpus", "wait-gpus-free", "launch", "wait-ready", "verify-acceptance")


def step_context(host: Host, run: Run, settings, conn, stamp: str, progress, memory: StepMemory | None = None,
                 cancelled: threading.Event | None = None, step: str = "") -> StepContext:
    from deploy.steps.base import StepContext
    from deploy.steps.memory import StepMemory

    memory = StepMemory() if memory is None else memory
    # the journal lives in the host's memory: every step (and a rollback's) appends to one list
    return StepContext(host=host, run=run, settings=settings, conn=conn,
                       launch_stamp=stamp, progress=progress, memory=memory,
                       cancelled=cancelled or threading.Event(), journal=memory.journal, step=step)


def network_host(host: Host, address: str) -> Host:
    """The host as its steps see it: ``address`` is where it is on the network.

    The YAML address may be an ssh_config alias (``gpu-a``) that only ssh understands; SGLang's
    default bind address (a run without serve_host) must be the HostName it resolves to.
    """
    return host if address == host.address else host.model_copy(update={"address": address})


def run_steps(steps: Sequence[PlannedStep], host: Host, run: Run, conn, stamp: str,
               progress: Progress, memory: StepMemory, cancelled: threading.Event, label: str = "") -> tuple[list[StepRecord], DeployError | None, int]:
    """Run steps in order; returns (records, first error, index of the failing step or -1)."""
    records: list[StepRecord] = []
    error: DeployError | None = None
    failed_at = -1
    stop = False
    for index, step in enumerate(steps):
        if stop or cancelled.is_set():
            records.append(StepRecord(step.name, "not-run"))
            continue
        held = memory.host_lock
        if held is not None and not held.running:
            # The connection dropped and was re-opened between commands: the host-side helper saw
            # EOF and the lock is gone, so another run may be changing this host now.
            lost = LockHeld(f"{host.name}: lost the host lock (the SSH connection holding it dropped); "
                            "stopped before the next step")
            if error is None:
                error, failed_at = lost, index
            stop = True
            records.append(StepRecord(step.name, "failed", detail=str(lost), exit_code=int(lost.exit_code)))
            continue
        if not step.settings.enabled:
            records.append(StepRecord(step.name, "disabled"))
            continue
        if memory.converged and getattr(step.module, "CONVERGE_SKIPS", False):
            records.append(StepRecord(step.name, "skipped", detail="already running as desired"))
            continue
        if memory.swapped and getattr(step.module, "CONVERGE_SKIPS", False):
            # swap-drafter put the new drafter into the running server and verified it (issue 29)
            records.append(StepRecord(step.name, "skipped", detail="drafter swapped into the running server"))
            continue
        name = f"{label}{step.name}"
        record = StepRecord(step.name, "failed")
        started = time.monotonic()
        for attempt in range(1, step.settings.retries + 2):
            record.attempts = attempt
            ctx = step_context(host, run, step.settings, conn, stamp,
                           lambda m, s=name: progress(host.name, s, m), memory, cancelled, step=name)
            progress(host.name, name, "start" if attempt == 1 else f"retry {attempt - 1}")
            try:
                outcome = step.module.run(ctx)
            except DeployError as exc:
                record.detail = str(exc)
                record.exit_code = int(exc.exit_code)
                if attempt <= step.settings.retries and not cancelled.is_set():
                    progress(host.name, name, f"failed, retrying: {str(exc).splitlines()[0][:200]}")
                    continue
                if error is None:
                    error, failed_at = exc, index
                stop = step.settings.on_failure == "stop"
                progress(host.name, name, f"FAILED: {str(exc).splitlines()[0][:300]}")
                break
            record.status, record.detail, record.data = outcome.status, outcome.detail, outcome.data
            progress(host.name, name, f"{outcome.status}: {outcome.detail}")
            break
        record.duration_s = time.monotonic() - started
        records.append(record)
    return records, error, failed_at


def server_state_action(host: Host, run: Run) -> Command:
    """The server-state read (PID file, process, deployment record, /health) after a failure."""
    from deploy.steps.base import Command
    from deploy.steps.wait_ready import health_url

    ctx = step_context(host, run, None, None, "", lambda m: None)
    paths = StatePaths(host.state_dir)
    return Command(description="what the host runs now (PID file, process, deployment record, /health)",
                   when="a step failed: the report says what the host was left running",
                   command=server_state_command(host.python, paths.helper("host_ops.py"), paths.root, health_url(ctx)),
                   timeout_s=30, what="server-state")


def server_state(conn, host: Host, run: Run) -> ServerState:
    action = server_state_action(host, run)
    output = conn.check(action.command, timeout=action.timeout_s, what=action.what or "server-state").stdout
    return parse_server_state(output, host.name)


def died(conn, host: Host, run: Run, memory: StepMemory, error: DeployError, step: str) -> DeployError:
    """A failure while a server PID is known: if that server is gone, say so with its log tail."""
    from deploy.steps.wait_ready import died_message, tail_command

    pid = memory.pid
    if isinstance(error, (ServerDied, LockHeld)) or pid is None:
        return error
    try:
        state = server_state(conn, host, run)
    except DeployError:
        return error
    if state.alive and state.pid == pid:
        return error
    log = memory.log or ""
    tail = conn.run(tail_command(log)).stdout.rstrip() if log else ""
    ctx = step_context(host, run, None, conn, "", lambda m: None, memory)
    return ServerDied(died_message(ctx, pid, log, tail, f"(noticed by {step}; it had reported: "
                                   f"{str(error).splitlines()[0][:200]})"))


def rollback_steps(playbook: Playbook) -> list[PlannedStep]:
    from deploy.engine.playbook import PlannedStep
    from deploy.steps import REGISTRY

    steps = []
    for name in ROLLBACK_STEPS:
        mine = next((s for s in playbook.steps if s.name == name), None)
        if mine is None:
            steps.append(PlannedStep(name, REGISTRY[name].Settings(step=name)))
        elif mine.settings.enabled:
            steps.append(mine)
    return steps


def should_roll_back(playbook: Playbook, records: list[StepRecord], failed_at: int, error: DeployError,
                      options: RunOptions, cancelled: threading.Event) -> bool:
    if not options.rollback or cancelled.is_set() or isinstance(error, LockHeld) or failed_at < 0:
        return False
    from deploy.steps.failure_cause import deployment_stays, failure_cause

    if deployment_stays(failure_cause(playbook.steps[failed_at].name, error), records[:failed_at]):
        return False  # a benchmark harness (or host) failure after this run verified its deployment: it stays
    names = [s.name for s in playbook.steps]
    if "stop-stale" not in names:
        return False
    stop_index = names.index("stop-stale")
    if failed_at <= stop_index:
        return False
    # a regression of the server converge kept is the gate's verdict on it: replacing it with the
    # last good deployment is the documented remedy (exit 12, "rolled back")
    return run_changed_server(playbook, records) or (isinstance(error, Regression) and
                                                     records[stop_index].status in ("ok", "skipped"))


def run_changed_server(playbook: Playbook, records: list[StepRecord]) -> bool:
    """Whether this run stopped, freed or (re)launched anything: only then does a later failure roll back.

    A step that fails before the stop (a dataset upload or its check, the benchmark client, after
    converge found the server running as desired) touched nothing: rolling back stopped that
    untouched server and relaunched it (downtime, exit 11) before reporting it "unchanged" (issue 31).
    """
    for step, record in zip(playbook.steps, records):
        if step.name == "stop-stale" and record.status == "ok" and record.data.get("processes"):
            return True
        if step.name == "free-gpus" and record.status == "ok" and record.data.get("killed"):
            return True
        if step.name == "launch" and record.status in ("ok", "failed"):
            return True
    return False


def roll_back(report: HostReport, playbook: Playbook, run: Run, conn, stamp: str,
               progress: Progress, memory: StepMemory, cancelled: threading.Event) -> None:
    host = report.host
    error = report.error
    assert error is not None
    path = last_good_path(host.state_dir)
    snapshot = memory.snapshot
    try:
        # as doctor read it under the host lock in this run (nothing but record-good, the last step, writes it)
        good = snapshot.last_good if snapshot is not None else \
            parse_record(conn.run(read_record_command(path)).stdout, host.name, path)
    except DeployError as exc:
        report.warnings.append(f"rollback impossible: {exc}")
        return
    if good is None:
        report.warnings.append("no last good deployment is recorded on this host: nothing to roll back to")
        progress(host.name, "rollback", "no last good deployment recorded: nothing to roll back to")
        return
    if isinstance(error, Regression) and same_deployment(good, memory.deployment):
        report.warnings.append("the regressing deployment is the last good one: nothing else to roll back to")
        return
    progress(host.name, "rollback", f"relaunching the last good deployment ({good.drafter_path})")
    rb_memory = memory.rollback_of(good)
    records, rb_error, _ = run_steps(rollback_steps(playbook), host, run, conn, stamp, progress,
                                      rb_memory, cancelled, label="rollback/")
    report.rollback = records
    if isinstance(rb_memory.pid, int):
        memory.rollback_pid = rb_memory.pid  # the headline: launched by this run's rollback
    report.cause = error
    first = str(error).splitlines()[0]
    if rb_error is None:
        memory.restored = rb_memory.deployment
        restored = f"previous deployment restored and verified ({good.drafter_path}, pid {rb_memory.pid})"
        if isinstance(error, Regression):
            report.error = Regression(f"{error}\n-> rolled back: {restored}")
        else:
            report.error = RolledBack(f"failed: {first}\n-> {restored}")
        progress(host.name, "rollback", restored)
    elif isinstance(error, ConnectionFailed):
        # issue 39: the connection was lost mid-step; the rollback over it cannot work either (the host lock
        # went with the connection). Exit 4 whatever the rollback could not do, not 1.
        report.error = ConnectionFailed(
            f"the connection to {host.name} was lost: {first}\n-> no rollback to the last good deployment "
            f"({good.drafter_path}) was possible: {str(rb_error).splitlines()[0]}")
        memory.rollback_failed = True
        progress(host.name, "rollback", "FAILED: the connection was lost")
    else:
        report.error = DeployError(
            f"failed: {first}\n-> the rollback to the last good deployment ({good.drafter_path}) failed too: "
            f"{str(rb_error).splitlines()[0]}", exit_code=ExitCode.FAILED)
        # what the host serves now is read after the run (HostSession.close), not assumed: a server
        # still loading after a network freeze is not "nothing"
        memory.rollback_failed = True
        progress(host.name, "rollback", "FAILED: the rollback did not restore a verified deployment")


def kept_deployment_error(error: DeployError, cause: Cause, memory: StepMemory) -> DeployError:
    """A failure that is not the checkpoint's after this run verified its deployment: said as such, the
    deployment stays (no rollback, nothing quarantined); the exit code is the failure's own."""
    from deploy.steps.failure_cause import Cause

    first = str(error).splitlines()[0]
    what = "benchmark harness failed" if cause is Cause.HARNESS else "failed after verification"
    return type(error)(f"{what} ({cause.describe()}): {first}\n-> the deployment stays: verified in this run "
                       f"(pid {memory.pid}); not rolled back, nothing quarantined", exit_code=error.exit_code)


def collect_facts(report: HostReport, memory: StepMemory, run: Run) -> None:
    deployment = memory.deployment
    bench = memory.bench
    report.facts = {
        "sglang_version": memory.sglang_version or (deployment.sglang_version if deployment else None),
        "drafter_fingerprint": memory.drafter_fingerprint or (deployment.drafter_fingerprint if deployment else None),
        "draft_tokens": run.draft_tokens,
        "accept_length": None if memory.verify is None else memory.verify.accept_length,
        "output_tok_s": None if bench is None else bench.output_tok_s,
        # which prompts the numbers were measured on (BENCH, issue 20): history rows name them
        "dataset": None if bench is None else bench.dataset,
        "dataset_sha256": None if bench is None else bench.dataset_sha256,
        "converged": memory.converged,
        # the throughput gate's verdict with its figures and rule (deploy/local/throughput_gate.py), when it judged
        "throughput_gate": None if memory.gate is None else memory.gate.summary(),
        # swapped into the running server or reloaded, and why / what was verified (swap-drafter)
        "drafter_update": None if memory.drafter_update is None else memory.drafter_update.document(),
    }


class HostSession:
    """One host's connection, host lock and step memory, kept across a run's phases.

    ``open`` connects (the host's address becomes its ssh_config HostName) and takes the host lock
    when the options say so; ``steps`` runs planned steps into the report (a failure while a server
    PID is known is checked for a dead server); ``close`` says what a failed host left running,
    releases the lock and closes the connection.
    """

    def __init__(self, config: Config, host: Host, run: Run, *, jumps: JumpConnections | None,
                 options: RunOptions, progress: Progress, cancelled: threading.Event, stamp: str):
        self.config, self.host, self.run = config, host, run
        self.jumps, self.options, self.progress, self.cancelled = jumps, options, progress, cancelled
        self.stamp = stamp
        self.report = HostReport(host)
        from deploy.steps.memory import StepMemory

        self.memory = StepMemory(force=options.force, must_converge=host.name in options.keep_serving)
        self.conn: HostConnection | None = None
        self.held: Any = None
        self.started = time.monotonic()

    def connect(self) -> None:
        self.conn = HostConnection(self.host, self.config.ssh, self.jumps)
        # a signal stops the command running at that moment (its channel closed), not at its end
        self.conn.cancelled = self.cancelled
        self.conn.connect()
        self.host = network_host(self.host, self.conn.endpoint.hostname.value)
        self.report.host = self.host

    def lock(self) -> None:
        from deploy.engine.locks import acquire_host_lock

        if not self.options.lock:
            return
        assert self.conn is not None
        taken = self.options.held_locks.get(self.host.name)
        if taken is not None:  # the run holds it since before its first change, and releases it
            self.memory.host_lock = taken.held
            if taken.warning:
                self.report.warnings.append(taken.warning)
            self.progress(self.host.name, "lock", "held (taken by the run before its first change)")
            return
        self.held, warning = acquire_host_lock(self.conn, self.host, self.options.owner or {})
        if warning:
            self.report.warnings.append(warning)
            self.progress(self.host.name, "lock", f"WARNING: {warning}")
        self.progress(self.host.name, "lock", "held")
        self.memory.host_lock = self.held

    def open(self) -> None:
        """Connect, then take the host lock (when the options say so)."""
        self.connect()
        self.lock()

    def run_steps(self, steps: Sequence[PlannedStep], memory: StepMemory | None = None, label: str = "",
                  cancelled: threading.Event | None = None) -> tuple[list[StepRecord], DeployError | None, int]:
        """``run_steps`` on this host; ``memory``: another step memory (a rollback's), not the session's."""
        assert self.conn is not None
        return run_steps(steps, self.host, self.run, self.conn, self.stamp, self.progress,
                         self.memory if memory is None else memory,
                         self.cancelled if cancelled is None else cancelled, label=label)

    def steps(self, steps: Sequence[PlannedStep]) -> DeployError | None:
        """Run steps into the report; a failure is checked for a dead server and becomes the report's error."""
        records, error, failed_at = self.run_steps(steps)
        self.report.steps.extend(records)
        if error is not None:
            error = self.died(error, steps[failed_at].name)
            records[failed_at].detail, records[failed_at].exit_code = str(error), int(error.exit_code)
            self.report.error = self.report.error or error
        return error

    def skip(self, steps: Sequence[PlannedStep], why: str) -> None:
        self.report.steps.extend(StepRecord(s.name, "skipped", detail=why) for s in steps)

    def server_state(self) -> ServerState:
        assert self.conn is not None
        return server_state(self.conn, self.host, self.run)

    def died(self, error: DeployError, step: str, memory: StepMemory | None = None) -> DeployError:
        assert self.conn is not None
        return died(self.conn, self.host, self.run, self.memory if memory is None else memory, error, step)

    def roll_back(self, playbook: Playbook) -> None:
        """Relaunch the host's last good deployment (the report's error becomes the outcome)."""
        roll_back(self.report, playbook, self.run, self.conn, self.stamp, self.progress, self.memory, self.cancelled)

    def close(self, describe: bool = True) -> None:
        """A failed host's report says what it left running (``describe``) and every report what the
        host serves (deploy/engine/serving.py); the lock is released, the connection closed."""
        from deploy.engine.outcome import after_interruption, serving_of

        if self.cancelled.is_set() and self.report.serving is None:
            # a signal: say what this run knows it left (stopped, launched, verified) without another command
            # on the host; only a cut inside stop-stale or launch needs the host's answer
            left = after_interruption(self.report, self.memory)
            if left is not None:
                self.report.left_running, self.report.serving = left
                describe = False
        if self.conn is not None:
            state, state_error = None, None
            if describe and self.report.error is not None:
                try:
                    state = self.server_state()
                    self.report.left_running = state.describe()
                except DeployError as exc:
                    state_error = str(exc).splitlines()[0][:300]
                    self.report.left_running = f"unknown: {exc}"
            if describe:
                self.report.serving = serving_of(self.report, self.memory, self.options, state, state_error)
                lost = isinstance(self.report.cause or self.report.error, ConnectionFailed)
                if lost and state is None:
                    # the host cannot be read over the lost connection: say what this run knows it did
                    known = after_interruption(self.report, self.memory, lost=True)
                    if known is not None:
                        self.report.left_running, self.report.serving = known
                if self.memory.rollback_failed and self.report.error is not None:
                    self.report.error = DeployError(
                        f"{self.report.error}\n{self.report.serving.headline()}",
                        exit_code=ExitCode.CONNECTION if lost else ExitCode.FAILED)
            if self.held is not None:
                self.held.close()
            self.conn.close()
        self.report.duration_s = time.monotonic() - self.started


def lock_refused_why(exc: DeployError) -> str:
    """The serving line of a host whose lock was not taken: only a held lock means another deployctl."""
    if isinstance(exc, LockHeld):
        return "another deployctl may be changing the host"
    if exc.exit_code == ExitCode.IO:
        return "the host lock could not be written; nothing was changed"
    return "the host lock could not be taken; nothing was changed"


def run_on_host(config: Config, playbook: Playbook, run: Run, host: Host, stamp: str,
                progress: Progress, cancelled: threading.Event, jumps: JumpConnections | None,
                options: RunOptions | None = None) -> HostReport:
    """The whole playbook on one host: connect, lock, steps, rollback, what it left running."""
    options = options or RunOptions()
    session = HostSession(config, host, run, jumps=jumps, options=options, progress=progress,
                          cancelled=cancelled, stamp=stamp)
    report = session.report
    from deploy.engine.outcome import unreached, update_quarantine

    try:
        session.connect()
    except DeployError as exc:
        report.error = exc
        report.steps = [StepRecord(s.name, "not-run") for s in playbook.steps]
        report.serving = unreached(exc, "the host was not reached")
        return report
    finished = False
    try:
        try:
            session.lock()
        except DeployError as exc:
            report.error = exc
            report.steps = [StepRecord(s.name, "not-run") for s in playbook.steps]
            report.serving = unreached(exc, lock_refused_why(exc))
            progress(session.host.name, "lock", f"FAILED: {exc}")
            return report
        records, error, failed_at = session.run_steps(playbook.steps)
        report.steps = records
        collect_facts(report, session.memory, run)
        if error is not None and not cancelled.is_set():
            error = session.died(error, playbook.steps[failed_at].name)
            records[failed_at].detail = str(error)
            records[failed_at].exit_code = int(error.exit_code)
        report.error = error
        from deploy.steps.failure_cause import Cause, deployment_stays, failure_cause

        if error is not None:
            report.failure_cause = failure_cause(playbook.steps[failed_at].name, error).value
        if error is not None and should_roll_back(playbook, records, failed_at, error, options, cancelled):
            session.roll_back(playbook)
        elif error is not None and deployment_stays(Cause(report.failure_cause), records[:failed_at]):
            report.error = kept_deployment_error(error, Cause(report.failure_cause), session.memory)
        if not cancelled.is_set():
            assert session.conn is not None
            update_quarantine(report, options, playbook.steps[failed_at].name if failed_at >= 0 else "",
                              session.conn, run, session.memory, progress)
        finished = True
    finally:
        # interrupted (Ctrl-C): no more commands; the caller says what each host was left running
        session.close(describe=finished)
    return report
