"""Run (or plan) a playbook on a run's hosts: one connection per host, hosts in parallel.

Per host, for verbs that change it: take the host lock (held for the whole run, rollback
included), run the steps (``converge`` may mark the server "already running as desired": the
steps that stop, free or launch are then skipped), and when a step after ``stop-stale`` fails,
relaunch the host's last good deployment, wait until ready and verify it (exit 11), or say
plainly that the host serves nothing. A failure while a server PID is known is checked: a dead
server is reported as "server died" with its log tail, whichever step noticed. A failed host's
report says what it left running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from deploy.config.models import Config, Host, Run
from deploy.errors import DeployError, ExitCode, LockHeld, Regression, ServerDied
from deploy.facts.server import (last_good_path, parse_record, parse_server_state, read_record_command,
                                 same_deployment, server_state_command)
from deploy.fanout import exit_code, for_each_host
from deploy.transport import HostConnection, JumpConnections

if TYPE_CHECKING:  # the playbook and its steps load when a playbook runs: gpu-status, logs and doctor never need them
    from deploy.playbook import Playbook, PlannedStep
    from deploy.steps.base import Action, StepContext

#: what a rollback runs, with the playbook's settings for each step where it has them
ROLLBACK_STEPS = ("stop-stale", "free-gpus", "wait-gpus-free", "launch", "wait-ready", "verify-acceptance")

Progress = Callable[[str, str, str], None]  # (host, step, message)


@dataclass
class StepRecord:
    name: str
    status: str  # ok | skipped | failed | not-run | disabled
    duration_s: float = 0.0
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "status": self.status, "duration_s": round(self.duration_s, 3),
                "detail": self.detail, "attempts": self.attempts, "exit_code": self.exit_code, "data": self.data}


@dataclass
class RunOptions:
    """How a verb runs its playbook: lock or not, rollback or not, force a redeploy or not."""

    command: str = ""
    lock: bool = False
    owner: dict[str, Any] | None = None
    rollback: bool = True
    force: bool = False
    #: hosts a fleet kept in its router (a probe found them unchanged): converge must find them so,
    #: or fail before anything is stopped
    keep_serving: frozenset[str] = frozenset()


class RolledBack(DeployError):
    exit_code = ExitCode.ROLLED_BACK


@dataclass
class HostReport:
    host: Host
    steps: list[StepRecord] = field(default_factory=list)
    error: DeployError | None = None
    #: the failure that started a rollback (``error`` is then the outcome: 11, 12 or 1)
    cause: DeployError | None = None
    rollback: list[StepRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    left_running: str | None = None
    #: for history: sglang_version, drafter_fingerprint, draft_tokens, accept_length, output_tok_s, converged
    facts: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def outcome(self) -> str:
        if self.error is None:
            return "converged" if self.facts.get("converged") else "ok"
        return {ExitCode.ROLLED_BACK: "rolled-back", ExitCode.REGRESSION: "regression",
                ExitCode.LOCKED: "locked", ExitCode.INTERRUPTED: "interrupted"}.get(self.error.exit_code, "failed")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host.name, "address": self.host.address, "ok": self.ok,
                                "outcome": self.outcome, "steps": [s.to_dict() for s in self.steps]}
        if self.rollback:
            data["rollback"] = [s.to_dict() for s in self.rollback]
        if self.warnings:
            data["warnings"] = self.warnings
        if self.error is not None:
            data["error"] = str(self.error)
            data["exit_code"] = int(self.error.exit_code)
        else:
            data["exit_code"] = 0
        if self.cause is not None:
            data["cause"] = str(self.cause)
        if self.left_running is not None:
            data["left_running"] = self.left_running
        data["facts"] = self.facts
        data["duration_s"] = round(self.duration_s, 3)
        return data


def launch_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _context(host: Host, run: Run, settings, conn, stamp: str, progress, memory,
             cancelled: threading.Event | None = None, step: str = "") -> StepContext:
    from deploy.steps.base import StepContext
    # the journal lives in the host's memory: every step (and a rollback's) appends to one list
    journal = memory.setdefault("journal", [])
    return StepContext(host=host, run=run, settings=settings, conn=conn,
                       launch_stamp=stamp, progress=progress, memory=memory,
                       cancelled=cancelled or threading.Event(), journal=journal, step=step)


def network_host(host: Host, address: str) -> Host:
    """The host as its steps see it: ``address`` is where it is on the network.

    The YAML address may be an ssh_config alias (``gpu-a``) that only ssh understands; SGLang's
    default bind address (a run without serve_host) must be the HostName it resolves to.
    """
    return host if address == host.address else host.model_copy(update={"address": address})


def plan_playbook(playbook: Playbook, run: Run, hosts: Sequence[Host],
                  addresses: dict[str, str] | None = None,
                  lock: bool = False) -> dict[str, list[tuple[str, list[Action]]]]:
    """Every command each host would run, in order; touches nothing.

    ``addresses``: host name -> network address (the ssh_config HostName), where known.
    """
    from deploy.locks import host_lock_command

    stamp = launch_stamp()
    from deploy.steps.base import Command

    plans: dict[str, list[tuple[str, list[Action]]]] = {}
    for host in hosts:
        host = network_host(host, (addresses or {}).get(host.name, host.address))
        memory: dict[str, Any] = {}
        steps: list[tuple[str, list[Action]]] = []
        if lock:
            steps.append(("host-lock", [Command(
                description="hold the host lock (flock) for the whole run, on its own SSH channel; held elsewhere: exit 9",
                command=host_lock_command(host, "<owner>", script="<deploy/remote/host_lock.py>"))]))
        for step in playbook.steps:
            if not step.settings.enabled:
                continue
            ctx = _context(host, run, step.settings, None, stamp, lambda m: None, memory, step=step.name)
            steps.append((step.name, step.module.plan(ctx)))
        plans[host.name] = steps
    return plans


def _run_steps(steps: Sequence[PlannedStep], host: Host, run: Run, conn, stamp: str,
               progress: Progress, memory: dict, cancelled: threading.Event, label: str = "") -> tuple[list[StepRecord], DeployError | None, int]:
    """Run steps in order; returns (records, first error, index of the failing step or -1)."""
    records: list[StepRecord] = []
    error: DeployError | None = None
    failed_at = -1
    stop = False
    for index, step in enumerate(steps):
        if stop or cancelled.is_set():
            records.append(StepRecord(step.name, "not-run"))
            continue
        held = memory.get("host_lock")
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
        if memory.get("converged") and getattr(step.module, "CONVERGE_SKIPS", False):
            records.append(StepRecord(step.name, "skipped", detail="already running as desired"))
            continue
        name = f"{label}{step.name}"
        record = StepRecord(step.name, "failed")
        started = time.monotonic()
        for attempt in range(1, step.settings.retries + 2):
            record.attempts = attempt
            ctx = _context(host, run, step.settings, conn, stamp,
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


def _server_state(conn, host: Host, run: Run, memory: dict):
    from deploy.steps.base import StatePaths
    from deploy.steps.wait_ready import health_url

    ctx = _context(host, run, None, conn, "", lambda m: None, memory)
    paths = StatePaths(host.state_dir)
    output = conn.check(server_state_command(host.python, paths.helper("host_ops.py"), paths.root, health_url(ctx)),
                        timeout=30, what="server-state").stdout
    return parse_server_state(output, host.name)


def _died(conn, host: Host, run: Run, memory: dict, error: DeployError, step: str) -> DeployError:
    """A failure while a server PID is known: if that server is gone, say so with its log tail."""
    from deploy.steps.wait_ready import died_message, tail_command

    if isinstance(error, (ServerDied, LockHeld)) or "pid" not in memory:
        return error
    try:
        state = _server_state(conn, host, run, memory)
    except DeployError:
        return error
    if state.alive and state.pid == memory["pid"]:
        return error
    log = memory.get("log") or ""
    tail = conn.run(tail_command(log)).stdout.rstrip() if log else ""
    ctx = _context(host, run, None, conn, "", lambda m: None, memory)
    return ServerDied(died_message(ctx, memory["pid"], log, tail, f"(noticed by {step}; it had reported: "
                                   f"{str(error).splitlines()[0][:200]})"))


def _rollback_steps(playbook: Playbook) -> list[PlannedStep]:
    from deploy.playbook import PlannedStep
    from deploy.steps import REGISTRY

    steps = []
    for name in ROLLBACK_STEPS:
        mine = next((s for s in playbook.steps if s.name == name), None)
        if mine is None:
            steps.append(PlannedStep(name, REGISTRY[name].Settings(step=name)))
        elif mine.settings.enabled:
            steps.append(mine)
    return steps


def _should_roll_back(playbook: Playbook, records: list[StepRecord], failed_at: int, error: DeployError,
                      options: RunOptions, cancelled: threading.Event) -> bool:
    if not options.rollback or cancelled.is_set() or isinstance(error, LockHeld) or failed_at < 0:
        return False
    names = [s.name for s in playbook.steps]
    if "stop-stale" not in names:
        return False
    stop_index = names.index("stop-stale")
    return failed_at > stop_index and records[stop_index].status in ("ok", "skipped")


def _roll_back(report: HostReport, playbook: Playbook, run: Run, conn, stamp: str,
               progress: Progress, memory: dict, cancelled: threading.Event) -> None:
    host = report.host
    error = report.error
    assert error is not None
    path = last_good_path(host.state_dir)
    snapshot = memory.get("snapshot")
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
    if isinstance(error, Regression) and same_deployment(good, memory.get("deployment")):
        report.warnings.append("the regressing deployment is the last good one: nothing else to roll back to")
        return
    progress(host.name, "rollback", f"relaunching the last good deployment ({good.get('drafter_path')})")
    rb_memory: dict[str, Any] = {"rollback_record": good, "env_file": good.get("env_file"),
                                 "host_lock": memory.get("host_lock")}
    records, rb_error, _ = _run_steps(_rollback_steps(playbook), host, run, conn, stamp, progress,
                                      rb_memory, cancelled, label="rollback/")
    report.rollback = records
    report.cause = error
    first = str(error).splitlines()[0]
    if rb_error is None:
        memory.update(restored=rb_memory.get("deployment"))
        restored = f"previous deployment restored and verified ({good.get('drafter_path')}, pid {rb_memory.get('pid')})"
        if isinstance(error, Regression):
            report.error = Regression(f"{error}\n-> rolled back: {restored}")
        else:
            report.error = RolledBack(f"failed: {first}\n-> {restored}")
        progress(host.name, "rollback", restored)
    else:
        report.error = DeployError(
            f"failed: {first}\n-> the rollback to the last good deployment ({good.get('drafter_path')}) failed too: "
            f"{str(rb_error).splitlines()[0]}\nTHE HOST IS SERVING NOTHING (no verified deployment is running)",
            exit_code=ExitCode.FAILED)
        progress(host.name, "rollback", "FAILED: the host is serving nothing")


def _collect_facts(report: HostReport, memory: dict, run: Run) -> None:
    deployment = memory.get("deployment") or {}
    report.facts = {
        "sglang_version": memory.get("sglang_version") or deployment.get("sglang_version"),
        "drafter_fingerprint": memory.get("drafter_fingerprint") or deployment.get("drafter_fingerprint"),
        "draft_tokens": run.draft_tokens,
        "accept_length": (memory.get("verify") or {}).get("accept_length"),
        "output_tok_s": (memory.get("bench") or {}).get("output_tok_s"),
        # which prompts the numbers were measured on (BENCH, issue 20): history rows name them
        "dataset": (memory.get("bench") or {}).get("dataset"),
        "dataset_sha256": (memory.get("bench") or {}).get("dataset_sha256"),
        "converged": bool(memory.get("converged")),
    }


def _run_on_host(config: Config, playbook: Playbook, run: Run, host: Host, stamp: str,
                 progress: Progress, cancelled: threading.Event, jumps: JumpConnections,
                 options: RunOptions | None = None) -> HostReport:
    from deploy.locks import acquire_host_lock

    options = options or RunOptions()
    started = time.monotonic()
    report = HostReport(host)
    memory: dict[str, Any] = {"force": options.force, "must_converge": host.name in options.keep_serving}
    try:
        conn = HostConnection(host, config.ssh, jumps)
        conn.connect()
    except DeployError as exc:
        report.error = exc
        report.steps = [StepRecord(s.name, "not-run") for s in playbook.steps]
        return report
    host = network_host(host, conn.endpoint.hostname.value)
    with conn:
        held = None
        if options.lock:
            try:
                held, warning = acquire_host_lock(conn, host, options.owner or {})
            except DeployError as exc:
                report.error = exc
                report.steps = [StepRecord(s.name, "not-run") for s in playbook.steps]
                progress(host.name, "lock", f"FAILED: {exc}")
                return report
            if warning:
                report.warnings.append(warning)
                progress(host.name, "lock", f"WARNING: {warning}")
            progress(host.name, "lock", "held")
            memory["host_lock"] = held
        try:
            records, error, failed_at = _run_steps(playbook.steps, host, run, conn, stamp, progress,
                                                   memory, cancelled)
            report.steps = records
            _collect_facts(report, memory, run)
            if error is not None and not cancelled.is_set():
                error = _died(conn, host, run, memory, error, playbook.steps[failed_at].name)
                records[failed_at].detail = str(error)
                records[failed_at].exit_code = int(error.exit_code)
            report.error = error
            if error is not None and _should_roll_back(playbook, records, failed_at, error, options, cancelled):
                _roll_back(report, playbook, run, conn, stamp, progress, memory, cancelled)
            if report.error is not None:
                try:
                    report.left_running = _server_state(conn, host, run, memory).describe()
                except DeployError as exc:
                    report.left_running = f"unknown: {exc}"
        finally:
            if held is not None:
                held.close()
    report.duration_s = time.monotonic() - started
    return report


def run_playbook(config: Config, playbook: Playbook, run: Run, hosts: Sequence[Host],
                 progress: Progress, options: RunOptions | None = None) -> list[HostReport]:
    stamp = launch_stamp()
    cancelled = threading.Event()
    with JumpConnections() as jumps:  # one connection per jump host, shared by its targets
        outcomes = for_each_host(
            hosts, lambda h: _run_on_host(config, playbook, run, h, stamp, progress, cancelled, jumps,
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



# -- run-level phases the CLI verbs call (the CLI never talks SSH itself) --------------------------


def describe_endpoints(hosts: Sequence[Host], config: Config) -> dict[str, dict]:
    """Per host name: the effective SSH settings and their sources (for plan and gpu-status output)."""
    from deploy.transport import describe_endpoints as describe

    return describe(hosts, config.ssh)


def plan_with_endpoints(playbook: Playbook, run: Run, hosts: Sequence[Host], config: Config,
                        lock: bool = True) -> tuple[dict[str, list[tuple[str, list[Action]]]], dict[str, dict]]:
    """The plan of every host, with each host's SGLang bind address taken from its ssh_config HostName."""
    endpoints = describe_endpoints(hosts, config)
    addresses = {n: e["hostname"]["value"] for n, e in endpoints.items() if "hostname" in e}
    return plan_playbook(playbook, run, hosts, addresses, lock=lock), endpoints


