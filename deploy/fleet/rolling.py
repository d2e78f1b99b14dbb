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
from deploy.fleet.phases import (SERVING_OUTCOMES, HostPhase, Phase, RunPhase, RunState, open_router)
from deploy.fleet.router import loopback_problem, worker_url
from deploy.fleet.router_watch import RouterLost, lost_or_restarted, started, watch


class LastHealthyWorker(DeployError):
    exit_code = ExitCode.USAGE


class PreflightFailed(DeployError):
    """A router or replica check failed before any replica was touched (like the doctor: exit 8)."""
    exit_code = ExitCode.VERIFY


def network(state: RunState, host: Host) -> Host:
    """``host`` as the network sees it (an ssh_config alias resolved to its HostName, read from
    ssh_config once per run, no connection): its worker URL is where the router reaches it."""
    from deploy.engine.session import network_host

    addresses = state.data.get("addresses")
    if addresses is None:
        from deploy.engine.plan import describe_endpoints

        endpoints = describe_endpoints(state.config.hosts_of(state.run), state.config)
        addresses = state.data["addresses"] = {
            name: e.get("hostname", {}).get("value") for name, e in endpoints.items()}
    return network_host(host, addresses.get(host.name) or host.address)


def url_of(state: RunState, host: Host) -> str:
    return worker_url(state.run, network(state, host))


def _serving(state: RunState, hosts: Sequence[Host]) -> list[Host]:
    return [h for h in hosts if h.name in state.reports and state.reports[h.name].outcome in SERVING_OUTCOMES]


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
        return probe_verdict(unchanged, why, None if unchanged else _swaps_in_place(state, desired, server))


def probe_verdict(unchanged: bool, why: str, swap: str | None) -> tuple[str, str]:
    """A replica stays in the router only when it is unchanged. One whose drafter would swap in place
    is taken out and drained first like a redeployed one (issue 41; ``_swaps_in_place`` says why)."""
    if unchanged:
        return "unchanged", why
    if swap is not None:
        return "redeploy", f"drafter swap, drained first: {swap}"
    return "redeploy", why


def _swaps_in_place(state: RunState, desired, server) -> str | None:
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


def _probe(batch: tuple[Host, ...]):
    def action(state: RunState) -> str:
        from deploy.engine.fanout import for_each_host

        router = open_router(state)
        if watch(state, router, f"before the check of {names(batch)}") is None:
            return "router not running yet: nothing to keep in it"
        if state.options.force:
            return "--force: every host of the batch is redeployed"
        outcomes = for_each_host(list(batch), lambda h: _unchanged(state, h), state.config.ssh.max_parallel)
        kept: list[str] = []
        redeploy: list[str] = []
        for outcome in outcomes:
            verdict, why = outcome.value if outcome.value is not None else ("redeploy", f"not checked: {outcome.error}")
            (kept if verdict == "unchanged" else redeploy).append(
                outcome.host.name if verdict == "unchanged" else f"{outcome.host.name} ({why})")
        state.data.setdefault("kept", set()).update(kept)
        now = time.monotonic()
        for name in kept:
            state.rotation.setdefault(name, {})["kept"] = now
        return f"unchanged, kept in the router: {', '.join(kept) or '-'}; to redeploy: {'; '.join(redeploy) or '-'}"
    return action


def _remove(batch: tuple[Host, ...], allow_downtime: bool):
    def action(state: RunState) -> str:
        router = open_router(state)
        if watch(state, router, f"before taking {names(batch)} out") is None:
            state.data["router_running"] = False
            return "router not running yet: nothing to take out"
        state.data["router_running"] = True
        kept = state.data.get("kept", set())
        urls = {url_of(state, h): h for h in batch if h.name not in kept}
        members = router.workers()
        others = [w for w in members if w["url"] not in urls and w["is_healthy"]]
        leaving = [w for w in members if w["url"] in urls]
        if leaving and not others and not allow_downtime:
            raise LastHealthyWorker(
                f"taking {', '.join(h.name for h in batch)} out of the router would leave it no healthy worker "
                f"(members: {', '.join(w['url'] + (' healthy' if w['is_healthy'] else ' unhealthy') for w in members)}); "
                "nothing was changed; --allow-downtime to do it anyway")
        for w in leaving:
            # out of rotation from when the router stopped sending it new requests, not when it left
            # the list (smg lists it, unhealthy, for its 5 s drain settle)
            state.rotation.setdefault(urls[w["url"]].name, {})["out"] = router.remove(w["url"], settle=False)
        return f"removed {len(leaving)} worker(s): {', '.join(w['url'] for w in leaving) or '-'}"
    return action


