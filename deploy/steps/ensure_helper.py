"""ensure-helper: the host-side helpers live in the persistent state dir, checked by sha256.

The second seed lost its fix script because it lived in the host's /tmp and a VM crash wiped it.
Here a wiped (or tampered) state directory costs one SFTP upload, nothing more.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.shell import quote, quote_path
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

NAME = "ensure-helper"
HELPERS_DIR = Path(__file__).resolve().parents[1] / "remote"
HELPER_FILES = ("host_ops.py", "fix_eagle3_keys.py")
MIN_PYTHON = (3, 8)


class Settings(StepSettings):
    pass


def python_version_command(ctx: StepContext) -> str:
    return f"{quote(ctx.host.python)} -c " + quote('import sys; sys.stdout.write("%d.%d" % sys.version_info[:2])')


def check_python_version(result, ctx: StepContext) -> tuple[int, int]:
    text = result.stdout.strip()
    if result.exit_code != 0:
        detail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RemoteCommandFailed(f"{ctx.host.name}: cannot run the host's python {ctx.host.python!r}: {detail}")
    match = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not match:
        raise RemoteOutputError(f"{ctx.host.name}: {ctx.host.python} printed {text[:80]!r} for its version")
    version = (int(match.group(1)), int(match.group(2)))
    if version < MIN_PYTHON:
        raise RemoteCommandFailed(
            f"{ctx.host.name}: {ctx.host.python} is Python {text}; the host-side helpers need "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ (set hosts[].python to a newer interpreter)"
        )
    return version


def local_digests() -> dict[str, str]:
    return {name: hashlib.sha256((HELPERS_DIR / name).read_bytes()).hexdigest() for name in HELPER_FILES}


def digest_command(ctx: StepContext) -> str:
    files = " ".join(quote_path(ctx.paths.helper(n)) for n in HELPER_FILES)
    # One line per file: "<sha256>  <name>" or "missing <name>"; never fails on a missing file.
    return (
        f"for f in {files}; do if [ -f \"$f\" ]; then sha256sum -- \"$f\"; "
        "else printf 'missing %s\\n' \"$f\"; fi; done"
    )


def parse_digests(output: str, expected_files: list[str], source: str) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        match = re.fullmatch(r"([0-9a-f]{64})  (.+)|missing (.+)", line)
        if not match:
            raise RemoteOutputError(f"{source}: unexpected sha256sum output line {line!r}")
        path = match.group(2) or match.group(3)
        found[path.rsplit("/", 1)[-1]] = match.group(1)
    if sorted(found) != sorted(expected_files):
        raise RemoteOutputError(f"{source}: sha256sum reported {sorted(found)}, expected {sorted(expected_files)}")
    return found


def plan(ctx: StepContext) -> list[PlannedCommand]:
    return [
        PlannedCommand(f"check the host's python is {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+", python_version_command(ctx)),
        PlannedCommand("create the persistent helper directory", f"mkdir -p -m 700 -- {quote_path(ctx.paths.helpers)}"),
        PlannedCommand("compare helper sha256 with the local copies", digest_command(ctx)),
        PlannedCommand(
            "upload missing or changed helpers over SFTP (tmp name, then rename)",
            "sftp put " + " ".join(HELPER_FILES) + f" -> {ctx.paths.helpers}/",
        ),
    ]


def run(ctx: StepContext) -> StepOutcome:
    conn = ctx.require_conn()
    check_python_version(conn.run(python_version_command(ctx)), ctx)
    conn.check(f"mkdir -p -m 700 -- {quote_path(ctx.paths.helpers)}", what="creating the state directory")
    wanted = local_digests()
    remote = parse_digests(conn.check(digest_command(ctx), what="sha256sum").stdout, list(HELPER_FILES), ctx.host.name)
    uploaded = []
    for name, digest in wanted.items():
        if remote.get(name) == digest:
            continue
        target = conn.resolve(ctx.paths.helper(name))
        try:
            conn.put(HELPERS_DIR / name, target + ".upload")
        except RemoteCommandFailed:
            # a full disk leaves a partial .upload file behind: remove it, keep the old helper
            conn.run(f"rm -f -- {quote_path(target + '.upload')}")
            raise
        conn.check(f"mv -f -- {quote_path(target + '.upload')} {quote_path(target)}", what="installing helper")
        uploaded.append(name)
    if uploaded:
        after = parse_digests(conn.check(digest_command(ctx), what="sha256sum").stdout, list(HELPER_FILES), ctx.host.name)
        bad = [n for n in HELPER_FILES if after.get(n) != wanted[n]]
        if bad:
            raise RemoteOutputError(f"{ctx.host.name}: sha256 of uploaded helper(s) {bad} does not match the local copy")
        return StepOutcome("ok", f"uploaded {', '.join(uploaded)}", {"uploaded": uploaded})
    return StepOutcome("ok", "helpers present, sha256 match", {"uploaded": []})
