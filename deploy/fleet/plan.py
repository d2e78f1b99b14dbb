"""What a fleet run would do (``plan``) and what it did (the report's ``fleet`` part)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from deploy.fleet.router_ports import router_binds
from deploy.fleet.router import RouterCalls, RouterPaths, router_argv, router_url, worker_url


@dataclass
class PlanView:
    """What a phase's ``plan`` builds its commands from (no connection: placeholders for run-time values)."""

    config: Any
    run: Any
    #: host name -> the host as the run sees it (address: its ssh_config HostName)
    hosts: dict[str, Any]
    calls: Any = None
    router_host: str = ""
    stamp: str = "<launch stamp>"

    def network(self, host):
        return self.hosts.get(host.name, host)


def network_hosts(hosts, endpoints: dict | None) -> dict[str, Any]:
    from deploy.engine.session import network_host

    return {h.name: network_host(h, (endpoints or {}).get(h.name, {}).get("hostname", {}).get("value", h.address))
            for h in hosts}


def phase_plan(phases, view: PlanView, playbook) -> list[dict[str, Any]]:
    """Every run-level phase in the order the run takes it, with the commands it sends: a RunPhase's
    from walking its one builder with a PlanContext (fleet/phases.py: the body the run walks), with
    the decisions it may take; a HostPhase's playbook from each host's plan, plus what a failing host
    gets (server-state, rollback)."""
    from deploy.engine.plan import plan_failure
    from deploy.fleet.phases import HostPhase, PlanContext

    ctx = PlanContext(view)  # one walk over the phases: what one phase leaves, the next one sees
    out: list[dict[str, Any]] = []
    for phase in phases:
        entry: dict[str, Any] = {"phase": phase.name, "commands": []}
        if isinstance(phase, HostPhase):
            entry["playbook_on"] = [h.name for h in phase.hosts]
            for host in phase.hosts:
                for step, actions in plan_failure(playbook, view.run, view.network(host)):
                    entry["commands"] += [{"host": host.name, "step": step, **a.to_dict()} for a in actions]
        else:
            rows, decisions = ctx.walk(phase)
            entry["commands"] = [{"host": h, **a.to_dict()} for h, a in rows]
            if decisions:
                entry["decisions"] = decisions
        if getattr(phase, "always", False):
            entry["always"] = True
        out.append(entry)
    return out


