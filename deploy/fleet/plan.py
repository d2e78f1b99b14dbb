"""What a fleet run would do (``plan``) and what it did (the report's ``fleet`` part)."""

from __future__ import annotations

from typing import Any

import click

from deploy.fleet.phases import batches, default_serial
from deploy.fleet.router import RouterPaths, router_argv, router_url, worker_url


def plan_fleet(config, run, hosts, command: str, serial: int | None, allow_downtime: bool) -> dict[str, Any]:
    serial = serial or default_serial(run, hosts)
    groups = batches(hosts, serial)
    document: dict[str, Any] = {"serial": serial, "allow_downtime": allow_downtime,
                                "batches": [[h.name for h in batch] for batch in groups]}
    if run.router is not None:
        host = config.host(run.router.host)
        paths = RouterPaths(host.state_dir)
        package = run.router.package
        document["router"] = {
            "host": host.name, "url": router_url(run.router, host), "policy": run.router.policy,
            "package": package if package != "auto" else
            "auto: smg when installed for router.python on the router host, else sglang-router (read from its "
            "package metadata before anything is stopped)",
            "pidfile": paths.pidfile, "log": paths.latest_log,
            "argv": router_argv(run.router, host, [worker_url(run, h) for h in hosts]),
            "workers": {h.name: worker_url(run, h) for h in hosts},
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
            "stop": f"{host.python} -c <deploy/remote/fleet_ops.py> stop-router {paths.pidfile} (down)",
        }
    return document


def print_fleet_plan(document: dict[str, Any]) -> None:
    click.echo(f"fleet: --serial {document['serial']}: batches " +
               " | ".join(",".join(b) for b in document["batches"]))
    router = document.get("router")
    if router:
        click.echo(f"router on {router['host']}: {router['url']} (policy {router['policy']}), "
                   f"PID file {router['pidfile']}, log {router['log']}")
        click.echo(f"  package: {router['package']}")
        click.echo("  start: " + " ".join(router["argv"]))
        for line in router["per_batch"]:
            click.echo("  per batch: " + line)
        click.echo("  end: " + router["end"])


def fleet_report(result) -> dict[str, Any]:
    rotation = {}
    for host, marks in result.rotation.items():
        entry: dict[str, Any] = {}
        if "kept" in marks and "out" not in marks:
            entry["out_of_rotation_s"] = 0.0
            entry["note"] = "stayed in the router: unchanged"
        elif "out" in marks and "in" in marks:
            entry["out_of_rotation_s"] = round(marks["in"] - marks["out"], 3)
        elif "out" in marks:
            entry["out_of_rotation_s"] = None
            entry["note"] = "taken out, not put back"
        rotation[host] = entry
    document: dict[str, Any] = {"phases": [p.to_dict() for p in result.phases], "rotation": rotation}
    if result.error is not None:
        document["error"] = str(result.error)
        document["exit_code"] = int(result.error.exit_code)
    return document


def print_fleet_report(result) -> None:
    for phase in result.phases:
        click.echo(f"  {phase.status:8} {phase.name}: {phase.detail}"[:300])
    for host, entry in fleet_report(result)["rotation"].items():
        window = entry.get("out_of_rotation_s")
        click.echo(f"  {host}: out of rotation {window:.2f} s" if window is not None else f"  {host}: {entry.get('note')}")
    if result.error is not None:
        click.echo(f"error: {result.error}", err=True)


def router_status(config, hosts, jumps) -> list[dict[str, Any]]:
    """gpu-status: each run's router that runs on one of ``hosts``: PID, alive, its workers."""
    from deploy.errors import DeployError
    from deploy.fleet.router import RouterHost
    from deploy.orchestrator import network_host
    from deploy.transport import HostConnection

    names = {h.name for h in hosts}
    rows = []
    for run in config.runs:
        if run.router is None or run.router.host not in names:
            continue
        host = config.host(run.router.host)
        row: dict[str, Any] = {"run": run.name, "host": host.name}
        try:
            with HostConnection(host, config.ssh, jumps) as conn:
                router = RouterHost(conn, network_host(host, conn.endpoint.hostname.value), run)
                state = router.state()
                try:
                    package = router.package()
                    row["package"] = {"name": package.name, "version": package.version}
                except DeployError as exc:
                    row["package"] = {"error": str(exc)}
                row.update(url=router.url, pid=state.get("pid"), alive=bool(state.get("alive")),
                           workers=[{"url": w["url"], "healthy": w["is_healthy"]} for w in state.get("workers", [])])
        except DeployError as exc:
            row["error"] = str(exc)
        rows.append(row)
    return rows


def _package_text(row: dict[str, Any]) -> str:
    package = row.get("package") or {}
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
