"""ensure-helper: the host-side helpers live in the persistent state dir, checked by sha256.

A hand-run deployment lost its fix script because it lived in the host's /tmp and a VM crash wiped it.
Here a wiped (or tampered) state directory costs one SFTP upload, nothing more.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.facts import helpers
from deploy.facts.helpers import HELPER_FILES, MIN_PYTHON, helper_payloads
from deploy.shell import quote_path
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

NAME = "ensure-helper"


class Settings(StepSettings):
    pass


def python_version_command(ctx: StepContext) -> str:
    return helpers.python_version_command(ctx.host.python)


def check_python_version(result, ctx: StepContext) -> tuple[int, int]:
    return helpers.parse_python_version(result.exit_code, result.stdout, result.stderr, ctx.host.python,
                                        ctx.host.name).as_tuple()


def local_digests(payloads: dict[str, bytes] | None = None) -> dict[str, str]:
    payloads = helper_payloads() if payloads is None else payloads
    return {name: hashlib.sha256(data).hexdigest() for name, data in payloads.items()}


def digest_command(ctx: StepContext) -> str:
    return helpers.digest_command([ctx.paths.helper(n) for n in HELPER_FILES])


def remote_digests(output: str, source: str) -> dict[str, str | None]:
    return helpers.parse_digests(output, list(HELPER_FILES), source).files


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
    payloads = helper_payloads()
    wanted = local_digests(payloads)
    remote = remote_digests(conn.check(digest_command(ctx), what="sha256sum").stdout, ctx.host.name)
    uploaded = []
    for name, digest in wanted.items():
        if remote.get(name) == digest:
            continue
        target = conn.resolve(ctx.paths.helper(name))
        try:
            with tempfile.TemporaryDirectory(prefix="deployctl-helper-") as tmp:
                local = Path(tmp) / name
                local.write_bytes(payloads[name])
                conn.put(local, target + ".upload")
        except RemoteCommandFailed:
            # a full disk leaves a partial .upload file behind: remove it, keep the old helper
            conn.run(f"rm -f -- {quote_path(target + '.upload')}")
            raise
        conn.check(f"mv -f -- {quote_path(target + '.upload')} {quote_path(target)}", what="installing helper")
        uploaded.append(name)
    if uploaded:
        after = remote_digests(conn.check(digest_command(ctx), what="sha256sum").stdout, ctx.host.name)
        bad = [n for n in HELPER_FILES if after.get(n) != wanted[n]]
        if bad:
            raise RemoteOutputError(f"{ctx.host.name}: sha256 of uploaded helper(s) {bad} does not match the local copy")
        return StepOutcome("ok", f"uploaded {', '.join(uploaded)}", {"uploaded": uploaded})
    return StepOutcome("ok", "helpers present, sha256 match", {"uploaded": []})
