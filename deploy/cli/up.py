"""deployctl up: doctor, key fix, stop stale, free the GPUs, launch, wait until ready (or nothing)."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import execute, request_of


@click.command("up")
@options.deploy_options
@options.ignore_doctor
@options.replace
@options.force
@options.no_rollback()
@options.fleet
@click.pass_obj
def command(globals_, playbook_name: str | None, as_json: bool, **kw) -> int:
    """Doctor, fix the drafter's keys, stop stale python3, free the GPUs, launch SGLang, wait until ready.

    Already running as desired (same argv, drafter, environment, SGLang version; alive; /health
    200): nothing is touched. A failure after stop-stale relaunches the last good deployment (exit 11).
    """
    return execute(globals_, request_of(globals_, "up", playbook_name or "up", **kw), as_json)
