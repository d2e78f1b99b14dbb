"""free-gpus: ``fuser -k`` on the host's GPU device files.

Even after the server is stopped, orphaned workers can keep a GPU's memory; fuser finds every
process holding /dev/nvidia* open. fuser prints PIDs on stdout without a newline, names and
"Cannot stat ... Permission denied" noise on stderr, and exits 1 when no process held the files:
none of that is a failure. psmisc's fuser takes no ``--`` (it prints its usage and exits 1, which
reads exactly like "nothing held the GPUs"), so the device paths must not start with '-': the
config requires an absolute path, and exit 1 with a usage message is an error.
"""

from __future__ import annotations

import re

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.shell import quote_glob
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

NAME = "free-gpus"
NO_DEVICE_FILES = 3


#: skipped when converge found the server already running as desired
CONVERGE_SKIPS = True


class Settings(StepSettings):
    pass


def command(ctx: StepContext) -> str:
    pattern = quote_glob(ctx.host.gpu_devices)
    return (
        f"set -- {pattern}; "
        f"if [ ! -e \"$1\" ]; then echo \"no GPU device files match $1\" >&2; exit {NO_DEVICE_FILES}; fi; "
        "exec fuser -k \"$@\""
    )


def parse_pids(stdout: str, source: str) -> list[int]:
    pids = []
    for token in stdout.split():
        match = re.fullmatch(r"(\d+)[a-zA-Z]*", token)
        if not match:
            raise RemoteOutputError(f"{source}: unexpected fuser output {stdout.strip()[:200]!r}")
        pids.append(int(match.group(1)))
    return sorted(set(pids))


def plan(ctx: StepContext) -> list[PlannedCommand]:
    return [PlannedCommand(f"kill every process holding {ctx.host.gpu_devices}", command(ctx))]


def run(ctx: StepContext) -> StepOutcome:
    conn = ctx.require_conn()
    result = conn.run(command(ctx), timeout=ctx.timeout(60))
    if result.exit_code == NO_DEVICE_FILES:
        raise RemoteCommandFailed(f"{ctx.host.name}: {result.stderr.strip()} (gpu_devices: {ctx.host.gpu_devices})")
    if result.exit_code == 1 and re.search(r"Usage:|No process specification|unknown option|invalid option",
                                            result.stderr):
        raise RemoteCommandFailed(f"{ctx.host.name}: fuser rejected its arguments: {result.stderr.strip()[:300]}")
    if result.exit_code not in (0, 1):
        raise RemoteCommandFailed(f"{ctx.host.name}: fuser -k failed (exit {result.exit_code}): {result.stderr.strip()[-300:]}")
    pids = parse_pids(result.stdout, ctx.host.name)
    denied = [ln for ln in result.stderr.splitlines() if ln.startswith("Could not kill")]
    for line in denied:
        ctx.progress(line)
    detail = f"killed {len(pids)} holder(s): {' '.join(map(str, pids))}" if pids else "no process held the GPUs"
    return StepOutcome("ok", detail, {"killed": pids, "not_permitted": denied})
