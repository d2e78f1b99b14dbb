"""deployctl restart: redeploy after a checkpoint change."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import doctor_override, execute


@click.command("restart")
@options.deploy_options
@options.ignore_doctor
@options.force
@options.no_rollback()
@options.fleet
@click.pass_obj
def command(globals_, ignore_doctor: bool, **kw) -> int:
    """After a checkpoint change: doctor, re-fix if the drafter changed, then stop, free, launch, wait."""
    return execute(globals_, "restart", "restart", overrides=doctor_override(ignore_doctor), **kw)