def run_locked(config_path, config: Config, command: str, playbook: Playbook, run: Run, hosts: Sequence[Host],
               progress: Progress, *, rollback: bool = True, force: bool = False, runner=None):
    """Run a playbook that changes hosts: local lock per config and run, host locks, history.

    ``runner(options)``: a fleet's run-level phases instead of one parallel playbook
    (deploy/fleet/); it returns a RunResult, which is what this returns then.
    """
    from contextlib import ExitStack

    from deploy import history
    from deploy.locks import local_lock, owner_info

    owner = owner_info(command, run.name)
    started = datetime.now(timezone.utc)
    with ExitStack() as held:
        try:
            held.enter_context(local_lock(config_path, run.name, owner))
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
            result: Any
            if runner is not None:
                result = runner(options)
                reports = result.reports
            else:
                result = reports = run_playbook(config, playbook, run, hosts, progress, options)
        except KeyboardInterrupt as interrupt:
            # Ctrl-C: no rollback, but say what each host was left running, and record it.
            partial = [o.value for o in getattr(interrupt, "outcomes", []) if o.value is not None]
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


def gpu_status(config: Config, hosts: Sequence[Host]) -> list:
    """nvidia-smi facts of every host, in parallel: HostOutcome[list[GpuRow]] in host order."""
    from deploy.facts.gpus import read_gpus

    def work(host: Host):
        with HostConnection(host, config.ssh, jumps) as conn:
            return read_gpus(conn, host.gpus)

    with JumpConnections() as jumps:
        return for_each_host(hosts, work, config.ssh.max_parallel)


