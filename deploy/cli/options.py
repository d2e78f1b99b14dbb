"""The options several verbs share, declared once; a verb lists the ones it takes.

Bounds are not repeated here: ``--draft-tokens`` is an int that goes into the run and is validated
by the same model as the YAML (deploy/config/models.py), cross-field rules included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

run = click.option("--run", "run_name", default=None, help="Run from the config (default: the only one).")
hosts = click.option("--host", "host_names", multiple=True, help="Only these hosts of the run (repeatable).")
group = click.option("--group", default=None, help="Only hosts in this group.")
draft_tokens = click.option(
    "--draft-tokens", type=int, default=None,
    help="--speculative-num-draft-tokens (topk 1: num-steps = T - 1). Default: the run's.")
draft_tokens_sweep = click.option(
    "--draft-tokens", "draft_tokens", type=int, multiple=True,
    help="Deploy and benchmark with T draft tokens; repeat for a sweep (16, 10, 5). Default: the run's.")
dataset = click.option(
    "--dataset", default=None, metavar="FILE|builtin|random-ids",
    help="bench_serving's prompts: a ShareGPT .json or SGLang custom .jsonl file here (uploaded once per "
         "sha256), 'builtin' (default: deployctl's chat/code/math/summarisation set) or 'random-ids'.")
dry_run = click.option("--dry-run", is_flag=True, help="Print every command in order; change nothing.")
force = click.option("--force", is_flag=True, help="Redeploy even when the server already runs as desired.")
ignore_doctor = click.option("--ignore-doctor", is_flag=True,
                             help="Run on past failing doctor checks (they are still printed).")
replace = click.option("--replace", is_flag=True,
                       help="Stop a server of another run, or one deployctl did not start, on the run's GPUs "
                            "(without it the doctor refuses before anything is stopped).")
swap_drafter = click.option("--swap-drafter", "drafter_update", flag_value="swap", default=None,
                            help="Swap a new drafter into the running server when only its tensors changed "
                                 "(SGLang 0.5.21+; not yet seen on real GPUs): no target reload. Else reload.")
reload_drafter = click.option("--reload", "drafter_update", flag_value="reload",
                              help="Reload (stop, launch) even when the run says drafter_update: swap.")
retry_failed = click.option("--retry-failed", is_flag=True,
                            help="Redeploy a drafter fingerprint that failed on the host before (quarantined: "
                                 "exit 13 otherwise).")


def as_json(help: str = "Print a JSON report document on stdout.") -> Decorator:
    return click.option("--json", "as_json", is_flag=True, help=help)


def playbook(default: str | None = None) -> Decorator:
    return click.option("--playbook", "playbook_name", default=default, show_default=default is not None,
                        help="Playbook name or YAML file to run instead.")


def no_rollback(help: str = "On a failure after stop-stale, do not relaunch the last good deployment.") -> Decorator:
    return click.option("--no-rollback", "no_rollback", is_flag=True, help=help)


def apply(*decorators: Decorator) -> Decorator:
    """Apply ``decorators`` so that --help lists them in the order given."""
    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func
    return wrap


#: what up, restart and down take
deploy_options = apply(run, hosts, draft_tokens, playbook(), dry_run, as_json())


#: rolling redeploys behind the router (up, restart, nightly)
serial = click.option("--serial", type=click.IntRange(1, 4096), default=None,
                      help="Hosts per batch (rolling: out of the router, drain, redeploy, verify, back in). "
                           "Default: all at once without a router, 1 with one.")
allow_downtime = click.option("--allow-downtime", is_flag=True,
                              help="Allow a batch that takes the router's last healthy worker out.")
fleet = apply(serial, allow_downtime)
