#!/usr/bin/env python3
"""Hold the host's deployctl lock for as long as deployctl's SSH channel to this process is open.

Standalone, Python 3.8+ standard library only. deployctl sends this file's source inline, with
host_ops.py beside it for its one safe file write (``python3 -c PROGRAM deployctl-host-lock LOCK
OWNER_JSON [GPU_DEVICES]``, deploy/facts/inline.py) so the lock is taken before anything is uploaded or changed.

Two kinds of flock, all or nothing: ``LOCK`` (in the state dir: the state files deployctl writes
there) and, with ``GPU_DEVICES`` (the host's gpu_devices glob), one lock per GPU device file it
matches, in a directory every user of the host shares (``/run/lock``, else ``/var/lock``,
``/dev/shm``, ``/tmp``: the first world-writable sticky one), named after the device's real path.
Two configs that name the same host with different state dirs (or users) therefore contend for the
GPUs they share: the stop-stale and ``fuser -k`` of one must never hit the other's server.
A GPU lock file holds its holder's owner JSON, so a refusal names it.

``flock(LOCK_EX | LOCK_NB)`` on ``LOCK``; then one JSON line on stdout:
``{"acquired": true, "previous": OWNER|null}`` (``previous``: an owner file left by a holder that
is gone, e.g. a deployctl killed with SIGKILL) or ``{"acquired": false, "owner": OWNER|null}``
(with ``"device"`` and ``"lock"`` when a GPU device's lock was the one held).
While held, the process blocks reading stdin. deployctl releases it by writing ``release`` and
closing the channel: the owner file is removed. When deployctl dies instead (SIGKILL, a dropped
connection), sshd closes the pipe: EOF without ``release``, the owner file stays behind as the
trace of a holder that is gone (the next holder warns about it) and the process exits; the
kernel drops the flock with the last descriptor even if this process is itself killed. No
heartbeats, no expiry: the lock lives exactly as long as the connection that asked for it.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import json
import os
import stat
import sys

if __package__:  # imported locally, as deploy.remote.host_lock
    from . import host_ops
else:  # sent inline: deploy/engine/locks.py bundles host_ops beside it (deploy/facts/inline.py)
    import host_ops  # type: ignore[no-redef]

#: where the per-GPU locks live: shared by every user of the host (FHS /run/lock first)
SHARED_DIRS = ("/run/lock", "/var/lock", "/dev/shm", "/tmp")
MAX_DEVICES = 1024


def _read_owner(path: str):
    # non-blocking, a regular file, 64 KiB, 64 levels deep: a FIFO there must not hold the lock helper
    text, problem = host_ops.read_regular(path, 65536)
    if problem is not None:
        return {"unreadable": problem[:200]}
    if text is None:
        return None
    try:
        document = host_ops.loads_json(text)
    except ValueError as exc:
        return {"unreadable": str(exc)[:200]}
    return document if isinstance(document, dict) else {"unreadable": str(document)[:200]}


def shared_dir(candidates=SHARED_DIRS):
    """The first world-writable sticky directory: the same answer for every user of this host."""
    for path in candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_mode & 0o1002 == 0o1002:
            return os.path.realpath(path)
    raise OSError("no world-writable sticky directory among %s for the GPU locks" % ", ".join(candidates))


def gpu_lock_paths(pattern: str, directory: str):
    """(device real path, lock path) per file the gpu_devices glob matches, sorted (a fixed order:
    two runs never wait on each other); an empty match locks the expanded pattern itself."""
    expanded = os.path.expanduser(pattern)
    devices = sorted(set(os.path.realpath(p) for p in glob.glob(expanded)[:MAX_DEVICES])) or [expanded]
    return [(device, os.path.join(directory, "deployctl-gpu-%s.lock" % hashlib.sha256(device.encode()).hexdigest()[:24]))
            for device in devices]


def _open_shared(path: str) -> int:
    """Open (or create, mode 0666 so every user can lock it) a lock file in the shared directory;
    never through a link (another user may plant one) and only a regular file."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(3):
        for mode in (os.O_RDWR, os.O_RDONLY):
            try:
                fd = os.open(path, flags | mode)
            except FileNotFoundError:
                break
            except PermissionError:
                continue
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError("%s is not a regular file" % path)
            return fd
        else:
            raise PermissionError("cannot open %s" % path)
        try:
            fd = os.open(path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue  # another run created it in between: open that one
        os.fchmod(fd, 0o666)  # the umask must not keep other users from locking the same GPU
        return fd
    raise OSError("cannot open %s" % path)


def _read_fd(fd: int):
    try:
        document = host_ops.loads_json(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "null")
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)[:200]}
    return document if isinstance(document, dict) or document is None else {"unreadable": str(document)[:200]}