def plan_fleet(config, rollout, playbook=None, endpoints: dict | None = None) -> dict[str, Any]:
    """The run-level plan of ``rollout`` (fleet/rollout.py: the value its run takes); ``playbook``
    None: no run-level phases (``down``), only the router's part."""
    from deploy.fleet.rolling import fleet_phases

    run, hosts = rollout.run, list(rollout.hosts)
    document: dict[str, Any] = {"serial": rollout.serial, "allow_downtime": rollout.allow_downtime,
                                "batches": [[h.name for h in batch] for batch in rollout.batches]}
    known = [*config.hosts_of(run), *([config.host(run.router.host)] if run.router is not None else [])]
    missing = [h for h in known if h.name not in (endpoints or {})]
    if missing:  # the router host, and the run's hosts --host left out: the router reaches them all
        from deploy.engine.plan import describe_endpoints

        endpoints = {**(endpoints or {}), **describe_endpoints(missing, config)}
    view = PlanView(config, run, network_hosts(known, endpoints))
    if run.router is not None:
        view.calls = RouterCalls(run.router, view.network(config.host(run.router.host)), planned=True)
        view.router_host = run.router.host
    if playbook is not None:
        from deploy.fleet.rolling import refuse_statically

        refuse_statically(config, rollout, endpoints)  # what the run refuses before anything, the plan too
        playbook = rollout.playbook(playbook)
        document["phases"] = phase_plan(fleet_phases(rollout, playbook), view, playbook)
    if run.router is not None:
        host = view.network(config.host(run.router.host))
        paths = RouterPaths(host.state_dir, run.router.port)
        package = run.router.package
        document["router"] = {
            "host": host.name, "url": router_url(run.router, host), "policy": run.router.policy,
            "package": package if package != "auto" else
            "auto: smg when installed for router.python on the router host, else sglang-router (read from its "
            "package metadata before anything is stopped)",
            "pidfile": paths.pidfile, "log": paths.latest_log,
            # every port it binds, checked free before the first replica is stopped (router_ports.py)
            "binds": [b.label for b in router_binds(run.router, host, None if package == "auto" else package)],
            "argv": router_argv(run.router, host, [worker_url(run, view.network(h)) for h in hosts]),
            # where the router host reaches each replica (a wildcard serve_host: the host's network address)
            "workers": {h.name: worker_url(run, view.network(h)) for h in hosts},
            "per_batch": ["unless the playbook benchmarks: the doctor's read and the drafter's fingerprint on each host; "
                          "a host that would only converge (already running as desired) stays in the router",
                          "GET /workers; DELETE /workers/{id} for the other workers (smg, sglang-router 0.3.x; "
                          "older: /remove_worker); poll GET /workers until they are gone (smg: after its "
                          "drain settle, 5 s)",
                          f"poll each worker's GET /v1/loads until nothing runs or waits (at most "
                          f"{run.router.drain_timeout_s:g} s)",
                          "the playbook on the batch's hosts",
                          "POST /workers {\"url\"} for the hosts that serve a verified deployment; poll GET /workers"],
            "end": "start the router if it is not running (detached, PID file and log in the state dir); "
                   "one POST /generate through it must answer",
            "stop": f"{host.python} -I -S -c <deploy/remote/fleet_ops.py> stop-router {paths.pidfile} (down)",
        }
        if playbook is None:  # down: fleet/rolling.py run_down, in this order
            document["down"] = [
                "every host's lock (" + ", ".join(h.name for h in hosts) + "), all or nothing: one held elsewhere "
                "is exit 9 with nothing changed, the router included",
                *(["the downed replicas out of the router (GET /workers; DELETE /workers/{id}; poll GET /workers): "
                   + ", ".join(worker_url(run, view.network(h)) for h in hosts)] if not rollout.whole else []),
                "the down playbook on " + ", ".join(h.name for h in hosts) + " (each host's plan)",
                *(["the router stopped: " + document["router"]["stop"]] if rollout.whole else
                  ["the router keeps serving the run's other replicas"])]
            # the router's phases of the run_down (the same builders it walks)
            from deploy.fleet.rolling import down_remove, down_stop

            from deploy.facts.router import DownRouter

            result = [DownRouter(host=run.router.host)]
            document["phases"] = phase_plan([down_stop(result)] if rollout.whole else [down_remove(hosts, result)],
                                            view, None)
    return document


def print_phase_plan(phases: list[dict[str, Any]]) -> None:
    # one write: a line per echo cost a fleet plan 2 ms per host of 100 (issue 37, bench_fleet_scale.py)
    lines = []
    for phase in phases:
        on = f" (the playbook on {', '.join(phase['playbook_on'])}: see each host's plan)" if "playbook_on" in phase else ""
        lines.append(f"  phase {phase['phase']}{on}" + (" [also after a failure]" if phase.get("always") else ""))
        for c in phase["commands"]:
            lines.append(f"    {c['host']}: {c['description']}" + (f" (only when {c['when']})" if c.get("when") else ""))
            lines.append(f"      {'$' if c['kind'] != 'upload' else '>'} {c.get('command') or c.get('directory')}")
        lines += [f"    decides: {d}" for d in phase.get("decisions", [])]
    if lines:
        click.echo("\n".join(lines))


