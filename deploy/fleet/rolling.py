"""Rolling redeploys behind SGLang's router, built from run-level phases.

Per batch of ``--serial N`` hosts: check which of them would only converge (already running as
desired: nothing to redeploy) and keep those in the router, unless the playbook benchmarks them;
take the others' workers out of the router (a replica whose drafter would swap in place too, issue 41:
SGLang's model-update lock holds its new requests during the session, docs/drafter-swap.md), wait until SGLang reports
nothing in flight on them (``/v1/loads``; bounded by the router's ``drain_timeout_s``), run the
playbook on the batch (converge, rollback and host locks as usual), put the hosts that serve a
verified deployment back (a host rolled back to its last good deployment included), and only
then the next batch. The first failing batch stops the run; later batches stay as they were. At
the end the router runs with every serving replica and one request through it must succeed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from deploy.config.models import Host
from deploy.base.errors import DeployError, ExitCode
from deploy.fleet.phases import HostPhase, Phase, RunPhase, RunState, left_at, rotation_of
from deploy.facts.router import DownRouter, StopAnswer, Worker
from deploy.fleet.router import empties_the_router, loopback_problem
from deploy.fleet.router_plan import RUNNING
from deploy.fleet.router_watch import RouterLost


class LastHealthyWorker(DeployError):
    exit_code = ExitCode.USAGE


class PreflightFailed(DeployError):
    """A router or replica check failed before any replica was touched (like the doctor: exit 8)."""
    exit_code = ExitCode.VERIFY


def probe_actions(host: Host, run, stamp: str):
    """The pre-drain probe's two read-only commands (the doctor's read, the drafter's fingerprint)
    and the context they are built in; ``plan`` lists the same two."""
    from deploy.facts.doctor import doctor_command, run_state_spec
    from deploy.facts.helpers import HELPER_FILES
    from deploy.steps import converge
    from deploy.steps.base import Command, StepContext
    from deploy.steps.fix_keys import fingerprint_command
    from deploy.steps.wait_ready import health_url

    ctx = StepContext(host=host, run=run, settings=converge.Settings(step="converge"), conn=None,
                      launch_stamp=stamp)
    spec = run_state_spec(host, list(HELPER_FILES), health_url(ctx))
    when = "the router runs and --force is not given (a host found unchanged stays in the router)"
    return ctx, (Command(description="probe (read-only): the doctor's read of SGLang's version and the running server",
                         command=doctor_command(host, run, run_state=spec), timeout_s=90, when=when),
                 Command(description="probe (read-only): the drafter's fingerprint", command=fingerprint_command(ctx),
                         timeout_s=600, when=when))


def fixer_not_uploaded(helpers: Mapping[str, str | None]) -> str | None:
    """Why the fingerprint probe is not sent to a host, or None. A fresh host has no key fixer yet
    (ensure-helper uploads it in the redeploy): asking it for the fingerprint only got python's
    "can't open file .../helpers/fixer.pyz", which read like a failure. The doctor's read just
    before says which helpers are there (their sha256, None when absent)."""
    from deploy.steps.fix_keys import FIXER

    if helpers.get(FIXER) is None:
        return "fixer not on the host yet; uploading it with the redeploy"
    return None


def _unchanged(state: RunState, host: Host) -> tuple[str, str]:
    """("unchanged"|"redeploy", why): would the playbook only converge on ``host`` (a replica whose
    drafter would swap in place is redeployed: drained first, then swapped)? Read-only: the doctor's command (SGLang's version, the running server and its
    record) and the drafter's fingerprint, judged by converge's own rule and ``swap_decision``."""
    from deploy.engine.session import network_host
    from deploy.facts.doctor import facts_of
    from deploy.facts.fixer import parse_fingerprint
    from deploy.facts.server import snapshot_of
    from deploy.steps import converge
    from deploy.steps.fix_keys import store_path
    from deploy.ssh.transport import HostConnection

    with HostConnection(host, state.config.ssh, state.jumps) as conn:
        host = network_host(host, conn.endpoint.hostname.value)
        ctx, (doctor, fingerprint_call) = probe_actions(host, state.run, state.stamp)
        ctx.conn = conn
        facts, sglang, why = facts_of(conn.run(doctor.command, timeout=doctor.timeout_s), host, state.run)
        if sglang is None or sglang.version is None or facts.run_state is None:
            return "redeploy", f"SGLang's version is unknown ({why or sglang and sglang.version_error})"
        snapshot = snapshot_of(facts.run_state, facts.python.version, host.name, host.state_dir)
        fresh = fixer_not_uploaded(snapshot.helpers)
        if fresh is not None:
            return "redeploy", fresh
        server = snapshot.server
        result = conn.run(fingerprint_call.command, timeout=fingerprint_call.timeout_s)
        fingerprint = parse_fingerprint(result.exit_code, result.stdout, result.stderr, host.name).fingerprint
        from deploy.doctor.speculation import draft_quantization_flag
        from deploy.doctor.verdict import DoctorInput
        from deploy.host.deployment import desired_deployment

        # what the playbook's launch would start here, with the doctor step's own decisions
        desired = desired_deployment(state.run, host, state.run.draft_tokens, drafter_path=store_path(ctx, fingerprint),
                                     drafter_fingerprint=fingerprint, sglang_version=sglang.version,
                                     draft_quantization=draft_quantization_flag(
                                         DoctorInput(host, state.run, state.run.draft_tokens, facts, sglang)))
        unchanged, why = converge.would_converge(desired, server)
        return probe_verdict(unchanged, why, None if unchanged else _drafter_swap_reason(state, desired, server))


def probe_verdict(unchanged: bool, why: str, swap: str | None) -> tuple[str, str]:
    """A replica stays in the router only when it is unchanged. One whose drafter would swap in place
    is taken out and drained first like a redeployed one (issue 41; ``_drafter_swap_reason`` says why)."""
    if unchanged:
        return "unchanged", why
    if swap is not None:
        return "redeploy", f"drafter swap, drained first: {swap}"
    return "redeploy", why


def _drafter_swap_reason(state: RunState, desired, server) -> str | None:
    """Why ``swap_decision`` would swap this replica's drafter (so far: the host's drafters and GPU
    memory are judged by the step), or None. Such a replica is drained first like any other (issue 41):
    each of SGLang's begin, update and end waits for every in-flight request and holds new ones back
    (``model_update_lock``, tokenizer_control_mixin.py 0.5.21 - 0.5.23), up to three times the
    longest request; drained, those requests go to the other replicas instead."""
    from deploy.steps.swap_decision import RunningServer, swap_decision

    step = next((s for s in state.playbook.steps if s.name == "swap-drafter" and s.settings.enabled), None)
    if step is None:
        return None
    mode = step.settings.mode  # type: ignore[attr-defined]
    decision = swap_decision(state.run, desired, RunningServer(server.record, server.alive, server.status, server.pid),
                             None, None if mode == "run" else mode)
    return decision.reason if decision.path == "swap" else None


# -- the phases, each one builder (fleet/phases.py RunPhase): the run and ``plan`` walk the same body --

NOT_RUNNING = "the router is not running yet (it starts with the hosts that serve)"


def last_healthy_worker(batch: Sequence[Host], members: list[Worker], leaving: Sequence[str],
                        allow_downtime: bool) -> LastHealthyWorker | None:
    """The batch's refusal on the router's own list: taking ``leaving`` out would leave no healthy
    worker (the rule itself: router.empties_the_router, which the Rollout asks of a typed --serial)."""
    others = [w for w in members if w.url not in leaving and w.is_healthy]
    if not empties_the_router(len([w for w in members if w.url in leaving]), len(others), allow_downtime):
        return None
    return LastHealthyWorker(
        f"taking {', '.join(h.name for h in batch)} out of the router would leave it no healthy worker "
        f"(members: {', '.join(w.url + (' healthy' if w.is_healthy else ' unhealthy') for w in members)}); "
        "nothing was changed; --allow-downtime to do it anyway")


def _probe(batch: tuple[Host, ...]):
    def body(ctx) -> str:
        seen = ctx.watch(f"before the check of {names(batch)}")
        if ctx.stops(seen is None, "the router is not running yet: nothing to keep in it", RUNNING):
            return "router not running yet: nothing to keep in it"
        if ctx.stops(ctx.force, "--force is given: every host of the batch is redeployed"):
            return "--force: every host of the batch is redeployed"
        outcomes = ctx.on_hosts(batch, lambda h: _unchanged(ctx.state, h),
                                lambda h: probe_actions(ctx.network(h), ctx.run, ctx.stamp)[1])
        kept: list[str] = []
        redeploy: list[str] = []
        for outcome in outcomes:
            verdict, why = outcome.value if outcome.value is not None else ("redeploy", f"not checked: {outcome.error}")
            (kept if verdict == "unchanged" else redeploy).append(
                outcome.host.name if verdict == "unchanged" else f"{outcome.host.name} ({why})")
        ctx.memory.kept.update(kept)
        now = time.monotonic()
        for name in kept:
            rotation_of(ctx, ctx.config.host(name)).kept = now
        return f"unchanged, kept in the router: {', '.join(kept) or '-'}; to redeploy: {'; '.join(redeploy) or '-'}"
    return body


def _remove(batch: tuple[Host, ...], allow_downtime: bool):
    def body(ctx) -> str:
        seen = ctx.watch(f"before taking {names(batch)} out")
        if ctx.stops(seen is None, "the router is not running yet: nothing to take out", RUNNING):
            ctx.memory.router_running = False
            return "router not running yet: nothing to take out"
        ctx.memory.router_running = True
        urls = {ctx.url(h): h for h in batch if h.name not in ctx.memory.kept}
        members = ctx.router.workers()
        ctx.refuse(lambda: last_healthy_worker(batch, members, list(urls), allow_downtime),
                   "taking the batch out would leave the router no healthy worker and --allow-downtime is not "
                   "given (exit 2, nothing changed)")
        leaving = [w for w in members if w.url in urls]
        for w in leaving:
            for _ in ctx.only_when(True, f"the router lists {urls[w.url].name} and the probe did not keep it"):
                # out of rotation from when the router stopped sending it new requests, not when it left
                # the list (smg lists it, unhealthy, for its 5 s drain settle)
                rotation_of(ctx, urls[w.url]).out = ctx.router.remove(w.url, settle=False)
        return f"removed {len(leaving)} worker(s): {', '.join(w.url for w in leaving) or '-'}"
    return body


def _drain(batch: tuple[Host, ...]):
    def body(ctx) -> str:
        if ctx.stops(not ctx.memory.router_running, "the router was not running at the router-remove: "
                                                    "nothing to drain", RUNNING):
            return "nothing to drain"
        waited = []
        for host in batch:
            if left_at(ctx, host) is None:
                continue
            seconds = ctx.router.drain(ctx.url(host), ctx.run.router.drain_timeout_s)
            waited.append(f"{host.name} {seconds:.2f} s")
        ctx.watch(f"while {names(batch)} drained (not redeployed)")  # never redeploy behind a dead router
        return "drained: " + (", ".join(waited) or "-")
    return body


def _join(ctx, urls: list[str]) -> str:
    """``urls`` into the router: started with them when this run has not seen it running, else added
    (after the batch's removed workers left its list: smg refuses a URL it still lists)."""
    first = ctx.memory.router_pid is None  # the run's first router start (up): its first verified batch
    done = ""
    for _ in ctx.only_when(first, NOT_RUNNING):
        ctx.started(ctx.router.start(urls, ctx.stamp))
        done = "started the router with " + ", ".join(urls)
    for _ in ctx.only_when(not first, RUNNING):
        ctx.router.settled()  # the batch's removed workers have left the list (smg's drain settle)
        listed = {w.url for w in ctx.router.workers()}  # a host kept in the router is listed already
        for url in urls:
            for _ in ctx.only_when(url not in listed, f"it does not list {url}"):
                ctx.router.add(url)
        done = "added " + (", ".join(u for u in urls if u not in listed) or "- (every serving host is in it)")
    return done


def _add(batch: tuple[Host, ...]):
    def body(ctx) -> str:
        serving = ctx.serving(batch)
        # taken out but never redeployed (the drain timed out): still serving what it served
        serving += [h for h in batch if h not in serving and h.name not in ctx.reports and left_at(ctx, h) is not None]
        lost = ctx.router_lost(f"while {names(batch)} was redeployed")
        if lost is not None:
            return lost
        if ctx.stops(not serving and not any(h.name in ctx.reports or left_at(ctx, h) is not None for h in batch),
                     "nothing of this batch was taken out or redeployed"):
            return "nothing of this batch was taken out or redeployed: nothing to add"
        if ctx.stops(not serving, "no host of this batch serves a verified deployment"):
            return "no host of this batch serves a verified deployment: none added"
        added = _join(ctx, [ctx.url(h) for h in serving])
        now = time.monotonic()
        for host in serving:
            rotation_of(ctx, host).back = now
        return added
    return body


def _final(hosts: Sequence[Host]):
    def body(ctx) -> str:
        urls = [ctx.url(h) for h in ctx.serving(hosts)]
        lost = ctx.router_lost("before the end-to-end request")
        if lost is not None:
            raise RouterLost(lost)
        _join(ctx, urls)
        ctx.memory.end_to_end = ctx.router.end_to_end()
        return f"a request through {ctx.router.url} answered ({len(urls)} worker(s))"
    return body


def names(batch: Sequence[Host]) -> str:
    return ",".join(h.name for h in batch)


def _doctor_settings(playbook):
    return next((s.settings for s in playbook.steps if s.name == "doctor"), None) if playbook is not None else None


def preflight_refusal(problems: list[str]) -> PreflightFailed | None:
    if not problems:
        return None
    return PreflightFailed("fleet pre-flight failed; no replica was stopped, each keeps serving what it "
                           "served:\n" + "\n".join(problems))


def _preflight(hosts: Sequence[Host], playbook):
    """Before the first replica is stopped: every router check (package and policy, port, every
    worker URL reachable from the router host) and every replica's doctor. A failure leaves every
    replica as it was (sglang-router 0.3 runs used to redeploy batch 1, then fail at router-add)."""
    def body(ctx) -> str:
        from deploy.doctor.checks import failed
        from deploy.facts.doctor import doctor_command
        from deploy.steps.base import Command
        from deploy.steps.doctor import diagnose, failure_text
        from deploy.ssh.transport import HostConnection

        router = ctx.router
        problems: list[str] = []
        router_results = ctx.router_checks()
        problems += [f"{router.host.name}: {c.name}: {c.reason}" + (f" (fix: {c.fix})" if c.fix else "")
                     for c in failed(router_results)]
        package = next((c.reason for c in router_results if c.name == "router-package" and c.status == "pass"), "")
        urls = [ctx.url(h) for h in hosts]
        unreachable = router.unreachable(urls)
        if unreachable:
            problems.append(f"{router.host.name} cannot reach worker URL(s) {'; '.join(unreachable)}: the router "
                            "would not reach them either (a run's hosts must be reachable at their address, or "
                            "their ssh_config HostName, from the router host)")
        settings = _doctor_settings(playbook)
        doctored = ""
        if settings is not None:
            fix_keys = bool(getattr(settings, "fix_keys_will_run", True))

            def doctor(host: Host):
                with HostConnection(host, ctx.config.ssh, ctx.state.jumps) as conn:
                    return diagnose(conn, ctx.network(host), ctx.run, fix_keys_will_run=fix_keys,
                                    settings=settings)[0]

            def planned(host: Host) -> list[Command]:
                return [Command(description="the doctor's read on every replica before the first is stopped",
                                command=doctor_command(ctx.network(host), ctx.run,
                                                       script="<deploy/remote/doctor_facts.py>"))]

            for outcome in ctx.on_hosts(hosts, doctor, planned, cancel=True):
                if outcome.error is not None:
                    problems.append(f"{outcome.host.name}: {str(outcome.error).splitlines()[0]}")
                elif failed(outcome.value or []) and not settings.ignore:
                    problems.append(failure_text(outcome.host.name, outcome.value))
            doctored = f"; the doctor passed on {', '.join(h.name for h in hosts)}" + (
                " (--ignore-doctor: failures reported, not stopping)" if settings.ignore else "")
        ctx.refuse(lambda: preflight_refusal(problems), "a router check or a replica's doctor fails (exit 8): "
                                                        "no replica is stopped")
        shown = ", ".join(f"{h.name} {u}" for h, u in zip(hosts, urls))
        return f"router: {package or 'ok'}; every worker URL reachable from {router.host.name} ({shown}){doctored}"
    return body


def keep_unchanged(playbook) -> bool:
    """Probe each batch and keep the hosts that would only converge in the router, unless the
    playbook benchmarks (bench_serving must not compete with the router's traffic)."""
    return not any(s.name == "benchmark" and s.settings.enabled for s in playbook.steps)


def fleet_phases(rollout, playbook) -> list[Phase]:
    """The run-level phases of ``rollout`` (fleet/rollout.py: its checked batches), in order."""
    hosts, has_router = list(rollout.hosts), rollout.run.router is not None
    probe = has_router and keep_unchanged(playbook)
    phases: list[Phase] = []
    if has_router:
        phases.append(RunPhase("pre-flight: router checks, every replica's doctor", _preflight(hosts, playbook)))
    groups = rollout.batches
    canary = None
    if has_router and rollout.canary is not None:
        from deploy.fleet.canary import canary_phases

        canary = canary_phases(rollout.canary, groups[0], playbook)
        phases.append(canary[0])
    for i, batch in enumerate(groups, 1):
        tag = f"batch {i}/{len(groups)}" + (" (canary)" if canary is not None and i == 1 else "")
        names = ",".join(h.name for h in batch)
        if probe:
            phases.append(RunPhase(f"{tag} check unchanged {names}", _probe(batch)))
        if has_router:
            phases.append(RunPhase(f"{tag} router-remove {names}", _remove(batch, rollout.allow_downtime)))
            phases.append(RunPhase(f"{tag} drain {names}", _drain(batch)))
        phases.append(HostPhase(batch, f"{tag} redeploy {names}"))
        if has_router:
            phases.append(RunPhase(f"{tag} router-add {names}", _add(batch), always=True))
        if canary is not None and i == 1:
            phases.append(canary[1])
    if has_router:
        phases.append(RunPhase("router end-to-end", _final(hosts)))
    return phases


def refuse_statically(config, rollout, endpoints: dict | None = None) -> None:
    """What the fleet refuses from the config alone, asked by its plan and by its run before anything
    is read or changed (issue 37: replicas on loopback behind a router on another host were refused
    by `up`'s pre-flight, exit 8, while `plan` printed a plan and exited 0). PreflightFailed (exit 8)."""
    from deploy.engine.session import network_host

    run = rollout.run
    if run.router is None:
        return
    if endpoints is None or any(h.name not in endpoints for h in rollout.hosts):
        from deploy.engine.plan import describe_endpoints

        endpoints = {**(endpoints or {}), **describe_endpoints(list(rollout.hosts), config)}
    seen = {h.name: network_host(h, endpoints.get(h.name, {}).get("hostname", {}).get("value", h.address))
            for h in rollout.hosts}
    problems = [p for p in (loopback_problem(run, seen[h.name], run.router.host) for h in rollout.hosts) if p]
    if problems:
        raise PreflightFailed("fleet pre-flight failed; no replica was stopped, each keeps serving what it "
                              "served:\n" + "\n".join(problems))


def run_fleet(config, playbook, rollout, progress, options):
    """The playbook over the rollout's hosts in its batches, with the router's phases between them:
    what the config alone refuses first, then every host's lock (all or nothing: a refusal changes
    nothing anywhere, the router included), then the phases, each host's session using its lock."""
    import dataclasses
    import threading

    from deploy.fleet.phases import RunState, close_router, hold_host_locks, run_phases
    from deploy.engine.records import launch_stamp
    from deploy.ssh.transport import JumpConnections

    refuse_statically(config, rollout)
    playbook = rollout.playbook(playbook)
    with JumpConnections() as jumps, hold_host_locks(config, rollout.hosts if options.lock else (),
                                                     options.owner or {}, progress, jumps) as taken:
        options = dataclasses.replace(options, held_locks=taken)
        state = RunState(config, rollout.run, playbook, options, progress, jumps, threading.Event(),
                         launch_stamp())
        try:
            return run_phases(state, list(rollout.hosts), fleet_phases(rollout, playbook))
        finally:
            close_router(state)


def run_down(config, playbook, rollout, progress, options):
    """``down`` of a run behind a router: every host's lock first, then (``--host`` that leaves some of
    the run's replicas up) the downed replicas out of the router, the down playbook on the hosts with
    their locks, and (the whole run) the router stopped last. A lock refusal changes nothing: the
    router is never touched for a host whose lock another deployctl holds (issue 37)."""
    import dataclasses

    from deploy.base.errors import DeployError
    from deploy.engine.run import run_playbook
    from deploy.fleet.phases import DownResult, hold_host_locks
    from deploy.ssh.transport import JumpConnections

    run = rollout.run
    with JumpConnections() as jumps, hold_host_locks(config, rollout.hosts if options.lock else (),
                                                     options.owner or {}, progress, jumps) as taken:
        options = dataclasses.replace(options, held_locks=taken)
        router = DownRouter(host=run.router.host)
        if not rollout.whole:
            router = remove_from_router(config, run, list(rollout.hosts), progress, router)
        reports = run_playbook(config, playbook, run, list(rollout.hosts), progress, options)
        error = None
        if rollout.whole:
            try:
                router = stop_router(config, run, progress, router)
            except DeployError as exc:
                progress(run.router.host, "router", f"FAILED: {exc}")
                router = router.but(error=str(exc), exit_code=int(exc.exit_code))
                error = exc
    return DownResult(reports, router, error)


def down_remove(hosts: Sequence[Host], result: list[DownRouter]) -> RunPhase:
    """``down --host``: the router keeps serving the run's other replicas, so the downed ones leave
    it first (a stopped worker would still get requests until the router's health checks caught
    up). The router itself stops only when the whole run is brought down. ``result``: the one
    ``DownRouter`` it replaces with what it did."""
    def body(ctx) -> str:
        at = ctx.run.router.host
        if ctx.stops(not ctx.router.running(), "the router is not running: no worker to remove", RUNNING):
            ctx.say(at, "router", "not running: no worker to remove")
            result[0] = result[0].but(stopped=False, removed=[], note="the router is not running")
            return "the router is not running"
        listed = {w.url for w in ctx.router.workers()}
        removed = [u for u in (ctx.url(h) for h in hosts) if u in listed]
        for url in removed:
            for _ in ctx.only_when(True, f"the router lists {url}"):
                ctx.router.remove(url)
                ctx.say(at, "router", f"removed {url} (its server is being stopped)")
        result[0] = result[0].but(stopped=False, removed=removed, note="the router keeps serving the run's other "
                                                                       "replicas; stopped only by a down of the whole run")
        return f"removed {', '.join(removed) or '-'}"
    return RunPhase("router-remove " + names(hosts), body)


def down_stop(result: list[DownRouter]) -> RunPhase:
    """``down`` of the whole run: stop its router (by its PID file) before its servers."""
    def body(ctx) -> str:
        at = ctx.run.router.host
        got: StopAnswer = ctx.router.stop()
        result[0] = result[0].but(**got.model_dump())
        ctx.say(at, "router", f"stopped pid {got.pid} (SIG{got.signal})" if got.stopped else got.note or "not stopped")
        ctx.refuse(lambda: DeployError(f"{at}: the router (pid {got.pid}) survived SIGKILL", exit_code=ExitCode.FAILED)
                   if not got.stopped and got.signal else None,
                   "the router survives SIGKILL (exit 1)")
        return "stopped" if got.stopped else got.note or "not stopped"
    return RunPhase("router stop", body)


def _down_phase(config, run, progress, phase: RunPhase) -> None:
    """One of ``down``'s router phases, on a router connection of its own."""
    from deploy.fleet.phases import RunState, close_router
    from deploy.ssh.transport import JumpConnections

    with JumpConnections() as jumps:
        state = RunState(config, run, None, None, progress, jumps, None, "")  # type: ignore[arg-type]
        try:
            phase.action(state)
        finally:
            close_router(state)


def stop_router(config, run, progress, router: DownRouter) -> DownRouter:
    result = [router]
    _down_phase(config, run, progress, down_stop(result))
    return result[0]


def remove_from_router(config, run, hosts, progress, router: DownRouter) -> DownRouter:
    result = [router]
    _down_phase(config, run, progress, down_remove(hosts, result))
    return result[0]
