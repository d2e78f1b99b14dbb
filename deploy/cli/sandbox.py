"""deployctl sandbox start|stop|status: the local SIMULATED GPU hosts (real sshd, simulated GPUs).

For the demo and the tests only; deploy/sandbox is never used against real hosts. The verb hands
its arguments to ``python -m deploy.sandbox`` so both spellings are one implementation.
"""

from __future__ import annotations

import click


@click.command(
    "sandbox",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.pass_context
def command(ctx: click.Context) -> int:
    """Local SIMULATED GPU hosts: real sshd on 127.0.0.x, simulated nvidia-smi and SGLang (root)."""
    from deploy.sandbox.__main__ import main

    return main(list(ctx.args) or ["--help"], prog="deployctl sandbox")
