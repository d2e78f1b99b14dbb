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
from typing import Any, Iterator, Sequence

from deploy.base.limits import parse_json
from deploy.config.models import Host
from deploy.base.errors import DeployError, ExitCode, LockHeld, RemoteOutputError
from deploy.local.state import (LocalStateError, ensure_directory, read_regular, require_not_directory,
                                 state_home, write_regular)
from deploy.base.shell import path_join, quote, quote_path
from deploy.facts.helpers import helper_python
from deploy.base.once import built_once

HOST_LOCK_SOURCE = Path(__file__).resolve().parents[1] / "remote" / "host_lock.py"
#: an OSError the host printed that means "this file system refuses the write" (EACCES, EPERM,
#: ENOSPC, EROFS, EDQUOT): the state dir is read-only, full or not the user's, exit 10
#: ... or a state file that is not a regular file (host_ops.replace_file refuses to replace it, issue 31)
#: ... or a lock file planted by another user of the host (a symbolic or hard link, a FIFO, a device,
#: a file swapped while opened: host_lock.py refuses to use it, issue 38)
WRITE_FAILURE = re.compile(r"\[Errno (13|1|28|30|122)\]|Read-only file system|No space left|Disk quota|Permission denied|"
                           r"not a regular file; not replaced|refused to use the (GPU|host) lock")


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


# every lock and release on every host sends the same program; built per call, its zlib compression
# was 3 builds per host of every verb that locks (about 10 ms of `up`'s CPU per extra host, issue 37)
@built_once
def host_lock_program() -> str:
    """host_lock.py with state_files beside it (its bounded reads and replace_file), one ``-c`` program."""
    from deploy.facts.helpers import remote_modules
    from deploy.facts.inline import inline_program

    return inline_program(remote_modules("state_files") + [("host_lock", HOST_LOCK_SOURCE.read_text())], "host_lock")


def host_lock_command(host: Host, owner: dict | str, script: str | None = None) -> str:
    """``owner``/``script`` as text: the plan's placeholders for what is known only at run time."""
    source = host_lock_program() if script is None else script
    owner_text = owner if isinstance(owner, str) else json.dumps(owner, sort_keys=True)
    # the gpu_devices glob: one more lock per GPU device file, whatever the state dir (host_lock.py)
    return " ".join([helper_python(host.python), "-c", quote(source), "deployctl-host-lock", quote_path(host_lock_path(host)),
                     quote(owner_text), quote(host.gpu_devices)])


def parse_host_lock(line: str, source: str) -> dict:
    try:
        document = parse_json(line)
        if not isinstance(document, dict) or not isinstance(document["acquired"], bool):
            raise TypeError
        other = document.get("previous" if document["acquired"] else "owner")
        if other is not None and not isinstance(other, dict):
            raise TypeError
        if not all(isinstance(document.get(key, ""), str) for key in ("device", "lock")):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise RemoteOutputError(f"{source}: the host lock helper printed {line[:300]!r}") from None
    return document


def disk_full(detail: str) -> str | None:
    """What host_lock.py's full-disk line says (free bytes and inodes of the state dir's filesystem), or None."""
    marker = "deployctl-disk-full "
    if not detail.startswith(marker):
        return None
    try:
        document = parse_json(detail[len(marker):])
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    error = str(document.get("error", "no space left on device"))[:200]
    free, inodes = document.get("free_bytes"), document.get("free_inodes")
    if isinstance(free, int) and isinstance(inodes, int):
        return f"{error}; {free / 2**20:.1f} MiB and {inodes} inodes free"
    return f"{error}; free space unknown"