def _drain(batch: tuple[Host, ...]):
    def action(state: RunState) -> str:
        if not state.data.get("router_running"):
            return "nothing to drain"
        router = open_router(state)
        waited = []
        for host in batch:
            if "out" not in state.rotation.get(host.name, {}):
                continue
            seconds = router.drain(url_of(state, host), router.spec.drain_timeout_s)
            waited.append(f"{host.name} {seconds:.2f} s")
        watch(state, router, f"while {names(batch)} drained (not redeployed)")  # never redeploy behind a dead router
        return "drained: " + (", ".join(waited) or "-")
    return action


def _add(batch: tuple[Host, ...]):
    def action(state: RunState) -> str:
        serving = _serving(state, batch)
        # taken out but never redeployed (the drain timed out): still serving what it served
        serving += [h for h in batch if h.name not in state.reports and "out" in state.rotation.get(h.name, {})]
        router = open_router(state)
        lost = _router_lost(state, router, f"while {names(batch)} was redeployed")
        if lost is not None:
            return lost
        if not serving and not any(h.name in state.reports or "out" in state.rotation.get(h.name, {}) for h in batch):
            return "nothing of this batch was taken out or redeployed: nothing to add"
        if not serving:
            return "no host of this batch serves a verified deployment: none added"
        urls = [url_of(state, h) for h in serving]
        if "router_pid" not in state.data:  # the run's first router start (up): its first verified batch
            started(state, router.start(urls, state.stamp))
            added = "started the router with " + ", ".join(urls)
        else:
            router.settled()  # the batch's removed workers have left the list (smg's drain settle)
            listed = {w["url"] for w in router.workers()}  # a host kept in the router is listed already
            for url in urls:
                if url not in listed:
                    router.add(url)
            added = "added " + (", ".join(u for u in urls if u not in listed) or "- (every serving host is in it)")
        now = time.monotonic()
        for host in serving:
            state.rotation.setdefault(host.name, {})["in"] = now
        return added
    return action


def _final(hosts: Sequence[Host]):
    def action(state: RunState) -> str:
        router = open_router(state)
        serving = _serving(state, hosts)
        urls = [url_of(state, h) for h in serving]
        lost = _router_lost(state, router, "before the end-to-end request")
        if lost is not None:
            raise RouterLost(lost)
        if "router_pid" not in state.data:
            started(state, router.start(urls, state.stamp))
        else:
            router.settled()
            listed = {w["url"] for w in router.workers()}
            for url in urls:
                if url not in listed:
                    router.add(url)
        answer = router.end_to_end()
        state.data["end_to_end"] = answer
        return f"a request through {router.url} answered ({len(urls)} worker(s))"
    return action


def names(batch: Sequence[Host]) -> str:
    return ",".join(h.name for h in batch)


def _router_lost(state: RunState, router, when: str) -> str | None:
    """router_watch.lost_or_restarted over the run's replicas, at their worker URLs."""
    return lost_or_restarted(state, router, when, state.config.hosts_of(state.run), lambda h: url_of(state, h),
                             lambda h: bool(_serving(state, [h])) or h.name not in state.reports)


def _doctor_settings(playbook):
    return next((s.settings for s in playbook.steps if s.name == "doctor"), None) if playbook is not None else None


