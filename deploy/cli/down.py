"""deployctl down: stop the server deployctl launched."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import execute


@click.command("down")
@options.deploy_options
@click.option("--free-gpus", is_flag=True, help="Also fuser -k the GPU device files and wait until free.")
@click.pass_obj
def command(globals_, free_gpus: bool, **kw) -> int:
    """Stop the server deployctl launched (by its PID file first)."""
    overrides = {"free-gpus": {"enabled": True}, "wait-gpus-free": {"enabled": True}} if free_gpus else {}
    return execute(globals_, "down", "down", overrides=overrides, **kw)
