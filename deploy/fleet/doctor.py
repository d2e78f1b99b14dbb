"""The doctor's checks for a run's router host: sglang-router installed, its port free."""

from __future__ import annotations

from deploy.doctor.checks import Check
from deploy.errors import DeployError
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
