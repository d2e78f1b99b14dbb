"""deployctl restart: redeploy after a checkpoint change."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import execute, request_of


@click.command("restart")
@options.deploy_options
@options.ignore_doctor
@options.replace
@options.retry_failed
@options.force
@options.swap_drafter
@options.reload_drafter
@options.no_rollback()
@options.fleet
@click.option("--canary", is_flag=True,
              help="Behind a router: the first batch serves live traffic beside the others for the run's "
                   "rollout.canary window (default 10m) and is promoted or rolled back on its live acceptance "
                   "and speed (docs/fleets.md).")
@click.pass_obj
def command(globals_, playbook_name: str | None, as_json: bool, **kw) -> int:
    """After a checkpoint change: doctor, re-fix if the drafter changed, then swap it into the running
    server (opted in, only its tensors changed) or stop, free, launch, wait."""
    return execute(globals_, request_of(globals_, "restart", playbook_name or "restart", **kw), as_json)
