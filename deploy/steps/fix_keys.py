"""fix-keys: run the key fix on the host's drafter (layers.0.* -> midlayer.*, config), verified.

SGLang 0.5.6-0.5.11 drops a speculators checkpoint's decoder-layer tensors without a word; the
drafter then runs randomly initialised and acceptance collapses to 1.00 (the first seed). The
fixer runs on the host under its python3, from the persistent state dir, and answers in JSON.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from deploy.errors import DeployError, ExitCode, RemoteCommandFailed, RemoteOutputError, VerificationFailed
from deploy.shell import quote, quote_path
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

NAME = "fix-keys"
FIXER = "fix_eagle3_keys.py"
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+\w-]*)$")


class Settings(StepSettings):
    #: always: run the fixer (a no-op "already converted" when nothing changed);
    #: changed: skip when the drafter's fingerprint matches the one recorded after the last fix.
    when: Literal["always", "changed"] = "always"
    #: which engine extracted the training hidden states (aux layer ids are off by one between them)
    hidden_states_from: Literal["keep", "vllm", "sglang"] = "keep"


def version_command(ctx: StepContext) -> str:
    # Package metadata, never `import sglang`: importing a real SGLang 0.5.23 costs ~2.6 s and
    # ~320 MiB on every host and every run; reading its dist-info costs ~0.06 s and ~15 MiB.
    program = "import sys, importlib.metadata as m; sys.stdout.write(m.version('sglang'))"
    return f"{quote(ctx.run.sglang_python)} -c {quote(program)}"


def fixer_command(ctx: StepContext, *flags: str) -> str:
    parts = [quote(ctx.host.python), quote_path(ctx.paths.helper(FIXER))]
    parts += [quote(f) for f in flags]
    parts += ["--", quote_path(ctx.run.drafter)]  # a path is never read as an option
    return " ".join(parts)


def convert_flags(ctx: StepContext, version: str | None) -> list[str]:
    flags = ["--json", "--hidden-states-from", ctx.settings.hidden_states_from]
    if ctx.run.sglang_generation != "auto":
        flags += ["--sglang-generation", ctx.run.sglang_generation]
    elif version:
        flags += ["--sglang-version", version]
    return flags


def parse_version(result, source: str, python: str = "python3") -> str:
    text = result.stdout.strip()
    if "No module named 'sglang'" in result.stderr or "PackageNotFoundError" in result.stderr:
        raise RemoteCommandFailed(
            f"{source}: SGLang is not installed for {python!r}; set the run's sglang_python to the "
            "interpreter that has it (a venv's bin/python, say)"
        )
    if result.exit_code != 0 or not VERSION_RE.match(text):
        detail = (result.stderr.strip().splitlines() or [text or "(no output)"])[-1]
        raise RemoteOutputError(f"{source}: cannot read the installed SGLang version: {detail}")
    return text


def _fixer_failure_text(result) -> str:
    """What a failed fixer run said, without a Python traceback's frames (the last line is the error)."""
    text = (result.stderr.strip() or result.stdout.strip())
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in text.splitlines() if ln.strip()][-1:]
        return "the fixer crashed: " + (last[0].strip() if last else "(no message)")
    return text[-500:] or "(no output)"


def fixer_exit_code(value, source: str) -> ExitCode:
    try:
        return ExitCode(int(value))
    except (TypeError, ValueError):
        raise RemoteOutputError(f"{source}: the key fixer reported exit code {value!r}, not one of deployctl's") from None


def parse_fixer_json(result, source: str) -> dict:
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    try:
        document = json.loads("\n".join(lines))
    except (ValueError, RecursionError):
        raise RemoteOutputError(
            f"{source}: the key fixer did not print its JSON summary (exit {result.exit_code}): "
            f"{_fixer_failure_text(result)}"
        ) from None
    if not isinstance(document, dict) or "status" not in document:
        raise RemoteOutputError(f"{source}: the key fixer's JSON has no 'status': {str(document)[:200]}")
    if document["status"] == "error" and not isinstance(document.get("error"), str):
        raise RemoteOutputError(f"{source}: the key fixer's error document has no message: {str(document)[:200]}")
    return document


