"""deployctl nightly: the unattended redeploy (cron, systemd timer).

Never prompts. Progress lines are timestamped and go to stderr and to a log file per invocation
under ``$XDG_STATE_HOME/deployctl/nightly/``; stdout gets the report: a table on a terminal,
plain timestamped lines otherwise, only the JSON document with ``--json``. Exit codes: 0, 11
(failed, previous deployment restored and verified), 12 (regression; rolled back unless
``--no-rollback``), 9 (another deployctl holds the lock), 1 (the host serves nothing), ...
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone

import click

from deploy.cli import options


def _log_file():
    from deploy.local.state import LocalStateError, ensure_directory, state_home

    directory = ensure_directory(state_home() / "nightly", "deployctl's nightly log folder")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    path = directory / f"nightly-{stamp}.log"
    try:
        # O_EXCL|O_NOFOLLOW: a new file of ours, never a FIFO or link planted under the name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LocalStateError(f"{path}: cannot create the nightly log: {exc.strerror or exc}") from None
    return path, open(fd, "a", encoding="utf-8")


def _progress(log):
    import threading

    lock = threading.Lock()

    def show(host: str, step: str, message: str) -> None:
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        from deploy.base.terminal import safe_line, safe_text

        line = f"{stamp} [{safe_line(host)}] {safe_line(step)}: {safe_text(message)}\n"
        with lock:
            sys.stderr.write(line)
            sys.stderr.flush()
            log.write(line)
            log.flush()

    return show


@click.command("nightly")
@options.run
@options.hosts
@options.playbook("nightly")
@options.force
@options.no_rollback("On a failure or regression, leave the new deployment (or nothing) instead of the last good one.")
@click.option("--min-accept-fraction", type=click.FloatRange(0.01, 1.0), default=None,
              help="Regression if accept length < this x the last good one's (playbook default 0.9).")
@click.option("--min-throughput-fraction", type=click.FloatRange(0.01, 1.0), default=None,
              help="Regression if output tok/s over the benchmark rounds is < this x the last good one's and "
                   "its 95% interval is wholly below 1x; below it within the noise: inconclusive, no rollback "
                   "(playbook default 0.9).")
@options.dataset
@options.as_json("Print only the JSON report on stdout.")
@options.replace
@options.retry_failed
@options.fleet
@click.pass_obj
def command(globals_, playbook_name: str, as_json: bool, **kw) -> int:
    """Lock, converge to the drafter now at the configured path, verify, benchmark, gate, roll back on failure."""
    from deploy.cli.common import request_of, write_canary_report
    from deploy.render import report as render
    from deploy.verbs import deploy

    # every refusal (run, hosts, rollout, dataset: the gate compares only records of the same dataset
    # and load) before the log file is made
    prepared = deploy.prepare(request_of(globals_, "nightly", playbook_name, **kw), globals_.load())
    run, hosts = prepared.run, prepared.hosts
    path, log = _log_file()
    with log:
        progress = _progress(log)
        progress("*", "nightly", f"run {run.name}, hosts {', '.join(h.name for h in hosts)}, log {path}")
        result = deploy.run(prepared, progress)
        if result.fleet is not None:
            write_canary_report(result.fleet, run.name, progress)
        reports = result.reports
        document = render.report_document("nightly", run.name, reports) | {"log_file": str(path)}
        if result.fleet is not None:
            from deploy.fleet.plan import fleet_report

            document["fleet"] = fleet_report(result.fleet)
        render.print_json(document, log)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if as_json:
            render.print_json(document)
        elif sys.stdout.isatty():
            render.step_summary_tables("nightly", reports, render.console())
        else:
            for line in render.plain_report_lines("nightly", reports, stamp):
                click.echo(line)
    return result.exit_code
