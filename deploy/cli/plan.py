"""deployctl plan: every command a playbook would run, per host; changes nothing."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import execute, request_of


@click.command("plan")
@click.argument("playbook", default="up")
@options.run
@options.hosts
@options.draft_tokens
@options.as_json("The plan as a JSON document (launch argv as a list).")
@click.pass_obj
def command(globals_, playbook: str, as_json: bool, **kw) -> int:
    """Print, per host, every command PLAYBOOK (up, restart, down or a file) would run; change nothing."""
    return execute(globals_, request_of(globals_, "plan", playbook, **kw), as_json)
