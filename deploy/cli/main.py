"""The deployctl command line: parse flags, load config, call the engine or the read-only verbs, render.

Heavy imports (fabric, paramiko, pydantic, rich) happen inside commands so ``--help`` stays fast.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import click

from deploy import __version__
from deploy.base.errors import DeployError, ExitCode

DEFAULT_CONFIG = "deployctl.yaml"


@dataclass
class Globals:
    config_path: Path
    accept_new_host_keys: bool

    def load(self):
        from deploy.verbs.selection import load_config

        return load_config(self.config_path, self.accept_new_host_keys)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="deployctl")
@click.option(
    "-c",
    "--config",
    "config_path",
    # not dir_okay=False: click would exit 2; a directory given as the config is a config error (3)
    type=click.Path(path_type=Path),
    default=None,
    help=f"Hosts and runs YAML. Default: $DEPLOYCTL_CONFIG, else ./{DEFAULT_CONFIG}.",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Record the key of a host not yet in known_hosts (like OpenSSH accept-new). "
    "A changed key is always refused.",
)
@click.option(
    "--traceback",
    "show_traceback",
    is_flag=True,
    help="On an internal error (a bug in deployctl), print its traceback instead of one line.",
)
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, accept_new_host_keys: bool, show_traceback: bool) -> None:
    """Deploy an EAGLE-3 drafter with SGLang on GPU hosts: key fix, GPU cleanup, launch, verify."""
    from deploy.base import errors

    errors.show_tracebacks = show_traceback
    if config_path is None:
        config_path = Path(os.environ.get("DEPLOYCTL_CONFIG") or DEFAULT_CONFIG)
    ctx.obj = Globals(config_path=config_path, accept_new_host_keys=accept_new_host_keys)


#: every verb, one module each under deploy/cli/ (each defines ``command``), in --help order.
VERBS = ("up", "restart", "down", "plan", "bench", "nightly", "doctor", "gpu_status", "status", "logs",
         "history", "fix_keys")


def _register() -> None:
    import importlib

    for module in VERBS:
        cli.add_command(importlib.import_module(f"deploy.cli.{module}").command)


_register()


def _verb_and_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The verb and the arguments after it, untouched, skipping the group's own options; (None, [])
    when the command line names no verb."""
    i = 0
    while i < len(args):
        token = args[i]
        if token in ("-c", "--config"):
            i += 2
        elif token.startswith(("--config=", "-c")) or token in ("--accept-new-host-keys", "--traceback"):
            i += 1
        elif token.startswith("-"):
            return None, []
        else:
            return token, args[i + 1:]
    return None, []


def _fix_keys_args(args: list[str]) -> list[str] | None:
    """The arguments after ``fix-keys``, untouched, or None when the verb is another one.

    click drops ``--`` from a command's extra arguments, so ``fix-keys -- -odd-name`` would reach
    the fixer as an option; the fixer gets its arguments exactly as typed instead.
    """
    verb, rest = _verb_and_args(args)
    return rest if verb == "fix-keys" else None


def _json_verb(args: list[str]) -> str | None:
    """The verb when the command line gives it ``--json`` and it takes the option, else None: that
    verb's every outcome is a JSON document on stdout, the errors before or instead of its own
    document included (and click's usage errors, which happen before the verb runs)."""
    verb, rest = _verb_and_args(args)
    command = cli.commands.get(verb or "")
    if command is None or not any(p.name == "as_json" for p in command.params):
        return None
    options = rest[:rest.index("--")] if "--" in rest else rest
    return verb if "--json" in options else None


def _documents_printed() -> int:
    """The JSON documents printed on stdout so far (rendering is imported by a verb, not by --help)."""
    render = sys.modules.get("deploy.render.report")
    return 0 if render is None else int(getattr(render, "stdout_documents", 0))


def _failed(json_verb: str | None, printed_before: int, code: int, message: str) -> int:
    """``code``, after printing the error document of a --json verb that printed no document of its
    own (one that did, bench's after a failed round, already says how it ended)."""
    if json_verb is not None and _documents_printed() == printed_before:
        from deploy.render import report as render

        render.print_json(render.error_document(json_verb, code, message), one_line=True)
    return int(code)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; user errors never produce a traceback."""
    raw = list(sys.argv[1:] if argv is None else argv)
    from deploy.base import errors

    errors.show_tracebacks = False
    fix_args = _fix_keys_args(raw)
    if fix_args is not None:
        from deploy.remote import fixer

        return fixer.main(fix_args, prog="deployctl fix-keys")
    from deploy.base.signals import Terminated, terminate_like_interrupt

    json_verb, printed = _json_verb(raw), _documents_printed()
    try:
        with terminate_like_interrupt():
            result = cli.main(args=argv, prog_name="deployctl", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        code = ExitCode.USAGE if isinstance(exc, click.UsageError) else exc.exit_code
        return _failed(json_verb, printed, code, exc.format_message())
    except click.exceptions.Abort as exc:
        if isinstance(exc.__context__, Terminated):  # click turns every KeyboardInterrupt into Abort
            click.echo(f"terminated by {exc.__context__}", err=True)
            return _failed(json_verb, printed, exc.__context__.exit_code, f"terminated by {exc.__context__}")
        click.echo("aborted", err=True)
        return _failed(json_verb, printed, ExitCode.INTERRUPTED, "aborted")
    except DeployError as exc:
        from deploy.base.terminal import safe_text

        click.echo(f"error: {safe_text(exc)}", err=True)
        return _failed(json_verb, printed, exc.exit_code, str(exc))
    except Terminated as exc:  # SIGTERM/SIGHUP: handled like Ctrl-C, the exit code says which signal
        click.echo(f"terminated by {exc}", err=True)
        return _failed(json_verb, printed, exc.exit_code, f"terminated by {exc}")
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return _failed(json_verb, printed, ExitCode.INTERRUPTED, "interrupted")
    except Exception as exc:  # a bug: one line by default, the whole traceback with --traceback
        from deploy.base.secrets import mask_text

        if errors.show_tracebacks:
            traceback.print_exception(exc, file=sys.stderr)
            click.echo(f"internal error: {type(exc).__name__}: {mask_text(str(exc))}", err=True)
        else:
            click.echo(f"internal error: {type(exc).__name__}: {mask_text(str(exc))} (run with --traceback)", err=True)
        return _failed(json_verb, printed, ExitCode.FAILED, f"internal error: {type(exc).__name__}: {mask_text(str(exc))}")
    return int(result or 0)


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
