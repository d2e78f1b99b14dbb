"""The doctor's checks for a run's router host: sglang-router installed, its port free."""

from __future__ import annotations

from deploy.doctor.checks import Check
from deploy.errors import DeployError
from deploy.fanout import for_each_host
from deploy.fleet.router import RouterPaths, ops_command, parse_json_line, router_address


def router_checks(conn, host, run) -> list[Check]:
    spec = run.router
    checks = []
    # the package metadata, never `import sglang_router` (it loads a 90 MB Rust extension)
    got = conn.run(ops_command(spec.python, "router-version"), timeout=60)
    try:
        version = parse_json_line(got.stdout.strip(), host.name, ("version",)) if got.exit_code == 0 else None
    except DeployError as exc:
        version = None
        got_error = str(exc)
    else:
        got_error = (version or {}).get("error") or (got.stderr.strip().splitlines() or ["no output"])[-1]
    if version and version.get("version"):
        checks.append(Check("router-package", "pass", f"sglang-router {version['version']} for {spec.python}"))
    else:
        checks.append(Check("router-package", "fail", f"sglang-router is not installed for {spec.python}: {got_error}",
                            f"{spec.python} -m pip install sglang-router (0.3.2 is current), or set router.python"))
    address = router_address(spec, host)
    state = parse_json_line(conn.check(ops_command(host.python, "port-check", address, str(spec.port),
                                                   RouterPaths(host.state_dir).pidfile), timeout=30,
                                       what="router port check").stdout.strip(), host.name, ("listening", "ours"))
    if not state["listening"]:
        checks.append(Check("router-port", "pass", f"{address}:{spec.port} is free"))
    elif state["ours"]:
        checks.append(Check("router-port", "pass", f"{address}:{spec.port}: the router deployctl started listens there"))
    else:
        checks.append(Check("router-port", "fail", f"another process listens on {address}:{spec.port}",
                            "stop it or choose another router.port"))
    return checks


def add_router_checks(config, run, hosts, outcomes: list) -> None:
    """The router host's checks join its entry (or get one: a router host that is no replica).

    Skipped when ``--host`` narrowed the run to hosts that do not include the router host.
    """
    from deploy.transport import HostConnection

    router_host = config.host(run.router.host)
    mine = next((o for o in outcomes if o.host.name == router_host.name), None)
    if mine is None and len(hosts) != len(config.hosts_of(run)):
        return

    def work(host):
        with HostConnection(host, config.ssh) as conn:
            return router_checks(conn, host, run)

    [extra] = for_each_host([router_host], work, 1)
    if mine is None:
        outcomes.append(extra)
    elif mine.value is not None and extra.value is not None:
        mine.value = list(mine.value) + extra.value
    elif mine.error is None:
        mine.value, mine.error = None, extra.error
