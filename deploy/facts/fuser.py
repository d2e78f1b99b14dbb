"""``fuser -k`` on the GPU device files: which PIDs held them (and were sent SIGKILL).

psmisc's fuser prints the PIDs on stdout separated by spaces, each optionally followed by access
letters (``4242m``), with no trailing newline; the file names and "Cannot stat" noise go to stderr.
It exits 1 when no process held the files, which is not a failure of ``fuser -k``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from deploy.base.errors import RemoteCommandFailed, RemoteOutputError
from deploy.base.shell import quote_glob

#: the command's own exit code when the device glob matches no file
NO_DEVICE_FILES = 3


class FuserKilled(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: sorted, each once
    pids: list[int]
    #: fuser's "Could not kill process N: Operation not permitted" lines (another user's process)
    not_permitted: list[str] = []
    #: "Not killed: process N of uid U (COMMAND): another user's" (issue 39: never killed unless the run says so)
    other_users: list[str] = []


#: the line kill_command prints on stderr for a holder of another user it leaves alone
OTHER_USER = "Not killed: process "


def kill_command(gpu_devices: str, kill_other_users: bool = False) -> str:
    """SIGKILL the processes holding the GPU device files. Only the deploy user's own (issue 39: deploying as
    root, ``fuser -k`` killed another user's (uid 65534) process that held a GPU), unless the run says so
    (free-gpus' ``kill_other_users``); each holder of another user left alone is named on stderr."""
    pattern = quote_glob(gpu_devices)
    head = (f"set -- {pattern}; "
            f"if [ ! -e \"$1\" ]; then echo \"no GPU device files match $1\" >&2; exit {NO_DEVICE_FILES}; fi; ")
    if kill_other_users:
        return head + "exec fuser -k \"$@\""
    # fuser lists (PIDs on stdout, names and its usage on stderr, exit 1 when none); the uid is /proc's
    return head + (
        "me=$(id -u); held=$(fuser \"$@\"); rc=$?; "
        "if [ $rc -ne 0 ] && [ -z \"$held\" ]; then exit $rc; fi; "
        "for t in $held; do p=${t%%[!0-9]*}; [ -n \"$p\" ] || continue; "
        "u=$(awk '/^Uid:/ {print $2}' /proc/$p/status 2>/dev/null); "
        "if [ \"$u\" = \"$me\" ]; then kill -KILL \"$p\" 2>/dev/null && printf '%s ' \"$p\"; "
        f"else printf '{OTHER_USER}%s of uid %s (%s): another user'\\''s\\n' \"$p\" \"${{u:-?}}\" "
        "\"$(tr '\\000' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-200)\" >&2; fi; done; exit 0"
    )


def parse_kill_result(exit_code: int, stdout: str, stderr: str, source: str, gpu_devices: str) -> FuserKilled:
    """The whole result of ``kill_command``: exit 0 (killed) and 1 (nothing held the files) are fine."""
    if exit_code == NO_DEVICE_FILES:
        raise RemoteCommandFailed(f"{source}: {stderr.strip()} (gpu_devices: {gpu_devices})")
    if exit_code == 1 and re.search(r"Usage:|No process specification|unknown option|invalid option", stderr):
        raise RemoteCommandFailed(f"{source}: fuser rejected its arguments: {stderr.strip()[:300]}")
    if exit_code not in (0, 1):
        raise RemoteCommandFailed(f"{source}: fuser -k failed (exit {exit_code}): {stderr.strip()[-300:]}")
    killed = parse_killed(stdout, source)
    denied = [ln for ln in stderr.splitlines() if ln.startswith("Could not kill")]
    others = [ln[:400] for ln in stderr.splitlines() if ln.startswith(OTHER_USER)]
    return FuserKilled(pids=killed.pids, not_permitted=denied, other_users=others)


def parse_killed(stdout: str, source: str) -> FuserKilled:
    pids = []
    for token in stdout.split():
        match = re.fullmatch(r"(\d+)[a-zA-Z]*", token)
        if not match:
            raise RemoteOutputError(f"{source}: unexpected fuser output {stdout.strip()[:200]!r}")
        pids.append(int(match.group(1)))
    return FuserKilled(pids=sorted(set(pids)))