def _preflight(hosts: Sequence[Host]):
    """Before the first replica is stopped: every router check (package and policy, port, every
    worker URL reachable from the router host) and every replica's doctor. A failure leaves every
    replica as it was (sglang-router 0.3 runs used to redeploy batch 1, then fail at router-add)."""
    def action(state: RunState) -> str:
        from deploy.doctor.checks import failed
        from deploy.engine.fanout import for_each_host
        from deploy.fleet.doctor import router_checks
        from deploy.steps.doctor import diagnose, failure_text
        from deploy.ssh.transport import HostConnection

        router = open_router(state)
        problems: list[str] = []
        router_results = router_checks(router.conn, router.host, state.run)
        problems += [f"{router.host.name}: {c.name}: {c.reason}" + (f" (fix: {c.fix})" if c.fix else "")
                     for c in failed(router_results)]
        package = next((c.reason for c in router_results if c.name == "router-package" and c.status == "pass"), "")
        urls = [url_of(state, h) for h in hosts]
        unreachable = router.unreachable(urls)
        if unreachable:
            problems.append(f"{router.host.name} cannot reach worker URL(s) {'; '.join(unreachable)}: the router "
                            "would not reach them either (a run's hosts must be reachable at their address, or "
                            "their ssh_config HostName, from the router host)")
        settings = _doctor_settings(state.playbook)
        doctored = ""
        if settings is not None:
            fix_keys = bool(getattr(settings, "fix_keys_will_run", True))

            def doctor(host: Host):
                with HostConnection(host, state.config.ssh, state.jumps) as conn:
                    return diagnose(conn, network(state, host), state.run, fix_keys_will_run=fix_keys,
                                    settings=settings)[0]

            for outcome in for_each_host(list(hosts), doctor, state.config.ssh.max_parallel, cancel=state.cancelled):
                if outcome.error is not None:
                    problems.append(f"{outcome.host.name}: {str(outcome.error).splitlines()[0]}")
                elif failed(outcome.value or []) and not settings.ignore:
                    problems.append(failure_text(outcome.host.name, outcome.value))
            doctored = f"; the doctor passed on {', '.join(h.name for h in hosts)}" + (
                " (--ignore-doctor: failures reported, not stopping)" if settings.ignore else "")
        if problems:
            raise PreflightFailed("fleet pre-flight failed; no replica was stopped, each keeps serving what it "
                                  "served:\n" + "\n".join(problems))
        shown = ", ".join(f"{h.name} {u}" for h, u in zip(hosts, urls))
        return f"router: {package or 'ok'}; every worker URL reachable from {router.host.name} ({shown}){doctored}"
    return action


def _preflight_plan(hosts: Sequence[Host]):
    def plan(view) -> list[tuple[str, Any]]:
        from deploy.facts.doctor import doctor_command
        from deploy.fleet.router_ports import router_binds
        from deploy.steps.base import Command

        calls, at = view.calls, view.router_host
        spec = view.run.router
        router_host = view.network(view.config.host(at))
        steps: list[tuple[str, Any]] = [
            (at, calls.packages()),
            (at, calls.state()),
            (at, calls.ports(router_binds(spec, router_host, None if spec.package == "auto" else spec.package))),
            (at, calls.reach([worker_url(view.run, view.network(h)) for h in hosts]))]
        steps += [(h.name, Command(description="the doctor's read on every replica before the first is stopped",
                                   command=doctor_command(view.network(h), view.run,
                                                          script="<deploy/remote/doctor_facts.py>")))
                  for h in hosts]
        return steps
    return plan


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
        phases.append(RunPhase("pre-flight: router checks, every replica's doctor", _preflight(hosts),
                               plan=_preflight_plan(hosts)))
    groups = rollout.batches
    canary = None
    if has_router and rollout.canary is not None:
        from deploy.fleet.canary import canary_phases

        canary = canary_phases(rollout.canary, groups[0], playbook, url_of)
        phases.append(canary[0])
    for i, batch in enumerate(groups, 1):
        tag = f"batch {i}/{len(groups)}" + (" (canary)" if canary is not None and i == 1 else "")
        names = ",".join(h.name for h in batch)
        if probe:
            phases.append(RunPhase(f"{tag} check unchanged {names}", _probe(batch),
                                   plan=_probe_plan(batch)))
        if has_router:
            phases.append(RunPhase(f"{tag} router-remove {names}", _remove(batch, rollout.allow_downtime),
                                   plan=_remove_plan(batch)))
            phases.append(RunPhase(f"{tag} drain {names}", _drain(batch), plan=_drain_plan(batch)))
        phases.append(HostPhase(batch, f"{tag} redeploy {names}"))
        if has_router:
            phases.append(RunPhase(f"{tag} router-add {names}", _add(batch), always=True,
                                   plan=_join_plan(batch)))
        if canary is not None and i == 1:
            phases.append(canary[1])
    if has_router:
        phases.append(RunPhase("router end-to-end", _final(hosts), plan=_join_plan(hosts, end_to_end=True)))
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
        router: dict[str, Any] = {"host": run.router.host}
        if not rollout.whole:
            router |= remove_from_router(config, run, list(rollout.hosts), progress)
        reports = run_playbook(config, playbook, run, list(rollout.hosts), progress, options)
        error = None
        if rollout.whole:
            try:
                router |= stop_router(config, run, progress)
            except DeployError as exc:
                progress(run.router.host, "router", f"FAILED: {exc}")
                router |= {"error": str(exc), "exit_code": int(exc.exit_code)}
                error = exc
    return DownResult(reports, router, error)


