"""Locks that keep two deployctl runs from changing the same host (or config and run) at once.

Host lock: ``<state_dir>/deployctl.lock``, an ``flock`` held by ``deploy/remote/host_lock.py`` on
the host for as long as this process's SSH channel to it is open (see ``HostConnection.hold``).
A deployctl killed with SIGKILL closes its TCP connection with it, sshd closes the helper's stdin
and the kernel drops the flock: the next run takes over at once, with a warning naming the gone
holder (its owner file is still there). Local lock: ``filelock`` on a file per config and run
under the XDG state directory, with the same owner information beside it.

Read-only verbs (gpu-status, plan, doctor, logs) take neither.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import socket
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from deploy.config.models import Host
from deploy.errors import DeployError, ExitCode, LockHeld, RemoteOutputError
from deploy.local_state import (LocalStateError, ensure_directory, read_regular, require_not_directory,
                                 state_home, write_regular)
from deploy.shell import path_join, quote, quote_path
from deploy.facts.helpers import helper_python

HOST_LOCK_SOURCE = Path(__file__).resolve().parent / "remote" / "host_lock.py"
#: an OSError the host printed that means "this file system refuses the write" (EACCES, EPERM,
#: ENOSPC, EROFS, EDQUOT): the state dir is read-only, full or not the user's, exit 10
WRITE_FAILURE = re.compile(r"\[Errno (13|1|28|30|122)\]|Read-only file system|No space left|Disk quota|Permission denied")


def owner_info(command: str, run: str) -> dict[str, Any]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return {"hostname": socket.gethostname(), "pid": os.getpid(), "user": user, "command": command,
            "run": run, "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def describe_owner(owner: dict | None) -> str:
    if not owner:
        return "an unknown holder (no owner file)"
    if "unreadable" in owner:
        return f"an unknown holder (owner file unreadable: {owner['unreadable']})"
    return (f"deployctl {owner.get('command', '?')} of run {owner.get('run', '?')!r} by "
            f"{owner.get('user', '?')}@{owner.get('hostname', '?')} (pid {owner.get('pid', '?')}), "
            f"since {owner.get('started_at', '?')}")


def host_lock_path(host: Host) -> str:
    return path_join(host.state_dir, "deployctl.lock")


def host_lock_command(host: Host, owner: dict | str, script: str | None = None) -> str:
    """``owner``/``script`` as text: the plan's placeholders for what is known only at run time."""
    source = HOST_LOCK_SOURCE.read_text() if script is None else script
    owner_text = owner if isinstance(owner, str) else json.dumps(owner, sort_keys=True)
    return " ".join([helper_python(host.python), "-c", quote(source), "deployctl-host-lock", quote_path(host_lock_path(host)),
                     quote(owner_text)])


def parse_host_lock(line: str, source: str) -> dict:
    try:
        document = json.loads(line)
        if not isinstance(document, dict) or not isinstance(document["acquired"], bool):
            raise TypeError
        other = document.get("previous" if document["acquired"] else "owner")
        if other is not None and not isinstance(other, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise RemoteOutputError(f"{source}: the host lock helper printed {line[:300]!r}") from None
    return document


def acquire_host_lock(conn, host: Host, owner: dict):
    """Take the host lock; returns (held command, warning or None). Raises LockHeld (exit 9)."""
    held = conn.hold(host_lock_command(host, owner), timeout=60)
    if held.exit_code not in (None, 0) or not held.first_line:
        detail = (held.stderr.strip().splitlines() or ["(no output)"])[-1]
        if WRITE_FAILURE.search(detail):  # read-only, full, over quota, not ours: exit 10, as documented
            raise DeployError(f"{host.name}: cannot write the host lock {host_lock_path(host)} in state_dir "
                              f"{host.state_dir}: {detail}", exit_code=ExitCode.IO)
        raise RemoteOutputError(f"{host.name}: cannot take the host lock {host_lock_path(host)} "
                                f"with {host.python} (exit {held.exit_code}): {detail}")
    document = parse_host_lock(held.first_line, host.name)
    if not document["acquired"]:
        held.close()
        raise LockHeld(f"{host.name}: locked by {describe_owner(document.get('owner'))} "
                       f"({host_lock_path(host)}); try again when it has finished")
    warning = None
    if document.get("previous"):
        warning = (f"lock taken over from {describe_owner(document['previous'])}, "
                   "which is gone (it ended without releasing it)")
    return held, warning


def local_lock_path(config_path: Path, run: str) -> Path:
    key = hashlib.sha256(f"{Path(config_path).resolve()}\0{run}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:40]  # the hash is the identity; this is for people
    return state_home() / "locks" / f"{readable}-{key}.lock"


@contextmanager
def local_lock(config_path: Path, run: str, owner: dict) -> Iterator[None]:
    """One deployctl per config and run on this machine (the filelock package; flock on Linux)."""
    from filelock import FileLock, Timeout

    path = local_lock_path(config_path, run)
    # every problem with the state directory is exit 10 naming the path (deploy/local_state.py)
    ensure_directory(path.parent, "deployctl's local locks folder")
    owner_path = path.with_name(path.name + ".owner.json")
    require_not_directory(path, "a local lock file")
    require_not_directory(owner_path, "a local lock's owner file")
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            holder = json.loads(read_regular(owner_path, 64 << 10, "the lock's owner file") or b"null")
        except (DeployError, ValueError, RecursionError):
            holder = None
        raise LockHeld(f"config {config_path} run {run!r} is locked on this machine by "
                       f"{describe_owner(holder if isinstance(holder, dict) else None)} ({path})") from None
    except OSError as exc:
        raise LocalStateError(f"{path}: cannot take the local lock: {exc.strerror or exc}") from None
    try:
        write_regular(owner_path, (json.dumps(owner) + "\n").encode(), "the lock's owner file", append=False)
        yield
    finally:
        try:
            owner_path.unlink()
        except OSError:
            pass
        lock.release()
