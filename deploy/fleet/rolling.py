"""Rolling redeploys behind SGLang's router, built from run-level phases.

Per batch of ``--serial N`` hosts: check which of them would only converge (already running as
desired: nothing to redeploy) and keep those in the router, unless the playbook benchmarks them;
take the others' workers out of the router, wait until SGLang reports
nothing in flight on them (``/v1/loads``; bounded by the router's ``drain_timeout_s``), run the
playbook on the batch (converge, rollback and host locks as usual), put the hosts that serve a
verified deployment back (a host rolled back to its last good deployment included), and only
then the next batch. The first failing batch stops the run; later batches stay as they were. At
the end the router runs with every serving replica and one request through it must succeed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from deploy.config.models import Host
from deploy.errors import DeployError, ExitCode
from deploy.fleet.phases import (SERVING_OUTCOMES, HostPhase, Phase, RunPhase, RunState, batches, open_router)
from deploy.fleet.router import worker_url


class LastHealthyWorker(DeployError):
    exit_code = ExitCode.USAGE


def _serving(state: RunState, hosts: Sequence[Host]) -> list[Host]:
    return [h for h in hosts if h.name in state.reports and state.reports[h.name].outcome in SERVING_OUTCOMES]


def _unchanged(state: RunState, host: Host) -> tuple[bool, str]:
    """Would the playbook only converge on ``host``? Read-only: the doctor's command (SGLang's version,
    the running server and its record) and the drafter's fingerprint, judged by converge's own rule."""
    from deploy.facts.doctor import doctor_command, facts_of, run_state_spec
    from deploy.facts.fixer import parse_fingerprint
    from deploy.facts.helpers import HELPER_FILES
    from deploy.facts.server import snapshot_of
    from deploy.orchestrator import network_host
    from deploy.steps import converge
    from deploy.steps.base import StepContext
    from deploy.steps.fix_keys import fingerprint_command, store_path
    from deploy.steps.wait_ready import health_url
    from deploy.transport import HostConnection

    with HostConnection(host, state.config.ssh, state.jumps) as conn:
        host = network_host(host, conn.endpoint.hostname.value)
        ctx = StepContext(host=host, run=state.run, settings=converge.Settings(step="converge"), conn=conn,
                          launch_stamp=state.stamp, memory={})
        spec = run_state_spec(host, list(HELPER_FILES), health_url(ctx))
        facts, sglang, why = facts_of(conn.run(doctor_command(host, state.run, run_state=spec), timeout=90), host,
                                      state.run)
        if sglang is None or sglang.version is None or facts.run_state is None:
            return False, f"SGLang's version is unknown ({why or sglang and sglang.version_error})"
        server = snapshot_of(facts.run_state, facts.python.version, host.name, host.state_dir).server
        result = conn.run(fingerprint_command(ctx), timeout=600)
        fingerprint = parse_fingerprint(result.exit_code, result.stdout, result.stderr, host.name).fingerprint
        from deploy.doctor.speculation import draft_quantization_flag
        from deploy.doctor.verdict import DoctorInput

        ctx.memory.update(drafter_fingerprint=fingerprint, drafter_path=store_path(ctx, fingerprint),
                          sglang_version=sglang.version,  # and the doctor step's draft quantization decision
                          draft_quantization=draft_quantization_flag(DoctorInput(host, state.run, state.run.draft_tokens,
                                                                                 facts, sglang)))
        return converge.would_converge(ctx, server)


def _probe(batch: tuple[Host, ...]):
    def action(state: RunState) -> str:
        from deploy.fanout import for_each_host

        if state.options.force:
            return "--force: every host of the batch is redeployed"
        if not open_router(state).running():
            return "router not running yet: nothing to keep in it"
        outcomes = for_each_host(list(batch), lambda h: _unchanged(state, h), state.config.ssh.max_parallel)
        kept: list[str] = []
        redeploy: list[str] = []
        for outcome in outcomes:
            unchanged, why = outcome.value if outcome.value is not None else (False, f"not checked: {outcome.error}")
            (kept if unchanged else redeploy).append(outcome.host.name if unchanged else f"{outcome.host.name} ({why})")
        state.data.setdefault("kept", set()).update(kept)
        now = time.monotonic()
        for name in kept:
            state.rotation.setdefault(name, {})["kept"] = now
        return (f"unchanged, kept in the router: {', '.join(kept) or '-'}; "
                f"to redeploy: {'; '.join(redeploy) or '-'}")
    return action


def _remove(batch: tuple[Host, ...], allow_downtime: bool):
    def action(state: RunState) -> str:
        router = open_router(state)
        if not router.running():
            state.data["router_running"] = False
            return "router not running yet: nothing to take out"
        state.data["router_running"] = True
        kept = state.data.get("kept", set())
        urls = {worker_url(state.run, h): h for h in batch if h.name not in kept}
        members = router.workers()
        others = [w for w in members if w["url"] not in urls and w["is_healthy"]]
        leaving = [w for w in members if w["url"] in urls]
        if leaving and not others and not allow_downtime:
            raise LastHealthyWorker(
                f"taking {', '.join(h.name for h in batch)} out of the router would leave it no healthy worker "
                f"(members: {', '.join(w['url'] + (' healthy' if w['is_healthy'] else ' unhealthy') for w in members)}); "
                "nothing was changed; --allow-downtime to do it anyway")
        for w in leaving:
            router.remove(w["url"])
            state.rotation.setdefault(urls[w["url"]].name, {})["out"] = time.monotonic()
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
            seconds = router.drain(worker_url(state.run, host), router.spec.drain_timeout_s)
            waited.append(f"{host.name} {seconds:.2f} s")
        return "drained: " + (", ".join(waited) or "-")
    return action


def _add(batch: tuple[Host, ...]):
    def action(state: RunState) -> str:
        serving = _serving(state, batch)
        # taken out but never redeployed (the drain timed out): still serving what it served
        serving += [h for h in batch if h.name not in state.reports and "out" in state.rotation.get(h.name, {})]
        if not serving:
            return "no host of this batch serves a verified deployment: none added"
        router = open_router(state)
        urls = [worker_url(state.run, h) for h in serving]
        if not router.running():
            router.start(urls, state.stamp)
            added = "started the router with " + ", ".join(urls)
        else:
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
        urls = [worker_url(state.run, h) for h in serving]
        if not router.running():
            router.start(urls, state.stamp)
        else:
            listed = {w["url"] for w in router.workers()}
            for url in urls:
                if url not in listed:
                    router.add(url)
        answer = router.end_to_end()
        state.data["end_to_end"] = answer
        return f"a request through {router.url} answered ({len(urls)} worker(s))"
    return action


def fleet_phases(hosts: Sequence[Host], serial: int, has_router: bool, allow_downtime: bool,
                 keep_unchanged: bool = True) -> list[Phase]:
    """``keep_unchanged``: probe each batch and keep the hosts that would only converge in the router
    (off when the playbook benchmarks: bench_serving must not compete with the router's traffic)."""
    phases: list[Phase] = []
    groups = batches(hosts, serial)
    for i, batch in enumerate(groups, 1):
        tag = f"batch {i}/{len(groups)}"
        names = ",".join(h.name for h in batch)
        if has_router and keep_unchanged:
            phases.append(RunPhase(f"{tag} check unchanged {names}", _probe(batch)))
        if has_router:
            phases.append(RunPhase(f"{tag} router-remove {names}", _remove(batch, allow_downtime)))
            phases.append(RunPhase(f"{tag} drain {names}", _drain(batch)))
        phases.append(HostPhase(batch, f"{tag} redeploy {names}"))
        if has_router:
            phases.append(RunPhase(f"{tag} router-add {names}", _add(batch), always=True))
    if has_router:
        phases.append(RunPhase("router end-to-end", _final(hosts)))
    return phases


def with_router_spared(playbook, run):
    """stop-stale --scope user must not stop a router that runs on a replica host."""
    from deploy.fleet.router import ROUTER_CMDLINE_MARKS

    if run.router is None:
        return playbook
    for step in playbook.steps:
        if step.name == "stop-stale":
            exclude = list(step.settings.exclude) + [m for m in ROUTER_CMDLINE_MARKS if m not in step.settings.exclude]
            return playbook.with_settings("stop-stale", exclude=exclude)
    return playbook


def run_fleet(config, playbook, run, hosts: Sequence[Host], progress, options,
              serial: int | None, allow_downtime: bool):
    """The playbook over the run's hosts in batches, with the router's phases between them."""
    import threading

    from deploy.fleet.phases import RunState, check_serial, close_router, default_serial, run_phases
    from deploy.orchestrator import launch_stamp
    from deploy.transport import JumpConnections

    serial = serial or default_serial(run, hosts)
    check_serial(serial, hosts, run, allow_downtime)
    playbook = with_router_spared(playbook, run)
    with JumpConnections() as jumps:
        state = RunState(config, run, playbook, options, progress, jumps, threading.Event(),
                         launch_stamp())
        try:
            benchmarks = any(s.name == "benchmark" and s.settings.enabled for s in playbook.steps)
            return run_phases(state, hosts, fleet_phases(hosts, serial, run.router is not None, allow_downtime,
                                                         keep_unchanged=not benchmarks))
        finally:
            close_router(state)


def stop_router(config, run, progress) -> dict:
    """``down``: stop the run's router (by its PID file) before its servers."""
    from deploy.fleet.phases import RunState, close_router, open_router
    from deploy.transport import JumpConnections

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
    from deploy.orchestrator import describe_endpoints, network_host
    from deploy.transport import JumpConnections

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