def stop_router(config, run, progress) -> dict:
    """``down``: stop the run's router (by its PID file) before its servers."""
    from deploy.fleet.phases import RunState, close_router, open_router
    from deploy.ssh.transport import JumpConnections

    with JumpConnections() as jumps:
        state = RunState(config, run, None, None, progress, jumps, None, "")  # type: ignore[arg-type]
        try:
            router = open_router(state)
            result = router.stop()
        finally:
            close_router(state)
    progress(run.router.host, "router", f"stopped pid {result['pid']} (SIG{result['signal']})" if result.get("stopped")
             else result.get("note") or "not stopped")
    if not result.get("stopped") and result.get("signal"):
        raise DeployError(f"{run.router.host}: the router (pid {result['pid']}) survived SIGKILL", exit_code=ExitCode.FAILED)
    return result


def remove_from_router(config, run, hosts, progress) -> dict:
    """``down --host``: the router keeps serving the run's other replicas, so the downed ones leave
    it first (a stopped worker would still get requests until the router's health checks caught
    up). The router itself stops only when the whole run is brought down."""
    from deploy.fleet.phases import RunState, close_router, open_router
    from deploy.engine.plan import describe_endpoints
    from deploy.engine.session import network_host
    from deploy.ssh.transport import JumpConnections

    endpoints = describe_endpoints(hosts, config)
    urls = [worker_url(run, network_host(h, endpoints.get(h.name, {}).get("hostname", {}).get("value", h.address)))
            for h in hosts]
    with JumpConnections() as jumps:
        state = RunState(config, run, None, None, progress, jumps, None, "")  # type: ignore[arg-type]
        try:
            router = open_router(state)
            if not router.running():
                progress(run.router.host, "router", "not running: no worker to remove")
                return {"stopped": False, "removed": [], "note": "the router is not running"}
            listed = {w["url"] for w in router.workers()}
            removed = [u for u in urls if u in listed]
            for url in removed:
                router.remove(url)
                progress(run.router.host, "router", f"removed {url} (its server is being stopped)")
        finally:
            close_router(state)
    return {"stopped": False, "removed": removed,
            "note": "the router keeps serving the run's other replicas; stopped only by a down of the whole run"}


# -- what each phase sends, for ``plan`` (the same builders as the actions above) ----------------

RUNNING = "the router runs"
NOT_RUNNING = "the router is not running yet (it starts with the hosts that serve)"


def _probe_plan(batch: tuple[Host, ...]):
    def plan(view) -> list[tuple[str, Any]]:
        steps: list[tuple[str, Any]] = [(view.router_host, view.calls.state()),
                                        (view.router_host, _when(view.calls.log_tail(), "the router this run saw died (exit 14)"))]
        for host in batch:
            steps += [(host.name, a) for a in probe_actions(view.network(host), view.run, view.stamp)[1]]
        return steps
    return plan


