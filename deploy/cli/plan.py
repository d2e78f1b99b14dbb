"""deployctl plan: every command a playbook would run, per host; changes nothing."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import execute


@click.command("plan")
@click.argument("playbook", default="up")
@options.run
@options.hosts
@options.draft_tokens
@options.as_json("The plan as a JSON document (launch argv as a list).")
@click.pass_obj
def command(globals_, playbook: str, run_name, host_names, draft_tokens, as_json) -> int:
    """Print, per host, every command PLAYBOOK (up, restart, down or a file) would run; change nothing."""
    return execute(globals_, "plan", playbook, run_name, host_names, draft_tokens, None, True, as_json)