def router_status(config: Config, hosts: Sequence[Host]) -> list[dict[str, Any]]:
    """Each run's router that runs on one of ``hosts``: PID, alive, its workers (for gpu-status)."""
    if not any(r.router is not None for r in config.runs):
        return []
    from deploy.fleet.plan import router_status as read

    with JumpConnections() as jumps:
        return read(config, hosts, jumps)


def doctor(config: Config, run: Run, hosts: Sequence[Host]) -> list:
    """The doctor's checks on every host, in parallel (read-only): HostOutcome[list[Check]] in host order."""
    from deploy.steps.doctor import diagnose

    def work(host: Host):
        with HostConnection(host, config.ssh) as conn:
            return diagnose(conn, host, run, fix_keys_will_run=False)[0]

    outcomes = for_each_host(hosts, work, config.ssh.max_parallel)
    if run.router is not None:
        from deploy.fleet.doctor import add_router_checks

        add_router_checks(config, run, hosts, outcomes)
    return outcomes


def latest_log_path(host: Host) -> str:
    from deploy.steps.base import StatePaths

    return StatePaths(host.state_dir).latest_log


def read_logs(config: Config, hosts: Sequence[Host], lines: int) -> list:
    """The last ``lines`` lines of each host's latest server log: HostOutcome[str] in host order."""
    from deploy.shell import quote_path

    def work(host: Host) -> str:
        with HostConnection(host, config.ssh, jumps) as conn:
            return conn.check(f"tail -n {lines} -- {quote_path(latest_log_path(host))}",
                              what="reading the server log").stdout

    with JumpConnections() as jumps:
        return for_each_host(hosts, work, config.ssh.max_parallel)


def follow_log(config: Config, host: Host, lines: int) -> None:
    """Print the host's latest server log and follow it (``tail -F``) until Ctrl-C."""
    from deploy.shell import quote_path

    with HostConnection(host, config.ssh) as conn:
        conn.stream(f"tail -n {lines} -F -- {quote_path(latest_log_path(host))}")
