"""A host-side command's process group: how deployctl stops the whole of a command it no longer waits for.

Closing an SSH channel (no pty) only closes the command's pipes: a command that does not write (the fix-keys
store copying a checkpoint, a watch loop inside an nvidia-smi query) runs on until it ends. Issue 39: after
Ctrl-C the fix-keys store ran 7.3 s after deployctl released the host lock, and a restart started at once
failed with exit 10; the read-only watch-gpus helper ran up to 25 s after deployctl exited.

Every command HostConnection sends announces its process group first (``group_wrap``); on a signal, a
second command stops that group and waits until none of it is left (``stop_group_command``), before the
call returns, so before the host lock is released (deploy/ssh/transport.py ``_stop_group``).
"""

from __future__ import annotations

import shlex

#: the first line each command HostConnection sends prints on stderr: the PID of the coreutils ``timeout``
#: that bounds it (``exec``: the login shell becomes it). timeout moves itself and the command into a process
#: group of their own (setpgid, unless --foreground), so that PID names the command's whole process group.
GROUP_MARK = b"deployctl-pgid "
#: a cancelled command's process group: SIGTERM, then SIGKILL after this long, then give up after as long again
GROUP_TERM_WAIT_S = 2.0


def group_wrap(wrapped: str) -> str:
    """``wrapped`` (a ``remote_timeout_wrap`` command), announcing its process group first on stderr."""
    return f"echo {GROUP_MARK.decode().strip()} $$ >&2; exec {wrapped}"


def split_group_mark(stderr: bytes) -> tuple[int | None, bytes]:
    """(process group, the rest of stderr): the mark ``group_wrap`` prints is never part of the answer. It is
    the first line that has its shape (a login shell's startup files may print before it; the command itself
    only after it)."""
    start = 0 if stderr.startswith(GROUP_MARK) else stderr.find(b"\n" + GROUP_MARK, 0, 4096) + 1
    if start == 0 and not stderr.startswith(GROUP_MARK):
        return None, stderr
    end = stderr.find(b"\n", start)
    if end < 0:
        return None, stderr  # not whole yet
    digits = stderr[start + len(GROUP_MARK):end].strip()
    rest = stderr[:start] + stderr[end + 1:]
    return (int(digits) if digits.isdigit() and int(digits) > 1 else None), rest


def stop_group_command(pgid: int, term_wait_s: float = GROUP_TERM_WAIT_S) -> str:
    """Stop the process group ``pgid`` and wait until none of it is left: SIGTERM, SIGKILL after ``term_wait_s``;
    exit 0 when it is gone (or was), 1 when something of it outlived SIGKILL for as long again."""
    polls = max(1, int(term_wait_s / 0.05))
    # a member is left while one is not a zombie (a host whose PID 1 reaps no orphans keeps them as zombies)
    script = (f"g={int(pgid)}; kill -TERM -$g 2>/dev/null || exit 0; i=0; "
              "left() { kill -0 -$g 2>/dev/null || return 1; command -v ps >/dev/null 2>&1 || return 0; "
              "ps -eo pgid=,stat= | awk -v g=$g '$1 == g && $2 !~ /^Z/ {f = 1} END {exit !f}'; }; "
              f"while left; do i=$((i+1)); "
              f"if [ $i -eq {polls} ]; then kill -KILL -$g 2>/dev/null; fi; "
              f"if [ $i -ge {2 * polls} ]; then exit 1; fi; sleep 0.05; done")
    return "sh -c " + shlex.quote(script)
