"""deployctl gpu-status: who holds which GPU on each host."""

from __future__ import annotations

import click


@click.command("gpu-status")
@click.option("--host", "host_names", multiple=True, help="Only this host (repeatable).")
@click.option("--group", default=None, help="Only hosts in this group.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document for scripts.")
@click.pass_obj
def gpu_status(globals_, host_names: tuple[str, ...], group: str | None, as_json: bool) -> int:
    """Show GPU memory, utilisation and holder processes on each host (in parallel)."""
    from deploy import render
    from deploy.cli.common import select_hosts
    from deploy.facts.gpus import read_gpus
    from deploy.fanout import for_each_host
    from deploy.orchestrator import exit_code
    from deploy.transport import HostConnection, JumpConnections, describe_endpoints

    config = globals_.load()
    hosts = select_hosts(config, list(host_names), group)

    def work(host):
        with HostConnection(host, config.ssh, jumps) as conn:
            return read_gpus(conn, host.gpus)

    with JumpConnections() as jumps:
        outcomes = for_each_host(hosts, work, config.ssh.max_parallel)
    endpoints = describe_endpoints(hosts, config.ssh)
    if as_json:
        render.print_json(render.gpu_status_document(outcomes, endpoints))
    else:
        render.gpu_status_tables(outcomes, render.console(), endpoints)
    return int(exit_code(outcomes))
