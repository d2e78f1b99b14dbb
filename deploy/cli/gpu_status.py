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
    from deploy.verbs import inspect
    from deploy.render import report as render
    from deploy.verbs.selection import select_hosts

    config = globals_.load()
    hosts = select_hosts(config, list(host_names), group)
    outcomes = inspect.gpu_status(config, hosts)
    routers = inspect.router_status(config, hosts)
    endpoints = inspect.describe_endpoints(hosts, config)
    if as_json:
        document = render.gpu_status_document(outcomes, endpoints)
        if routers:
            document["routers"] = routers
        render.print_json(document)
    else:
        render.gpu_status_tables(outcomes, render.console(), endpoints)
        if routers:
            from deploy.fleet.plan import print_router_status

            print_router_status(routers)
    return int(inspect.exit_code(outcomes))
