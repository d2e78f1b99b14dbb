"""One SGLang server across several hosts (``nodes: [a, b, ...]``), built from run-level phases.

Every node gets the same argv plus ``--nnodes N --node-rank R --dist-init-addr RANK0:PORT``
(SGLang's own multi-node flags). Each node keeps one SSH connection and its host lock for the
whole run; the playbook's steps run in slices with barriers between them:

1. every node: the steps before ``stop-stale`` (doctor, helpers, fix-keys, converge);
2. the group converges as one deployment: unless every node runs as desired, every node is redeployed;
3. every node: ``stop-stale``, ``free-gpus``, ``wait-gpus-free`` (GPU cleanup on every node);
4. rank 0 launches first, then the other ranks (they wait for rank 0's rendezvous port);
5. rank 0 only: ``wait-ready``, verification, benchmark (the other ranks serve no HTTP); then every
   other rank must still be alive;
6. every node: ``record-good``.

A node that fails at or after the launch stops every node (by PID file): a partial server only
hangs. Rolling a node group back to its last good deployment is not done (the report says so).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from deploy.config.models import Host, Run
from deploy.errors import DeployError, ExitCode, ServerDied
from deploy.fanout import for_each_host
from deploy.fleet.phases import PhaseRecord, RunResult
from deploy.orchestrator import (HostReport, StepRecord, _died, _run_steps, _server_state, launch_stamp,
                                 network_host)
from deploy.playbook import PlannedStep
from deploy.steps import REGISTRY
from deploy.transport import HostConnection, JumpConnections

RANK0_ONLY = ("wait-ready", "verify-acceptance", "benchmark", "regression-gate")


def dist_init_addr(run: Run, rank0: Host) -> str:
    return f"{rank0.address}:{run.dist_init_port or run.port + 1}"


def node_run(run: Run, rank: int, nnodes: int, addr: str) -> Run:
    """The run as node ``rank`` launches it: the same argv plus SGLang's multi-node flags."""
    flags = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", addr]
    return run.model_copy(update={"extra_args": [*run.extra_args, *flags]})


class NodeSession:
    """One node's connection, host lock and step memory, kept across the run's phases."""

    def __init__(self, config, host: Host, run: Run, rank: int, jumps, options, progress, cancelled, stamp):
        self.config, self.host, self.run, self.rank = config, host, run, rank
        self.jumps, self.options, self.progress, self.cancelled = jumps, options, progress, cancelled
        self.stamp = stamp
        self.report = HostReport(host)
        self.memory: dict[str, Any] = {"force": options.force}
        self.conn: HostConnection | None = None
        self.held = None
        self.started = time.monotonic()

    def open(self) -> None:
        from deploy.locks import acquire_host_lock

        self.conn = HostConnection(self.host, self.config.ssh, self.jumps)
        self.conn.connect()
        self.host = network_host(self.host, self.conn.endpoint.hostname.value)
        self.report.host = self.host
        if self.options.lock:
            self.held, warning = acquire_host_lock(self.conn, self.host, self.options.owner or {})
            if warning:
                self.report.warnings.append(warning)
            self.memory["host_lock"] = self.held
            self.progress(self.host.name, "lock", "held")

    def steps(self, steps: Sequence[PlannedStep]) -> DeployError | None:
        records, error, failed_at = _run_steps(steps, self.host, self.run, self.conn, self.stamp,
                                               self.progress, self.memory, self.cancelled)
        self.report.steps.extend(records)
        if error is not None:
            error = _died(self.conn, self.host, self.run, self.memory, error, steps[failed_at].name)
            records[failed_at].detail, records[failed_at].exit_code = str(error), int(error.exit_code)
            self.report.error = self.report.error or error
        return error

    def skip(self, steps: Sequence[PlannedStep], why: str) -> None:
        self.report.steps.extend(StepRecord(s.name, "skipped", detail=why) for s in steps)

    def close(self) -> None:
        if self.conn is not None:
            if self.report.error is not None:
                try:
                    self.report.left_running = _server_state(self.conn, self.host, self.run, self.memory).describe()
                except DeployError as exc:
                    self.report.left_running = f"unknown: {exc}"
            if self.held is not None:
                self.held.close()
            self.conn.close()
        self.report.duration_s = time.monotonic() - self.started


def _slices(playbook) -> dict[str, list[PlannedStep]]:
    names = [s.name for s in playbook.steps]
    stop = names.index("stop-stale") if "stop-stale" in names else len(names)
    launch = names.index("launch") if "launch" in names else len(names)
    steps = list(playbook.steps)
    after = steps[launch + 1:]
    return {"prepare": steps[:stop], "clear": steps[stop:launch], "launch": steps[launch:launch + 1],
            "verify": [s for s in after if s.name != "record-good"],
            "record": [s for s in after if s.name == "record-good"]}


