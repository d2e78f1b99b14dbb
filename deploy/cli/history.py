"""deployctl history: what every deploy-changing invocation did, per host (local JSON lines)."""

from __future__ import annotations

import sys

import click


@click.command("history")
@click.option("--run", "run_name", default=None, help="Only records of this run.")
@click.option("--host", "host_name", default=None, help="Only records of this host.")
@click.option("-n", "--last", type=click.IntRange(1, 1_000_000), default=None, help="Only the last N records.")
@click.option("--json", "as_json", is_flag=True, help="The records as a JSON document.")
def command(run_name, host_name, last, as_json) -> int:
    """Show the local history: time, verb, run, host, SGLang version, drafter, numbers, outcome, exit code."""
    from deploy.local import history as store
    from deploy.render import report as render

    warnings: list[str] = []
    rows = store.read(run_name, host_name, warnings=warnings)
    from deploy.base.terminal import safe_line

    for warning in warnings:
        click.echo(f"warning: {safe_line(warning)}", err=True)
    if last is not None:
        rows = rows[-last:]
    if as_json:
        render.print_json({"command": "history", "path": str(store.history_path()), "records": rows})
    elif sys.stdout.isatty():
        render.history_table(rows, render.console())
    else:
        for line in render.history_lines(rows):
            click.echo(line)
    return 0
