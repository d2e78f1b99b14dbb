"""The doctor's checks for a run's router host: a router package installed, every port it binds
free (router.port, its Prometheus port, ...: router_ports.py), every worker URL reachable from the
router host (the router reaches the workers from there)."""

from __future__ import annotations

from deploy.doctor.checks import Check
from deploy.base.errors import DeployError, RemoteOutputError
from deploy.engine.fanout import for_each_host
from deploy.facts.router import parse_router_state
from deploy.fleet.router import RouterCalls, parse_json_line, parse_router_packages
from deploy.fleet.router_package import RouterPackage, choose_package, package_text, policy_problem, running_package
from deploy.fleet.router_ports import parse_ports, port_problems, router_binds


def router_checks(conn, host, run) -> list[Check]:
    spec = run.router
    checks = []
    package: RouterPackage | None = None
    got = conn.run(RouterCalls(spec, host).packages().command, timeout=60)
    try:
        if got.exit_code != 0:
            raise DeployError(f"{spec.python} could not run: "
                              f"{(got.stderr.strip().splitlines() or ['no output'])[-1][:200]}")
        package = choose_package(parse_router_packages(got.stdout.strip(), host.name), spec.package,
                                 f"{host.name} ({spec.python})")
    except DeployError as exc:
        checks.append(Check("router-package", "fail", str(exc),
                            f"{spec.python} -m pip install smg (Shepherd Model Gateway, SGLang's router), "
                            "or set router.python / router.package"))
    else:
        problem = policy_problem(package, spec.policy)
        if problem:
            checks.append(Check("router-package", "fail", f"{package.label} for {spec.python}: {problem}",
                                "choose one of the listed policies, or install smg (it has them all)"))
        else:
            settle = f"; a removed worker leaves GET /workers after {package.drain_settle_s:g} s (drain settle)" \
                if package.drain_settle_s else ""
            checks.append(Check("router-package", "pass",
                                f"{package.label} for {spec.python} (python -m {package.module}){settle}"))
    call = RouterCalls(spec, host).state()
    state = parse_router_state(parse_json_line(conn.check(call.command, timeout=call.timeout_s,
                                                          what="router state").stdout.strip(), host.name, ()),
                               host.name)
    if state.alive:
        running = running_package(state.cmdline)
        differs = running is not None and package is not None and running != package.name
        checks.append(Check("router-running", "warn" if differs else "pass",
                            f"router pid {state.pid} runs {package_text(running, package)}",
                            "deployctl restart --force restarts it on the installed package" if differs else ""))
    binds = router_binds(spec, host, package.name if package is not None else
                         (spec.package if spec.package != "auto" else None))
    call = RouterCalls(spec, host).ports(binds)
    got = parse_json_line(conn.check(call.command, timeout=call.timeout_s, what="router ports check").stdout.strip(),
                          host.name, ("ports",))
    uid = got.get("uid")
    if uid is not None and (not isinstance(uid, int) or isinstance(uid, bool)):
        raise RemoteOutputError(f"{host.name}: fleet_ops.py ports printed uid {str(uid)[:40]!r}; expected a number")
    fine, taken = port_problems(binds, parse_ports(got, binds, host.name), uid)
    if taken:
        checks.append(Check("router-port", "fail", "; ".join(taken),
                            "stop that process, or choose another router.port (or --prometheus-port in "
                            "router.extra_args)"))
    else:
        checks.append(Check("router-port", "pass", "; ".join(fine)))
    return checks


def add_router_checks(config, run, hosts, outcomes: list) -> None:
    """The router host's checks join its entry (or get one: a router host that is no replica).

    Skipped when ``--host`` narrowed the run to hosts that do not include the router host.
    """
    from deploy.ssh.transport import HostConnection

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