def acquire_host_lock(conn, host: Host, owner: dict):
    """Take the host lock; returns (held command, warning or None). Raises LockHeld (exit 9)."""
    held = conn.hold(host_lock_command(host, owner), timeout=60)
    if held.exit_code not in (None, 0) or not held.first_line:
        detail = (held.stderr.strip().splitlines() or ["(no output)"])[-1]
        if "refused to use the GPU lock" in detail:  # planted in the shared lock dir: named, nothing written
            raise DeployError(f"{host.name}: cannot take the GPU lock: {detail}", exit_code=ExitCode.IO)
        full = disk_full(detail)
        if full is not None:
            raise DeployError(f"{host.name}: the disk of state_dir {host.state_dir} is full ({full}): cannot write the "
                              f"host lock {host_lock_path(host)}; nothing was changed. Free space on that "
                              "filesystem (old drafters in drafters/, logs in logs/) and run again", exit_code=ExitCode.IO)
        if WRITE_FAILURE.search(detail):  # read-only, full, over quota, not ours: exit 10, as documented
            raise DeployError(f"{host.name}: cannot write the host lock {host_lock_path(host)} in state_dir "
                              f"{host.state_dir}: {detail}", exit_code=ExitCode.IO)
        raise RemoteOutputError(f"{host.name}: cannot take the host lock {host_lock_path(host)} "
                                f"with {host.python} (exit {held.exit_code}): {detail}")
    document = parse_host_lock(held.first_line, host.name)
    if not document["acquired"]:
        held.close()
        if document.get("device"):
            # another config (another state_dir or user) deploys to the same GPUs of this host
            raise LockHeld(f"{host.name}: GPU device {document['device']} is locked by "
                           f"{describe_owner(document.get('owner'))} ({document.get('lock')}); "
                           "try again when it has finished")
        raise LockHeld(f"{host.name}: locked by {describe_owner(document.get('owner'))} "
                       f"({host_lock_path(host)}); try again when it has finished")
    warning = None
    if document.get("previous"):
        warning = (f"lock taken over from {describe_owner(document['previous'])}, "
                   "which is gone (it ended without releasing it)")
    return held, warning


def local_lock_path(config_path: Path, run: str, scope: str = "") -> Path:
    """One lock file per config, run and ``scope`` (``host:NAME``, ``router:NAME``; ``""``: the
    whole run, the lock's form before it was taken per host)."""
    identity = f"{Path(config_path).resolve()}\0{run}" + (f"\0{scope}" if scope else "")
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:40]  # the hash is the identity; this is for people
    if scope:
        readable += "-" + re.sub(r"[^A-Za-z0-9_.-]", "_", scope)[:60]
    return state_home() / "locks" / f"{readable}-{key}.lock"


def local_scopes(hosts: Sequence[str], router_host: str | None = None) -> list[str]:
    """The local locks a run on ``hosts`` takes: one per host, one for the run's router (its
    membership is changed by every batch of the run, whichever hosts it names)."""
    scopes = sorted({f"host:{name}" for name in hosts})
    if router_host is not None:
        scopes.append(f"router:{router_host}")
    return scopes


@contextmanager
def local_lock(config_path: Path, run: str, owner: dict, scopes: Sequence[str] = ("",)) -> Iterator[None]:
    """One deployctl per config, run and host (and router) on this machine (the filelock package;
    flock on Linux): runs of one config on disjoint host sets proceed in parallel, overlapping ones
    are refused naming the holder of the first lock they share. All or nothing: a refusal releases
    the locks already taken; they are taken in sorted order, so two runs never wait on each other."""
    from filelock import FileLock, Timeout

    taken: list[tuple[Any, Path | None]] = []  # (lock, its owner file once this run wrote it)
    try:
        for scope in sorted(set(scopes)):
            path = local_lock_path(config_path, run, scope)
            # every problem with the state directory is exit 10 naming the path (deploy/local/state.py)
            ensure_directory(path.parent, "deployctl's local locks folder")
            owner_path = path.with_name(path.name + ".owner.json")
            require_not_directory(path, "a local lock file")
            require_not_directory(owner_path, "a local lock's owner file")
            lock = FileLock(str(path))
            try:
                lock.acquire(timeout=0)
            except Timeout:
                try:
                    holder = parse_json(read_regular(owner_path, 64 << 10, "the lock's owner file") or b"null")
                except (DeployError, ValueError, RecursionError):
                    holder = None
                what = f" {scope.replace(':', ' ', 1)}" if scope else ""
                raise LockHeld(f"config {config_path} run {run!r}{what} is locked on this machine by "
                               f"{describe_owner(holder if isinstance(holder, dict) else None)} ({path})") from None
            except OSError as exc:
                raise LocalStateError(f"{path}: cannot take the local lock: {exc.strerror or exc}") from None
            taken.append((lock, None))
            # a link or another user's file planted there is refused (exit 10) and left as it was
            write_regular(owner_path, (json.dumps(owner) + "\n").encode(), "the lock's owner file", append=False)
            taken[-1] = (lock, owner_path)
        yield
    finally:
        for lock, written in reversed(taken):
            if written is not None:
                try:
                    written.unlink()
                except OSError:
                    pass
            lock.release()

