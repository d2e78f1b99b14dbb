"""free-gpus: ``fuser -k`` on the host's GPU device files.

Even after the server is stopped, orphaned workers can keep a GPU's memory; fuser finds every
process holding /dev/nvidia* open. fuser prints PIDs on stdout without a newline, names and
"Cannot stat ... Permission denied" noise on stderr, and exits 1 when no process held the files:
none of that is a failure. psmisc's fuser takes no ``--`` (it prints its usage and exits 1, which
reads exactly like "nothing held the GPUs"), so the device paths must not start with '-': the
config requires an absolute path, and exit 1 with a usage message is an error.
"""

from __future__ import annotations

from deploy.facts.fuser import kill_command, parse_kill_result
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings

NAME = "free-gpus"
#: skipped when converge found the server already running as desired
CONVERGE_SKIPS = True


class Settings(StepSettings):
    #: also kill other users' processes holding the GPUs (issue 39: never unless the run says so; the doctor
    #: names every process this step would kill before anything is stopped)
    kill_other_users: bool = False


def command(ctx: StepContext) -> str:
    return kill_command(ctx.host.gpu_devices, ctx.settings.kill_other_users)


def action(ctx: StepContext) -> Command:
    whose = "every process" if ctx.settings.kill_other_users else "the deploy user's processes"
    return Command(description=f"kill {whose} holding {ctx.host.gpu_devices}", command=command(ctx),
                   timeout_s=ctx.timeout(60))


def plan(ctx: StepContext) -> list[Command]:
    return [action(ctx)]


def run(ctx: StepContext) -> StepOutcome:
    result = ctx.execute(action(ctx))
    killed = parse_kill_result(result.exit_code, result.stdout, result.stderr, ctx.host.name, ctx.host.gpu_devices)
    pids, denied = killed.pids, killed.not_permitted
    for line in denied + killed.other_users:
        ctx.progress(line)
    detail = f"killed {len(pids)} holder(s): {' '.join(map(str, pids))}" if pids else "no process of ours held the GPUs"
    if killed.other_users:
        detail += f"; {len(killed.other_users)} of other users left alone (kill_other_users)"
    return StepOutcome("ok", detail, {"killed": pids, "not_permitted": denied, "other_users": killed.other_users})
