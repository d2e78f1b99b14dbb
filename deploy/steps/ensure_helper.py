"""ensure-helper: the host-side helpers live in the persistent state dir, checked by sha256.

A hand-run deployment lost its fix script because it lived in the host's /tmp and a VM crash wiped it.
Here a wiped (or tampered) state directory costs one SFTP upload, nothing more.
"""

from __future__ import annotations

import hashlib

from deploy.facts import helpers
from deploy.facts.helpers import HELPER_FILES, MIN_PYTHON, helper_payloads
from deploy.steps.base import Action, Command, StepContext, StepOutcome, StepSettings, Upload, UploadFile

NAME = "ensure-helper"


class Settings(StepSettings):
    pass


def local_digests(payloads: dict[str, bytes] | None = None) -> dict[str, str]:
    payloads = helper_payloads() if payloads is None else payloads
    return {name: hashlib.sha256(data).hexdigest() for name, data in payloads.items()}


def state_action(ctx: StepContext) -> Command:
    return Command(description=f"check the host's python is {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ and read the installed "
                               "helpers' sha256",
                   when="doctor did not read them in this run",
                   command=helpers.helper_state_command(ctx.host.python, [ctx.paths.helper(n) for n in HELPER_FILES]),
                   timeout_s=60)


def upload_action(ctx: StepContext, names: list[str] | None = None) -> Upload:
    payloads = helper_payloads()
    chosen = list(HELPER_FILES) if names is None else names
    return Upload(description="install the helpers in the persistent state dir (never /tmp)",
                  when="a helper is missing or its sha256 differs from the local copy; only those are sent",
                  directory=ctx.paths.helpers,
                  files=tuple(UploadFile(remote=ctx.paths.helper(n), content=payloads[n], mode=0o600) for n in chosen))


def plan(ctx: StepContext) -> list[Action]:
    return [state_action(ctx), upload_action(ctx)]


def run(ctx: StepContext) -> StepOutcome:
    snapshot = ctx.memory.snapshot
    if snapshot is not None:
        helpers.require_python(snapshot.python, ctx.host.python, ctx.host.name)
        remote = snapshot.helpers
    else:
        result = ctx.execute(state_action(ctx))
        remote = helpers.parse_helper_state(result.exit_code, result.stdout, result.stderr, ctx.host.python,
                                            list(HELPER_FILES), ctx.host.name).files
    wanted = local_digests()
    stale = [name for name in HELPER_FILES if remote.get(name) != wanted[name]]
    if not stale:
        return StepOutcome("ok", "helpers present, sha256 match", {"uploaded": []})
    # one SFTP session: temporary names, size checked, renamed into place; a full disk keeps the old helper
    ctx.execute_upload(upload_action(ctx, stale))
    return StepOutcome("ok", f"uploaded {', '.join(stale)}", {"uploaded": stale})
