"""Rolling redeploys behind SGLang's router, built from run-level phases.

Per batch of ``--serial N`` hosts: take its workers out of the router, wait until SGLang reports
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


def _remove(batch: tuple[Host, ...], allow_downtime: bool):
    def action(state: RunState) -> str:
        router = open_router(state)
        if not router.running():
            state.data["router_running"] = False
            return "router not running yet: nothing to take out"
        state.data["router_running"] = True
        urls = {worker_url(state.run, h): h for h in batch}
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
            for url in urls:
                router.add(url)
            added = "added " + ", ".join(urls)
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


def fleet_phases(hosts: Sequence[Host], serial: int, has_router: bool, allow_downtime: bool) -> list[Phase]:
    phases: list[Phase] = []
    groups = batches(hosts, serial)
    for i, batch in enumerate(groups, 1):
        tag = f"batch {i}/{len(groups)}"
        names = ",".join(h.name for h in batch)
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
            return run_phases(state, hosts, fleet_phases(hosts, serial, run.router is not None, allow_downtime))
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
