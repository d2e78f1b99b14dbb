"""One SGLang server across several hosts (``nodes: [a, b, ...]``), built from run-level phases.

Every node gets the same argv plus ``--nnodes N --node-rank R --dist-init-addr RANK0:PORT``
(SGLang's own multi-node flags). Each node keeps one SSH connection and its host lock for the
whole run; the playbook's steps run in slices with barriers between them:

1. every node: the steps before ``stop-stale`` (doctor, helpers, fix-keys, converge);
   then rank 0's dist-init port must be free (or held by our own rank 0): nothing is stopped otherwise;
2. the group converges as one deployment: unless every node runs as desired, every node is redeployed;
3. every node: ``stop-stale``, ``free-gpus``, ``wait-gpus-free`` (GPU cleanup on every node);
4. rank 0 launches first, then the other ranks (they wait for rank 0's rendezvous port);
5. rank 0 only: ``wait-ready``, verification, benchmark (the other ranks serve no HTTP); then every
   other rank must still be alive;
6. every node: ``record-good``.

The group is one deployment for rollback too. ``record-good`` writes every node's own last good
record (its argv with its ``--node-rank``, the shared ``--dist-init-addr``, drafter store path and
fingerprint, env file) with a ``node_group`` field: the group's id (a fingerprint of every node's
deployment identity, in rank order), the node's rank and the group's hosts. When the group fails
after ``stop-stale``, every node is stopped and every node's last good argv relaunched (rank 0
first), rank 0 waited for and verified, the other ranks checked alive (exit 11), but only when
every node's record belongs to the same group deployment: a node's record from another group (or
none) means there is nothing consistent to go back to, and every node is stopped. A failed
rollback stops every node too: a partial server only hangs.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy.config.models import Host, Run
from deploy.base.errors import DeployError, ExitCode, LockHeld, Regression, ServerDied, VerificationFailed
from deploy.engine.records import RolledBack, launch_stamp
from deploy.engine.session import HostSession, rollback_steps
from deploy.facts.server import last_good_path, parse_record, read_record_command, same_deployment
from deploy.host.records import DeploymentRecord, LastGood, NodeGroup
from deploy.fleet.phases import Barrier, PhaseRecord, RunResult
from deploy.engine.playbook import PlannedStep
from deploy.host.deployment import identity
from deploy.steps import REGISTRY
from deploy.steps.memory import StepMemory
from deploy.ssh.transport import JumpConnections

RANK0_ONLY = ("wait-ready", "verify-acceptance", "benchmark", "regression-gate")


def dist_init_addr(run: Run, rank0: Host) -> str:
    return f"{rank0.address}:{run.dist_init_port or run.port + 1}"


def node_run(run: Run, rank: int, nnodes: int, addr: str) -> Run:
    """The run as node ``rank`` launches it: the same argv plus SGLang's multi-node flags."""
    flags = ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", addr]
    return run.model_copy(update={"extra_args": [*run.extra_args, *flags]})


