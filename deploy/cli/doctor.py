"""deployctl doctor: the read-only pre-flight on a run's hosts, by itself."""

from __future__ import annotations

import click


@click.command("doctor")
@click.option("--run", "run_name", default=None, help="Run from the config (default: the only one).")
@click.option("--host", "host_names", multiple=True, help="Only these hosts of the run (repeatable).")
@click.option("--json", "as_json", is_flag=True,
              help='{"hosts": [{"host", "ok", "checks": [{"name", "status", "reason", "fix"}]}]} on stdout.')
@click.pass_obj
def doctor(globals_, run_name, host_names, as_json: bool) -> int:
    """Check every known silent EAGLE-3 failure on each host; reads, never changes (exit 0 / 8 / 4)."""
    from deploy import render
    from deploy.cli.lifecycle import _run_and_hosts
    from deploy.errors import ExitCode
    from deploy.fanout import for_each_host
    from deploy.steps.doctor import diagnose
    from deploy.transport import HostConnection

    config = globals_.load()
    run, hosts = _run_and_hosts(config, run_name, host_names)

    def work(host):
        with HostConnection(host, config.ssh) as conn:
            return diagnose(conn, host, run, run.draft_tokens, fix_keys_will_run=False)[0]

    outcomes = for_each_host(hosts, work, config.ssh.max_parallel)
    if run.router is not None and not host_names:
        from deploy.fleet.doctor import router_checks

        router_host = config.host(run.router.host)

        def router_work(host):
            with HostConnection(host, config.ssh) as conn:
                return router_checks(conn, host, run)

        [extra] = for_each_host([router_host], router_work, 1)
        mine = next((o for o in outcomes if o.host.name == router_host.name), None)
        if mine is None:
            outcomes.append(extra)  # the router runs on a host that is not a replica
        elif mine.value is not None and extra.value is not None:
            mine.value = list(mine.value) + extra.value
        elif mine.error is None:
            mine.value, mine.error = None, extra.error
    results, code = [], ExitCode.OK
    for outcome in outcomes:
        if outcome.error is not None:
            error = outcome.error
            checks = [{"name": "reachable", "status": "fail", "reason": str(error),
                       "fix": "check the host's address, SSH key and known_hosts" if error.exit_code ==
                       ExitCode.CONNECTION else "see the reason"}]
            if code == ExitCode.OK:
                code = ExitCode(error.exit_code)
        else:
            checks = [c.to_dict() for c in outcome.value]
            if code == ExitCode.OK and any(c["status"] == "fail" for c in checks):
                code = ExitCode.VERIFY
        results.append((outcome.host.name, checks))
    if as_json:
        render.print_json(render.doctor_document(results))
    else:
        render.doctor_tables(results, render.console())
    return int(code)
