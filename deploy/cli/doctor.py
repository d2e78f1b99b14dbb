"""deployctl doctor: the read-only pre-flight on a run's hosts, by itself."""

from __future__ import annotations

import click

from deploy.cli import options


@click.command("doctor")
@options.run
@options.hosts
@options.as_json('{"hosts": [{"host", "ok", "checks": [{"name", "status", "reason", "fix"}]}]} on stdout.')
@click.pass_obj
def command(globals_, run_name, host_names, as_json: bool) -> int:
    """Check every known silent EAGLE-3 failure on each host; reads, never changes (exit 0 / 8 / 4)."""
    from deploy.verbs import inspect
    from deploy.render import report as render
    from deploy.verbs.selection import run_and_hosts
    from deploy.base.errors import ExitCode

    config = globals_.load()
    run, hosts = run_and_hosts(config, run_name, host_names)

    results, code = [], ExitCode.OK
    for outcome in inspect.doctor(config, run, hosts):
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
