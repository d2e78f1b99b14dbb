"""deployctl status: live accept length and throughput of each host's server vs its last good one.

Read-only, no lock, one SSH command per host. ``--check`` is for cron and monitoring exec checks:
exit 12 when a live figure is under the nightly gate's fraction of the last good one, 1 when the
server is not serving, 4 unreachable, 5 unexpected output, 0 otherwise. ``--watch`` redraws a
table in place on a terminal (plain lines otherwise) until Ctrl-C, which ends it with exit 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from deploy.cli import options


def _finite(ctx, param, value):
    """click's FloatRange lets ``nan`` through (every comparison with it is False)."""
    import math

    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value!r} is not a finite number", ctx, param)
    return value


@click.command("status")
@options.run
@options.hosts
@options.as_json("Print one JSON document (with --watch: one per round, one line each).")
@click.option("--check", is_flag=True,
              help="Exit 12 when accept length or output tok/s is under the gate's fraction of the last good "
                   "deployment's (1 not serving, 4 unreachable, 5 unexpected output, 0 otherwise).")
@click.option("--watch", "watch_s", type=click.FloatRange(0.5, 86400), is_flag=False, flag_value=5.0, default=None,
              metavar="[SECONDS]", callback=_finite,
              help="Read again every SECONDS (default 5) until Ctrl-C: a table redrawn in place on a terminal.")
@click.option("--rounds", type=click.IntRange(1, 10**9), default=None, help="With --watch: stop after N rounds.")
@click.option("--prom-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the figures in Prometheus text format to FILE, atomically "
                   "(node_exporter's textfile collector: a *.prom file in its directory).")
@click.option("--probe", is_flag=True,
              help="When the server generated nothing in the window, send a few greedy requests (the verify "
                   "prompts, at the last good benchmark's concurrency) and measure them: the only throughput "
                   "compared with the last good one.")
@click.option("--window", "window_s", type=click.FloatRange(0.2, 60), default=2.0, show_default=True, callback=_finite,
              help="Seconds between the two reads of the server's counters.")
@click.option("--playbook", "playbook_name", default="nightly", show_default=True,
              help="Playbook (name or YAML file) whose regression-gate fractions apply.")
@click.option("--min-accept-fraction", type=click.FloatRange(0.01, 1.0), default=None, callback=_finite,
              help="Below this x the last good accept length is a regression (default: the playbook's gate, 0.9).")
@click.option("--min-throughput-fraction", type=click.FloatRange(0.01, 1.0), default=None, callback=_finite,
              help="Below this x the last good output tok/s is a regression (default: the playbook's gate, 0.9).")
@click.pass_obj
def command(globals_, run_name, host_names, as_json: bool, check: bool, watch_s: float | None, rounds: int | None,
            prom_file: Path | None, probe: bool, window_s: float, playbook_name: str,
            min_accept_fraction: float | None, min_throughput_fraction: float | None) -> int:
    """Live accept length, tok/s, requests, PID and drafter of each host's server, vs its last good one."""
    from deploy.base.errors import UsageError
    from deploy.verbs import status

    if check and watch_s is not None:
        raise UsageError("--check reads once and exits with its verdict; it cannot be combined with --watch")
    if rounds is not None and watch_s is None:
        raise UsageError("--rounds needs --watch")
    reader = status.status_reader(globals_.load(), run_name, host_names, playbook_name=playbook_name,
                                  min_accept_fraction=min_accept_fraction,
                                  min_throughput_fraction=min_throughput_fraction, window_s=window_s, probe=probe,
                                  prom_file=prom_file)
    if watch_s is None:
        readings, router = reader.read()
        _show_once(reader.run, readings, reader.gate, as_json, check, router)
        return status.exit_code(readings, check, router)
    return _watch(reader.run, reader.gate, reader.read, watch_s, rounds, as_json)


def _show_once(run, readings, gate, as_json: bool, check: bool, router=None) -> None:
    from deploy.render import report as render
    from deploy.verbs import status
    from deploy.render import status as status_render

    if as_json:
        render.print_json(status.document(run, readings, gate, router))
    elif sys.stdout.isatty():
        console = render.console()
        console.print(status_render.table(readings, status_render.title(run.name, gate), console.width, router))
    else:
        for line in status_render.plain_lines(readings, router):
            click.echo(line)
    if check:
        for line in status_render.findings(readings, router):
            click.echo(line, err=True)


def _watch(run, gate, read, interval_s: float, rounds: int | None, as_json: bool) -> int:
    """Ctrl-C is how a watch ends: exit 0 (the figures were shown; nothing was changed)."""
    import json

    from deploy.base.secrets import mask_secrets
    from deploy.render import report as render
    from deploy.verbs import status
    from deploy.render import status as status_render

    try:
        if as_json or not sys.stdout.isatty():
            def show(read_out) -> None:
                readings, router = read_out
                if as_json:
                    click.echo(json.dumps(mask_secrets(status.document(run, readings, gate, router)), sort_keys=True))
                else:
                    for line in status_render.plain_lines(readings, router):
                        click.echo(line)
                sys.stdout.flush()

            status.watch(rounds, interval_s, read, show)
        else:
            from rich.console import Group
            from rich.live import Live
            from rich.text import Text

            with Live(Text("reading ..."), console=render.console(), auto_refresh=False, transient=False) as live:
                def redraw(read_out) -> None:
                    readings, router = read_out
                    # an empty last line: the terminal's "^C" echo lands there instead of wrapping the
                    # table's last line, which would shift Live's final redraw by one line
                    table = status_render.table(readings, status_render.title(run.name, gate), live.console.width,
                                                router)
                    live.update(Group(table, Text("")), refresh=True)

                status.watch(rounds, interval_s, read, redraw)
    except KeyboardInterrupt:
        click.echo("status --watch: stopped (Ctrl-C)", err=True)
    return 0
