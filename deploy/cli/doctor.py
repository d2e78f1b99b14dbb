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
    from deploy.render import report as render
    from deploy.verbs import inspect

    report = inspect.doctor_report(globals_.load(), run_name, host_names)
    if as_json:
        render.print_json(render.doctor_document(report.results))
    else:
        render.doctor_tables(report.results, render.console())
    return report.exit_code
