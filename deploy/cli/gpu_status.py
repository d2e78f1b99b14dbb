"""deployctl gpu-status: who holds which GPU on each host."""

from __future__ import annotations

import click

from deploy.cli import options


@click.command("gpu-status")
@click.option("--host", "host_names", multiple=True, help="Only this host (repeatable).")
@options.group
@options.as_json("Print a JSON document for scripts.")
@click.pass_obj
def command(globals_, host_names: tuple[str, ...], group: str | None, as_json: bool) -> int:
    """Show GPU memory, utilisation and holder processes on each host (in parallel)."""
    from deploy.render import report as render
    from deploy.verbs import inspect

    report = inspect.gpu_status_report(globals_.load(), host_names, group)
    if as_json:
        document = render.gpu_status_document(report.outcomes, report.endpoints)
        if report.routers:
            document["routers"] = report.routers
        render.print_json(document)
    else:
        render.gpu_status_tables(report.outcomes, render.console(), report.endpoints)
        if report.routers:
            from deploy.fleet.plan import print_router_status

            print_router_status(report.routers)
    return report.exit_code