def _write_fd(fd: int, text: str) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass  # opened read-only (another user's file): the lock holds, only its owner note is missing


def _busy(exc: OSError) -> bool:
    return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


def hold(lock_path: str, owner_json: str, stdin=None, stdout=None, gpu_devices=None, directory=None) -> int:
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    owner_path = lock_path + ".owner.json"
    owner = json.loads(owner_json)
    state_dir = os.path.dirname(lock_path) or "."
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if not _busy(exc):
            raise
        stdout.write(json.dumps({"acquired": False, "owner": _read_owner(owner_path)}) + "\n")
        stdout.flush()
        return 0
    gpu_fds = []  # type: list[int]
    if gpu_devices is not None:
        for device, path in gpu_lock_paths(gpu_devices, directory or shared_dir()):
            gpu_fd = _open_shared(path)
            try:
                fcntl.flock(gpu_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _read_fd(gpu_fd)
                for other in gpu_fds + [gpu_fd, fd]:
                    os.close(other)
                if not _busy(exc):
                    raise
                stdout.write(json.dumps({"acquired": False, "owner": holder, "device": device, "lock": path}) + "\n")
                stdout.flush()
                return 0
            gpu_fds.append(gpu_fd)
    previous = _read_owner(owner_path)
    owner["host_pid"] = os.getpid()
    for gpu_fd in gpu_fds:
        _write_fd(gpu_fd, json.dumps(owner) + "\n")
    # the one safe write (an exclusive temporary name; a link planted there is never written through)
    host_ops.replace_file(owner_path, (json.dumps(owner) + "\n").encode("utf-8"), 0o644)
    stdout.write(json.dumps({"acquired": True, "previous": previous}) + "\n")
    stdout.flush()
    received = b""
    try:
        while True:
            chunk = stdin.read(4096)
            if not chunk:
                break
            received = (received + chunk)[-64:]
    finally:
        # Still holding the flock here, so no new holder has written its owner file yet.
        if b"release" in received:
            try:
                os.unlink(owner_path)
            except OSError:
                pass
            for gpu_fd in gpu_fds:
                _write_fd(gpu_fd, "")
        for other in gpu_fds + [fd]:
            os.close(other)
    return 0


#: first argument, so host_ops.py stop-processes (scope user: every python3 of the deploy user)
#: recognises this process and never kills the lock of the run that is stopping processes
MARK = "deployctl-host-lock"


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (3, 4) or args[0] != MARK:
        sys.stderr.write("usage: host_lock.py %s LOCK_PATH OWNER_JSON [GPU_DEVICES]\n" % MARK)
        return 2
    try:
        return hold(args[1], args[2], gpu_devices=args[3] if len(args) == 4 else None)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # issue 39: a full disk was reported as a traceback's last line, and the run's headline guessed at
        # another deployctl; say which filesystem is full and what is left on it (one line, parsed locally)
        sys.stderr.write(disk_full_line(exc, os.path.dirname(args[1]) or ".") + "\n")
        return 1


#: the one line a full disk prints (deploy/engine/locks.py reads it)
DISK_FULL = "deployctl-disk-full"


def disk_full_line(exc: OSError, directory: str) -> str:
    free = {"path": directory, "error": "%s: %s" % (exc.strerror or exc, exc.filename or directory)}  # type: dict[str, object]
    try:
        st = os.statvfs(directory)
        free.update(free_bytes=st.f_bavail * st.f_frsize, free_inodes=st.f_favail)
    except OSError:
        pass
    return "%s %s" % (DISK_FULL, json.dumps(free, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