def run_nodes(config, playbook, run: Run, hosts: Sequence[Host], progress, options) -> RunResult:
    cancelled = threading.Event()
    stamp = launch_stamp()
    slices = _slices(playbook)
    phases: list[PhaseRecord] = []
    error: DeployError | None = None
    with JumpConnections() as jumps:
        sessions = [NodeSession(config, h, run, r, jumps, options, progress, cancelled, stamp)
                    for r, h in enumerate(hosts)]
        by_name = {s.host.name: s for s in sessions}

        def each(group: Sequence[NodeSession], name: str, work) -> bool:
            nonlocal error
            if error is not None:
                phases.append(PhaseRecord(name, "not-run"))
                return False
            started = time.monotonic()
            progress("*", name, "start")
            outcomes = for_each_host([s.host for s in group], lambda h: work(by_name[h.name]),
                                     config.ssh.max_parallel, cancel=cancelled)
            failed = None
            for outcome in outcomes:
                session = by_name[outcome.host.name]
                problem = outcome.error or outcome.value
                if problem is not None:
                    session.report.error = session.report.error or problem
                    failed = failed or problem
            if failed is not None:
                error = failed
                phases.append(PhaseRecord(name, "failed", str(failed).splitlines()[0], time.monotonic() - started,
                                          int(failed.exit_code)))
                progress("*", name, f"FAILED: {str(failed).splitlines()[0][:300]}")
                return False
            phases.append(PhaseRecord(name, "ok", "", time.monotonic() - started))
            return True

        try:
            def opened(s: NodeSession):
                s.open()
                # addresses are known once connected (ssh_config HostName)
                return None

            if each(sessions, "connect and lock every node", opened):
                addr = dist_init_addr(run, sessions[0].host)
                for s in sessions:
                    s.run = node_run(run, s.rank, len(sessions), addr)
            each(sessions, "every node: " + ", ".join(p.name for p in slices["prepare"]),
                 lambda s: s.steps(slices["prepare"]))
            if error is None:
                for s in sessions[1:]:
                    _converged_without_http(s)
                converged = all(s.memory.get("converged") for s in sessions)
                if not converged:
                    for s in sessions:
                        s.memory["converged"] = False
                phases.append(PhaseRecord("node group converge", "ok",
                                          "every node runs as desired: nothing stopped" if converged else
                                          "redeploying every node (one deployment)"))
            each(sessions, "every node: stop-stale, free GPUs", lambda s: s.steps(slices["clear"]))
            each(sessions[:1], f"rank 0 launch {sessions[0].host.name}", lambda s: s.steps(slices["launch"]))
            each(sessions[1:], "ranks 1+ launch " + ",".join(s.host.name for s in sessions[1:]),
                 lambda s: s.steps(slices["launch"]))
            each(sessions[:1], f"rank 0 ready and verified {sessions[0].host.name}", lambda s: s.steps(slices["verify"]))
            for s in sessions[1:]:
                s.skip(slices["verify"], "node rank > 0 serves no HTTP: rank 0 was checked")

            def still_alive(s: NodeSession):
                if s.memory.get("converged"):
                    return None
                state = _server_state(s.conn, s.host, s.run, s.memory)
                if not (state.alive and state.pid == s.memory.get("pid")):
                    return ServerDied(f"{s.host.name}: node rank {s.rank} (pid {s.memory.get('pid')}) is not running "
                                      f"after rank 0 became ready: {state.describe()}")
                return None

            each(sessions[1:], "ranks 1+ alive", still_alive)
            each(sessions, "every node: record-good", lambda s: s.steps(slices["record"]))
            launch_tried = any(p.name.startswith("rank 0 launch") and p.status != "not-run" for p in phases)
            redeployed = not all(s.memory.get("converged") for s in sessions)
            if error is not None and launch_tried and redeployed:
                _stop_every_node(sessions, phases, progress)
        finally:
            for s in sessions:
                s.close()
    reports = [s.report for s in sessions]
    for report in reports:
        if error is not None and report.error is None:
            report.warnings.append(f"stopped with the node group: {str(error).splitlines()[0][:200]}")
    result = RunResult(reports, phases, None)
    if error is not None and not any(r.error for r in reports):
        result.error = error
    return result


def _converged_without_http(s: NodeSession) -> None:
    """converge also wants /health 200, which a rank > 0 never answers (it serves no HTTP): such a
    node runs as desired when its recorded deployment is unchanged and its server is alive."""
    record = next((r for r in reversed(s.report.steps) if r.name == "converge"), None)
    if record is None or record.status != "ok" or s.memory.get("converged") or s.memory.get("force"):
        return
    if record.data.get("changed") or not record.data.get("alive"):
        return
    state = _server_state(s.conn, s.host, s.run, s.memory)
    if state.alive and state.record is not None and state.pid == record.data.get("recorded_pid"):
        s.memory.update(converged=True, pid=state.pid, log=state.record.get("log"), deployment=state.record)
        record.detail = f"already running as desired (pid {state.pid}; node rank {s.rank} serves no HTTP)"


def _stop_every_node(sessions: Sequence[NodeSession], phases: list[PhaseRecord], progress) -> None:
    """A node group with a failed node only hangs: stop every node's server (by its PID file)."""
    step = PlannedStep("stop-stale", REGISTRY["stop-stale"].Settings(step="stop-stale", scope="pidfile", grace_s=10))
    started = time.monotonic()
    progress("*", "stop every node", "a node failed: stopping the server on every node")
    problems = []
    for s in sessions:
        if s.conn is None:
            continue
        records, failure, _ = _run_steps([step], s.host, s.run, s.conn, s.stamp, s.progress, {},
                                         threading.Event(), label="group-stop/")
        s.report.rollback.extend(records)
        if failure is not None:
            problems.append(f"{s.host.name}: {failure}")
    phases.append(PhaseRecord("stop every node", "failed" if problems else "ok", "; ".join(problems)
                              or "every node's server stopped (no rollback for a node group)",
                              time.monotonic() - started, int(ExitCode.FAILED) if problems else 0))
