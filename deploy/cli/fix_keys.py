"""deployctl fix-keys: the key fix on a local drafter, with the very code that runs on the hosts."""

from __future__ import annotations

import click


@click.command(
    "fix-keys",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.pass_context
def command(ctx: click.Context) -> int:
    """Convert a speculators EAGLE-3 drafter for SGLang in place (see fix-keys --help)."""
    from deploy.remote import fixer

    return fixer.main(list(ctx.args), prog="deployctl fix-keys")