def print_fleet_plan(document: dict[str, Any]) -> None:
    if "nodes" in document:
        click.echo(f"node group {', '.join(document['nodes'])}: one SGLang server, --dist-init-addr "
                   f"{document['dist_init_addr']}; phases in order, with every command each sends besides the "
                   "nodes' playbooks:")
        print_phase_plan(document["phases"])
        return
    click.echo(f"fleet: --serial {document['serial']}: batches " +
               " | ".join(",".join(b) for b in document["batches"]))
    router = document.get("router")
    if router:
        click.echo(f"router on {router['host']}: {router['url']} (policy {router['policy']}), "
                   f"PID file {router['pidfile']}, log {router['log']}")
        click.echo(f"  package: {router['package']}")
        click.echo("  binds: " + ", ".join(router["binds"]))
        for name, url in router["workers"].items():
            click.echo(f"  worker {name}: {url}")
        click.echo("  start: " + " ".join(router["argv"]))
        for line in router["per_batch"]:
            click.echo("  per batch: " + line)
        click.echo("  end: " + router["end"])
    for line in document.get("down", []):
        click.echo("  down: " + line)
    if document.get("phases"):
        click.echo("run-level phases, in order, with every command each sends besides the hosts' playbooks:")
        print_phase_plan(document["phases"])


def fleet_report(result) -> dict[str, Any]:
    rotation = {}
    for host, marks in result.rotation.items():
        entry: dict[str, Any] = {}
        if marks.kept is not None and marks.out is None:
            entry["out_of_rotation_s"] = 0.0
            entry["note"] = "stayed in the router: unchanged"
        elif marks.out is not None and marks.back is not None:
            entry["out_of_rotation_s"] = round(marks.back - marks.out, 3)
        elif marks.out is not None:
            entry["out_of_rotation_s"] = None
            entry["note"] = "taken out, not put back"
        rotation[host] = entry
    document: dict[str, Any] = {"phases": [p.to_dict() for p in result.phases], "rotation": rotation}
    if getattr(result, "canary", None) is not None:
        document["canary"] = result.canary.document()
    if result.error is not None:
        document["error"] = str(result.error)
        document["exit_code"] = int(result.error.exit_code)
    return document


def print_fleet_report(result) -> None:
    from deploy.base.terminal import safe_line, safe_text  # router and host text, escaped (issue 22)

    for phase in result.phases:
        click.echo(safe_line(f"  {phase.status:8} {phase.name}: {phase.detail}"[:300]))
    for host, entry in fleet_report(result)["rotation"].items():
        window = entry.get("out_of_rotation_s")
        click.echo(f"  {host}: out of rotation {window:.2f} s" if window is not None else
                   f"  {host}: {safe_line(entry.get('note'))}")
    canary = getattr(result, "canary", None)
    if canary is not None:
        click.echo(safe_line(f"  canary {', '.join(canary.hosts)} against "
                             f"{', '.join(canary.others or []) or '-'}: "
                             f"{canary.line or canary.why or canary.outcome}"
                             + (f" -> {canary.action}" if canary.action else ""))[:600])
    if result.error is not None:
        click.echo(f"error: {safe_text(result.error)}", err=True)


def _package_text(row: dict[str, Any]) -> str:
    package = row.get("package") or {}
    if row.get("package_text"):  # a running router: its own package (and the installed one when they differ)
        return f" ({row['package_text']})"
    if "name" in package:
        return f" ({package['name']} {package['version']})"
    return f" (router package: {package['error']})" if "error" in package else ""


def print_router_status(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        if "error" in row:
            click.echo(f"router of run {row['run']} on {row['host']}: unknown ({row['error']})")
        elif not row["alive"]:
            click.echo(f"router of run {row['run']} on {row['host']}: not running{_package_text(row)}")
        else:
            workers = ", ".join(f"{w['url']} ({'healthy' if w['healthy'] else 'UNHEALTHY'})" for w in row["workers"])
            click.echo(f"router of run {row['run']} on {row['host']}: pid {row['pid']} at {row['url']}"
                       f"{_package_text(row)}; workers: {workers or 'none'}")