def _remove_plan(batch: tuple[Host, ...]):
    def plan(view) -> list[tuple[str, Any]]:
        calls, at = view.calls, view.router_host
        steps: list[tuple[str, Any]] = [(at, calls.state()), (at, _when(calls.log_tail(), "the router this run saw died "
                                                                        "(exit 14)")),
                                        (at, _when(calls.packages(), RUNNING)),
                                        (at, _when(calls.workers(True), RUNNING))]
        for host in batch:
            url = worker_url(view.run, view.network(host))
            steps += [(at, _when(calls.workers(True), RUNNING)),
                      (at, _when(calls.remove(url, "<worker id>", True), f"{RUNNING}, lists {host.name} and the "
                                 "probe did not keep it (smg, sglang-router 0.3.x; older: POST /remove_worker?url=); then "
                                 "GET /workers until it is listed unhealthy or gone, and again before the "
                                 "router-add until it is gone (smg: after its drain settle, 5 s)")),
                      (at, _when(calls.remove(url, "", False), "the router is older than 0.3"))]
        return steps + _membership_waits(calls, at, "after each removal: until it is listed unhealthy or gone")
    return plan


def _drain_plan(batch: tuple[Host, ...]):
    def plan(view) -> list[tuple[str, Any]]:
        steps = [(view.router_host, _when(view.calls.watch_loads(worker_url(view.run, view.network(h))),
                                          f"{h.name} was taken out: until nothing is in flight")) for h in batch]
        return steps + _watched(view, "after the drain")
    return plan


def _watched(view, when: str) -> list[tuple[str, Any]]:
    """What router_watch.watch sends: the router's state, and its log tail when it died."""
    return [(view.router_host, _when(view.calls.state(), f"{RUNNING} ({when}: is it still, answering GET /workers?)")),
            (view.router_host, _when(view.calls.log_tail(), "the router this run saw died (exit 14)"))]


def _join_plan(hosts: Sequence[Host], end_to_end: bool = False):
    def plan(view) -> list[tuple[str, Any]]:
        from deploy.host.state_layout import router_log_name

        calls, at = view.calls, view.router_host
        urls = [worker_url(view.run, view.network(h)) for h in hosts]
        steps: list[tuple[str, Any]] = [(at, calls.state()), (at, _when(calls.packages(), "the first router call of the run (the package and its version decide the "
                                                               "launcher module and the API)")),
                                        (at, _when(calls.start(urls, router_log_name(view.stamp)), NOT_RUNNING)),
                                        (at, _when(calls.workers(True), RUNNING))]
        steps += [(at, _when(calls.add(u, True), f"{RUNNING} without {u} (older than 0.3: POST /add_worker?url=)"))
                  for u in urls]
        steps += [(at, _when(calls.add(u, False), "the router is older than 0.3")) for u in urls]
        steps += _membership_waits(calls, at, "after the start, each add, and before the adds until the batch's "
                                              "removed workers left the list (smg's drain settle)")
        steps.append((at, _when(calls.log_tail(), "the router died (while starting, or mid-roll)")))
        died = "the router this run saw died mid-roll (router_watch.py): the roll stops, exit 14, and the router "
        steps += [(at, _when(calls.health(worker_url(view.run, view.network(h))), died + "is started again with "
                             "every replica that answers /health")) for h in view.config.hosts_of(view.run)]
        if end_to_end:
            steps.append((at, calls.end_to_end()))
        return steps
    return plan


def _membership_waits(calls, at: str, when: str) -> list[tuple[str, Any]]:
    """RouterHost.wait_members' host-side loop, on either API (sglang-router older than 0.3: /list_workers)."""
    return [(at, _when(calls.watch_members(True), f"{RUNNING}, {when}")),
            (at, _when(calls.watch_members(False), f"{RUNNING}, {when}; the router is older than 0.3"))]


def _when(action, when: str):
    import dataclasses

    return dataclasses.replace(action, when=when)