def group_id(deployments: Sequence[DeploymentRecord | None]) -> str:
    """One id for a node group's deployment: every node's deployment identity, in rank order."""
    text = json.dumps([identity(d) for d in deployments], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def group_fields(deployments: Sequence[DeploymentRecord | None], hosts: Sequence[str], addr: str) -> list[NodeGroup]:
    """Per rank: the ``node_group`` field its last good record carries."""
    gid = group_id(deployments)
    return [NodeGroup(id=gid, rank=rank, nnodes=len(hosts), hosts=list(hosts), dist_init_addr=addr)
            for rank in range(len(hosts))]


def _flag(argv: list, name: str) -> Any:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def matching_group(records: Sequence[LastGood | None], hosts: Sequence[str]) -> tuple[list[LastGood] | None, str]:
    """The nodes' last good records when they are ONE group deployment of these hosts in this rank
    order, else (None, why not). A node redeployed alone since, or a group of other hosts, does
    not match: relaunching such a mix would only hang in the rendezvous."""
    ids = set()
    for rank, (host, record) in enumerate(zip(hosts, records, strict=True)):
        if record is None:
            return None, f"{host}: no last good deployment is recorded"
        group = record.node_group
        if group is None:
            return None, f"{host}: its last good deployment is not one of a node group"
        if group.hosts != list(hosts) or group.nnodes != len(hosts) or group.rank != rank:
            return None, (f"{host}: its last good deployment is rank {group.rank} of nodes "
                          f"{group.hosts}, not rank {rank} of {list(hosts)}")
        argv = record.argv
        if _flag(argv, "--node-rank") != str(rank) or _flag(argv, "--nnodes") != str(len(hosts)) or \
                _flag(argv, "--dist-init-addr") != group.dist_init_addr:
            return None, f"{host}: its last good argv does not match its node_group record (rank {rank})"
        ids.add(group.id)
    if len(ids) != 1:
        return None, "the nodes' last good deployments belong to different group deployments"
    addrs = {r.node_group.dist_init_addr for r in records if r is not None and r.node_group is not None}
    if len(addrs) != 1:
        return None, f"the nodes' last good deployments name different --dist-init-addr: {sorted(str(a) for a in addrs)}"
    if group_id(records) != ids.pop():
        return None, "the nodes' last good deployments do not add up to the group deployment they name"
    return list(records), ""  # type: ignore[arg-type]


class Node(HostSession):
    """A node of the group: the engine's host session and its rank (0: the rendezvous, the HTTP server)."""

    rank: int = 0


def _slices(playbook) -> dict[str, list[PlannedStep]]:
    names = [s.name for s in playbook.steps]
    stop = names.index("stop-stale") if "stop-stale" in names else len(names)
    launch = names.index("launch") if "launch" in names else len(names)
    steps = list(playbook.steps)
    after = steps[launch + 1:]
    return {"prepare": steps[:stop], "clear": steps[stop:launch], "launch": steps[launch:launch + 1],
            "verify": [s for s in after if s.name != "record-good"],
            "record": [s for s in after if s.name == "record-good"]}


@dataclass(frozen=True)
class NodePhase:
    """One phase of a node group, defined once (``node_phases``): ``run_nodes`` runs it as a barrier
    over its nodes, ``plan_nodes`` lists it with the commands it sends. ``playbook``: the slice of the
    playbook its nodes run (``_slices``); else ``check``: what the group itself asks there."""

    name: str
    on: str  # every | rank 0 | ranks 1+
    playbook: str | None = None
    check: str | None = None  # connect | dist-init | converge | alive

    def nodes(self, nodes: Sequence[Any]) -> list[Any]:
        return list(nodes) if self.on == "every" else list(nodes[:1]) if self.on == "rank 0" else list(nodes[1:])


def node_phases(slices: dict[str, list[PlannedStep]], names: Sequence[str]) -> list[NodePhase]:
    """The node group's phases in the order it takes them (rank 0 is the rendezvous and the HTTP server)."""
    steps = ", ".join(p.name for p in slices["prepare"])
    return [NodePhase("connect and lock every node", "every", check="connect"),
            NodePhase("every node: " + steps, "every", "prepare"),
            NodePhase(f"rank 0 dist-init port {names[0]}", "rank 0", check="dist-init"),
            # ranks 1+ serve no HTTP: converge's own read cannot tell; their PID and record are read
            NodePhase("node group converge", "ranks 1+", check="converge"),
            NodePhase("every node: stop-stale, free GPUs", "every", "clear"),
            NodePhase(f"rank 0 launch {names[0]}", "rank 0", "launch"),
            NodePhase("ranks 1+ launch " + ",".join(names[1:]), "ranks 1+", "launch"),
            NodePhase(f"rank 0 ready and verified {names[0]}", "rank 0", "verify"),
            NodePhase("ranks 1+ alive", "ranks 1+", check="alive"),
            NodePhase("every node: record-good", "every", "record")]


def _runs(steps: list[PlannedStep]):
    def work(s: Node) -> DeployError | None:
        return s.steps(steps)
    return work


def run_nodes(config, playbook, run: Run, hosts: Sequence[Host], progress, options) -> RunResult:
    cancelled = threading.Event()
    stamp = launch_stamp()
    slices = _slices(playbook)
    phases: list[PhaseRecord] = []
    with JumpConnections() as jumps:
        sessions = []
        for rank, host in enumerate(hosts):
            node = Node(config, host, run, jumps=jumps, options=options, progress=progress, cancelled=cancelled,
                        stamp=stamp)
            node.rank = rank
            sessions.append(node)
        barrier = Barrier(phases, progress, config.ssh.max_parallel, cancel=cancelled)
        each = barrier.phase

        try:
            def opened(s: Node) -> None:
                s.open()
                # addresses are known once connected (ssh_config HostName)
                return None

            def still_alive(s: Node) -> DeployError | None:
                if s.memory.converged:
                    return None
                state = s.server_state()
                if not (state.alive and state.pid == s.memory.pid):
                    return ServerDied(f"{s.host.name}: node rank {s.rank} (pid {s.memory.pid}) is not running "
                                      f"after rank 0 became ready: {state.describe()}")
                return None

            for phase in node_phases(slices, [h.name for h in hosts]):
                on = phase.nodes(sessions)
                if phase.check == "connect":
                    if each(on, phase.name, opened):
                        addr = dist_init_addr(run, sessions[0].host)
                        for s in sessions:
                            s.run = node_run(run, s.rank, len(sessions), addr)
                elif phase.check == "dist-init":
                    each(on, phase.name, _dist_init_port_problem)
                elif phase.check == "converge":
                    if barrier.error is None:
                        for s in on:
                            _converged_without_http(s)
                        converged = all(s.memory.converged for s in sessions)
                        if not converged:
                            for s in sessions:
                                s.memory.converged = False
                        phases.append(PhaseRecord(phase.name, "ok",
                                                  "every node runs as desired: nothing stopped" if converged else
                                                  "redeploying every node (one deployment)"))
                elif phase.check == "alive":
                    each(on, phase.name, still_alive)
                else:
                    assert phase.playbook is not None
                    if phase.playbook == "record" and barrier.error is None:
                        _mark_group(sessions)
                    each(on, phase.name, _runs(slices[phase.playbook]))
                    if phase.playbook == "verify":
                        for s in sessions[1:]:
                            s.skip(slices["verify"], "node rank > 0 serves no HTTP: rank 0 was checked")
            cleared = any(p.name.startswith("every node: stop-stale") and p.status != "not-run" for p in phases)
            redeployed = not all(s.memory.converged for s in sessions)
            error = barrier.error
            if error is not None and cleared and redeployed:
                if options.rollback and not cancelled.is_set() and not isinstance(error, LockHeld):
                    _roll_back_group(sessions, playbook, error, phases, progress, config.ssh.max_parallel)
                else:
                    _stop_every_node(sessions, phases, progress, "--no-rollback" if not options.rollback else "")
        finally:
            for s in sessions:
                s.close()
    error = barrier.error
    reports = [s.report for s in sessions]
    for report in reports:
        if error is not None and report.error is None:
            report.warnings.append(f"stopped with the node group: {str(error).splitlines()[0][:200]}")
    result = RunResult(reports, phases, None)
    if error is not None and not any(r.error for r in reports):
        result.error = error
    return result


def dist_init_probe(host: Host, rank0_run: Run):
    """The doctor's host read for rank 0's rendezvous port: (command, addr, port, the run it probes)."""
    from deploy.facts.doctor import host_command
    from deploy.steps.base import Command

    addr = _flag(rank0_run.extra_args, "--dist-init-addr") or ""
    port = int(addr.rsplit(":", 1)[1])
    probe = rank0_run.model_copy(update={"port": port, "serve_host": addr.rsplit(":", 1)[0]})
    return (Command(description=f"rank 0's --dist-init-addr {addr} must be free or our own rank 0's (the doctor's "
                                "listener read)", command=host_command(host, probe), timeout_s=60), addr, port, probe)


def _group_stop_step() -> PlannedStep:
    return PlannedStep("stop-stale", REGISTRY["stop-stale"].Settings(step="stop-stale", scope="pidfile", grace_s=10))


def plan_nodes(config, playbook, run: Run, hosts: Sequence[Host], endpoints: dict | None):
    """The node group's plan, from what run_nodes runs: each node's playbook with its own multi-node
    flags (``node_run``: ``--nnodes --node-rank --dist-init-addr``; ranks 1+ without the steps only
    rank 0 runs), and the group's phases in order with the commands each sends."""
    from deploy.engine.plan import plan_failure, plan_playbook
    from deploy.engine.session import server_state_action, step_context
    from deploy.fleet.plan import network_hosts

    net = network_hosts(hosts, endpoints)
    nodes = [net[h.name] for h in hosts]
    addr = dist_init_addr(run, nodes[0])
    runs = [node_run(run, rank, len(hosts), addr) for rank in range(len(hosts))]
    slices = _slices(playbook)
    plans: dict = {}
    for rank, host in enumerate(hosts):
        book = playbook
        for step in slices["verify"] if rank > 0 else []:
            book = book.with_settings(step.name, enabled=False)  # rank > 0 serves no HTTP: rank 0 is checked
        plans.update(plan_playbook(book, runs[rank], [host], {host.name: nodes[rank].address}, lock=True))

    def entry(name: str, on: Sequence[Host] = (), commands: Sequence[tuple[Host, str, Any]] = ()) -> dict:
        doc: dict[str, Any] = {"phase": name, "commands": [{"host": h.name, "step": step, **a.to_dict()}
                                                         for h, step, a in commands]}
        if on:
            doc["playbook_on"] = [h.name for h in on]
        return doc

    rest = nodes[1:]
    import dataclasses

    alive = [(n, "alive", dataclasses.replace(server_state_action(n, runs[r + 1]), when=(
        "rank 0 is ready (launched now), or converge found this node's record unchanged (rank > 0 serves no "
        "/health)"))) for r, n in enumerate(rest)]
    stop = _group_stop_step()
    stops = []
    for rank, node in enumerate(nodes):
        ctx = step_context(node, runs[rank], stop.settings, None, "<launch stamp>", lambda m: None, step=stop.name)
        stops += [(node, "group-stop/stop-stale", dataclasses.replace(a, when=(
            "a node failed after stop-stale and no rollback of the whole group is possible, or it failed")))
                  for a in stop.module.plan(ctx)]
    failure = [(node, step, a) for rank, node in enumerate(nodes)
               for step, actions in plan_failure(playbook, runs[rank], node) for a in actions]
    phases = []
    for phase in node_phases(slices, [h.name for h in hosts]):  # the run's phases, in its order
        if phase.playbook is not None:
            phases.append(entry(phase.name, phase.nodes(nodes)))
        elif phase.check == "dist-init":
            phases.append(entry(phase.name, (), [(nodes[0], "dist-init-port", dist_init_probe(nodes[0], runs[0])[0])]))
        elif phase.check in ("converge", "alive"):
            phases.append(entry(phase.name, (), [(n, "converge" if phase.check == "converge" else "alive", a)
                                                 for n, _, a in alive]))
        else:
            phases.append(entry(phase.name))
    phases.append(entry("on failure after stop-stale: the group's rollback (every node's last good deployment of ONE "
                        "group, rank 0 first), or every node stopped", (), failure + stops))
    return plans, {"nodes": [h.name for h in hosts], "dist_init_addr": addr, "phases": phases}


def _dist_init_port_problem(s: Node) -> DeployError | None:
    """Rank 0's rendezvous port must be free, or held by our own rank 0 (converging, or about to be
    stopped by stop-stale): anything else makes every rank hang in the rendezvous or fail to bind,
    so it is refused before any node is stopped. The doctor's own serve-port facts and judgement
    (/proc/net/tcp listeners and their holders; our server by its PID file and session)."""
    from deploy.doctor.checks import DoctorInput, check_serve_port
    from deploy.facts.doctor import parse_host_facts

    assert s.conn is not None
    action, addr, port, probe = dist_init_probe(s.host, s.run)
    facts = parse_host_facts(s.conn.run(action.command, timeout=action.timeout_s), s.host.name)
    check = check_serve_port(DoctorInput(s.host, probe, s.run.draft_tokens, facts, None))
    if check.status == "fail":
        return VerificationFailed(f"{s.host.name}: the node group's --dist-init-addr {addr}: {check.reason} "
                                  "(nothing was stopped); stop that process or set the run's dist_init_port to a free one")
    s.progress(s.host.name, "dist-init-port", check.reason.replace(f":{port}", f":{port} (dist-init)", 1))
    return None


def _converged_without_http(s: Node) -> None:
    """converge also wants /health 200, which a rank > 0 never answers (it serves no HTTP): such a
    node runs as desired when its recorded deployment is unchanged and its server is alive."""
    record = next((r for r in reversed(s.report.steps) if r.name == "converge"), None)
    if record is None or record.status != "ok" or s.memory.converged or s.memory.force:
        return
    if record.data.get("changed") or not record.data.get("alive"):
        return
    state = s.server_state()
    if state.alive and state.record is not None and state.pid == record.data.get("recorded_pid"):
        s.memory.converged, s.memory.pid = True, state.pid
        s.memory.log, s.memory.deployment = state.record.log, state.record
        record.detail = f"already running as desired (pid {state.pid}; node rank {s.rank} serves no HTTP)"


def _mark_group(sessions: Sequence[Node]) -> None:
    """Every node's deployment (launched now or converged) carries its node group, so that its last
    good record says which group deployment it belongs to."""
    deployments = [None if s.memory.deployment is None else s.memory.deployment.without("node_group")
                   for s in sessions]
    addr = _flag(sessions[0].run.extra_args, "--dist-init-addr")
    fields = group_fields(deployments, [s.host.name for s in sessions], addr)
    for s, deployment, group in zip(sessions, deployments, fields, strict=True):
        if deployment is not None:
            s.memory.deployment = deployment.but(node_group=group)


def _stop_every_node(sessions: Sequence[Node], phases: list[PhaseRecord], progress, why: str = "",
                     name: str = "stop every node") -> list[str]:
    """A node group with a failed node only hangs: stop every node's server (by its PID file)."""
    step = _group_stop_step()
    started = time.monotonic()
    progress("*", name, "a node failed: stopping the server on every node")
    problems = []
    for s in sessions:
        if s.conn is None:
            continue
        records, failure, _ = s.run_steps([step], memory=StepMemory(), label="group-stop/", cancelled=threading.Event())
        s.report.rollback.extend(records)
        if failure is not None:
            problems.append(f"{s.host.name}: {failure}")
    done = "every node's server stopped" + (f" ({why})" if why else "")
    phases.append(PhaseRecord(name, "failed" if problems else "ok", "; ".join(problems) or done,
                              time.monotonic() - started, int(ExitCode.FAILED) if problems else 0))
    return problems


def _roll_back_group(sessions: Sequence[Node], playbook, error: DeployError, phases: list[PhaseRecord],
                     progress, parallel: int) -> None:
    """The group failed after stop-stale: relaunch every node's last good deployment of ONE group
    deployment (rank 0 first), rank 0 ready and verified, the other ranks alive: exit 11. Anything
    else stops every node."""
    names = [s.host.name for s in sessions]
    goods: list[LastGood | None] = []
    try:
        for s in sessions:
            assert s.conn is not None
            path = last_good_path(s.host.state_dir)
            goods.append(parse_record(s.conn.run(read_record_command(path)).stdout, s.host.name, path))
        records, why = matching_group(goods, names)
    except DeployError as exc:
        records, why = None, str(exc)
    if records is None:
        progress("*", "rollback", f"no rollback for the node group: {why}")
        for s in sessions:
            s.report.warnings.append(f"no rollback: {why}")
        _stop_every_node(sessions, phases, progress, f"no last good deployment of this node group: {why}")
        return
    drafter = records[0].drafter_path
    if isinstance(error, Regression) and all(same_deployment(good, s.memory.deployment)
                                             for s, good in zip(sessions, records, strict=True)):
        # relaunched (--force, or a node had died) and slower than its own record: relaunching it again
        # would change nothing, and a rollback would claim a restore; the group serves on, exit 12
        why = "the regressing deployment is the node group's last good one: nothing else to roll back to"
        progress("*", "rollback", why)
        for s in sessions:
            s.report.warnings.append(why)
        return
    progress("*", "rollback", f"relaunching the node group's last good deployment ({drafter})")
    steps = rollback_steps(playbook)
    clear = [p for p in steps if p.name in ("stop-stale", "free-gpus", "wait-gpus-free")]
    launch = [p for p in steps if p.name == "launch"]
    verify = [p for p in steps if p.name in ("wait-ready", "verify-acceptance")]
    # each node's rollback memory as one host's (engine.session.roll_back): its last good record, its
    # host lock and the GPU memory the doctor found held before the stop (never waited for)
    memories = {s.host.name: s.memory.rollback_of(good) for s, good in zip(sessions, records, strict=True)}
    barrier = Barrier(phases, progress, parallel, blame=False)
    on = barrier.phase

    def steps_on(s: Node, planned: Sequence[PlannedStep]) -> DeployError | None:
        memory = memories[s.host.name]
        done, failure, at = s.run_steps(planned, memory=memory, label="rollback/", cancelled=threading.Event())
        s.report.rollback.extend(done)
        if failure is not None:
            failure = s.died(failure, planned[at].name, memory=memory)
        return failure

    def alive(s: Node) -> DeployError | None:
        memory = memories[s.host.name]
        state = s.server_state()
        if not (state.alive and state.pid == memory.pid):
            return ServerDied(f"{s.host.name}: node rank {s.rank} (pid {memory.pid}) is not running after "
                              f"rank 0 became ready: {state.describe()}")
        return None

    on(sessions, "rollback: every node stop-stale, free GPUs", lambda s: steps_on(s, clear))
    on(sessions[:1], f"rollback: rank 0 launch {names[0]}", lambda s: steps_on(s, launch))
    on(sessions[1:], "rollback: ranks 1+ launch " + ",".join(names[1:]), lambda s: steps_on(s, launch))
    on(sessions[:1], f"rollback: rank 0 ready and verified {names[0]}", lambda s: steps_on(s, verify))
    on(sessions[1:], "rollback: ranks 1+ alive", alive)
    first = str(error).splitlines()[0]
    if barrier.error is None:
        addr = records[0].node_group.dist_init_addr if records[0].node_group is not None else None
        restored = (f"previous deployment restored and verified on every node ({drafter}, --dist-init-addr "
                    f"{addr}, pids " + ", ".join(f"{n} {memories[n].pid}" for n in names) + ")")
        for s in sessions:
            s.report.cause = s.report.error
            # a regression stays a regression (exit 12, as on one host); anything else: rolled back (exit 11)
            s.report.error = Regression(f"{error}\n-> rolled back: {restored}") if isinstance(error, Regression) \
                else RolledBack(f"failed: {first}\n-> {restored}")
        progress("*", "rollback", restored)
        return
    problems = _stop_every_node(sessions, phases, progress, "the rollback failed")
    told = f"; stopping failed on {'; '.join(problems)}" if problems else ""
    for s in sessions:
        s.report.cause = s.report.error
        s.report.error = DeployError(
            f"failed: {first}\n-> the rollback to the node group's last good deployment ({drafter}) failed too: "
            f"{str(barrier.error).splitlines()[0]}{told}\nTHE NODE GROUP IS SERVING NOTHING (every node was stopped)",
            exit_code=ExitCode.FAILED)
    progress("*", "rollback", "FAILED: the node group is serving nothing")