def record_fingerprint_command(ctx: StepContext, fingerprint: str) -> str:
    """Write via a temporary file and rename; on a full disk the 0-byte temporary file is removed."""
    final = quote_path(ctx.paths.fingerprint)
    tmp = quote_path(ctx.paths.fingerprint + ".tmp")
    return (f"{{ printf '%s\\n' {quote(fingerprint)} > {tmp} && mv -f -- {tmp} {final}; }} "
            f"|| {{ rm -f -- {tmp}; exit 1; }}")


def plan(ctx: StepContext) -> list[PlannedCommand]:
    commands = []
    if ctx.settings.when == "changed":
        commands.append(PlannedCommand("read the fingerprint recorded after the last fix", f"cat -- {quote_path(ctx.paths.fingerprint)}"))
        commands.append(PlannedCommand("fingerprint the drafter (header bytes, sizes, mtimes)", fixer_command(ctx, "--fingerprint")))
    if ctx.run.sglang_generation == "auto":
        commands.append(PlannedCommand("read the installed SGLang version", version_command(ctx)))
    commands.append(PlannedCommand("convert and verify the drafter", fixer_command(ctx, *convert_flags(ctx, "<version>"))))
    commands.append(PlannedCommand("record the drafter fingerprint", record_fingerprint_command(ctx, "<fingerprint>")))
    return commands


def run(ctx: StepContext) -> StepOutcome:
    conn = ctx.require_conn()
    source = ctx.host.name
    timeout = ctx.timeout(ctx.run.timeouts.fix_keys_s)
    if ctx.settings.when == "changed":
        recorded = conn.run(f"cat -- {quote_path(ctx.paths.fingerprint)}").stdout.strip()
        current = parse_fixer_json(conn.run(fixer_command(ctx, "--fingerprint"), timeout=timeout), source)
        if current.get("status") == "error":
            raise DeployError(f"{source}: {current.get('error')}", exit_code=fixer_exit_code(current.get("code", 1), source))
        if recorded and recorded == current.get("fingerprint"):
            return StepOutcome("skipped", "drafter unchanged since the last fix", {"fingerprint": recorded})
    version = None
    if ctx.run.sglang_generation == "auto":
        # the doctor step already read it from the same package metadata in this run
        version = ctx.memory.get("sglang_version") or \
            parse_version(conn.run(version_command(ctx), timeout=60), source, ctx.run.sglang_python)
    result = conn.run(fixer_command(ctx, *convert_flags(ctx, version)), timeout=timeout)
    summary = parse_fixer_json(result, source)
    if summary["status"] == "error":
        code = fixer_exit_code(summary.get("code", ExitCode.CHECKPOINT), source)
        raise DeployError(f"{source}: key fix of {ctx.run.drafter}: {summary.get('error')}", exit_code=code)
    verification = summary.get("verification") or {}
    fingerprint = summary.get("fingerprint")
    if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{16,128}", fingerprint):
        raise RemoteOutputError(f"{source}: the key fixer's summary has no valid fingerprint")
    conn.check(record_fingerprint_command(ctx, fingerprint), what="recording the drafter fingerprint")
    renamed = len(summary.get("renames") or [])
    data = {"status": summary["status"], "renamed": renamed, "sglang_version": version,
            "verification": verification, "fingerprint": fingerprint}
    if verification.get("ok") is False or result.exit_code == ExitCode.VERIFY:
        # The fixer orders problems root cause first ("EAGLE3 currently only supports 1 layer" on
        # SGLang 0.5.11 and older); the dropped/missing name lists would bury it.
        gaps = (verification.get("problems") or []) or \
            ((verification.get("dropped") or []) + (verification.get("missing") or []))
        raise VerificationFailed(f"{source}: SGLang would not load the drafter fully: {'; '.join(map(str, gaps))[:800]}")
    if result.exit_code != 0:
        raise RemoteOutputError(f"{source}: key fixer exited {result.exit_code} with status {summary['status']!r}")
    detail = "already converted" if summary["status"] == "already_converted" else f"converted, {renamed} keys renamed"
    return StepOutcome("ok", detail, data)
