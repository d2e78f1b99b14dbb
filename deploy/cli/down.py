"""deployctl down: stop the server deployctl launched."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import execute, request_of


@click.command("down")
@options.deploy_options
@click.option("--free-gpus", is_flag=True, help="Also fuser -k the GPU device files and wait until free.")
@click.pass_obj
def command(globals_, playbook_name: str | None, as_json: bool, **kw) -> int:
    """Stop the server deployctl launched (by its PID file first)."""
    return execute(globals_, request_of(globals_, "down", playbook_name or "down", **kw), as_json)
