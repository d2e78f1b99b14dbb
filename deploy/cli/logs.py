"""deployctl logs: the latest SGLang server log of the run's hosts."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.verbs.selection import run_and_hosts


@click.command("logs")
@options.run
@options.hosts
@click.option("-n", "--lines", type=click.IntRange(1, 100000), default=50, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@options.as_json('{"hosts": [{"host", "path", "ok", "exit_code", "lines" | "error"}]} on stdout '
                 "(terminal escapes stripped from the lines).")
@click.pass_obj
def command(globals_, run_name, host_names, lines: int, follow: bool, as_json: bool) -> int:
    """Show the latest SGLang server log of the run's hosts."""
    from deploy.verbs import inspect
    from deploy.base.errors import UsageError

    if follow and as_json:
        raise UsageError("--follow streams the log as it grows; it cannot be combined with --json")
    config = globals_.load()
    run, hosts = run_and_hosts(config, run_name, host_names)

    if follow:
        if len(hosts) != 1:
            raise UsageError("--follow needs exactly one host (use --host NAME)")
        inspect.follow_log(config, hosts[0], lines)
        return 0

    from deploy.base.terminal import safe_text

    outcomes = inspect.read_logs(config, hosts, lines)
    if as_json:
        from deploy.render import report as render

        render.print_json(render.logs_document(run.name, outcomes, inspect.latest_log_path))
        return int(inspect.exit_code(outcomes))
    for outcome in outcomes:
        click.echo(f"==> {outcome.host.name}: {inspect.latest_log_path(outcome.host)} <==")
        if outcome.error is not None:
            click.echo(f"error: {safe_text(outcome.error)}", err=True)
        else:
            # the log is the server's (and whatever its requests made it print): escapes shown, not run
            click.echo(safe_text(outcome.value), nl=False)
    return int(inspect.exit_code(outcomes))
