"""deployctl logs: the latest SGLang server log of the run's hosts."""

from __future__ import annotations

import click

from deploy.cli import options


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
    from deploy.base.errors import UsageError
    from deploy.verbs import inspect

    if follow and as_json:
        raise UsageError("--follow streams the log as it grows; it cannot be combined with --json")
    if follow:
        inspect.follow_run_log(globals_.load(), run_name, host_names, lines)
        return 0

    from deploy.base.terminal import safe_text

    report = inspect.logs_report(globals_.load(), run_name, host_names, lines)
    if as_json:
        from deploy.render import report as render

        render.print_json(render.logs_document(report.run.name, report.outcomes, inspect.latest_log_path))
        return report.exit_code
    for outcome in report.outcomes:
        click.echo(f"==> {outcome.host.name}: {inspect.latest_log_path(outcome.host)} <==")
        if outcome.error is not None:
            click.echo(f"error: {safe_text(outcome.error)}", err=True)
        else:
            # the log is the server's (and whatever its requests made it print): escapes shown, not run
            click.echo(safe_text(outcome.value), nl=False)
    return report.exit_code
