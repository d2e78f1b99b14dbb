#!/usr/bin/env python3
"""Hold the host's deployctl lock for as long as deployctl's SSH channel to this process is open.

Standalone, Python 3.8+ standard library only. deployctl sends this file's source inline, with
state_files.py beside it for its bounded reads and one safe file write (``python3 -c PROGRAM deployctl-host-lock LOCK
OWNER_JSON [GPU_DEVICES]``, deploy/facts/inline.py) so the lock is taken before anything is uploaded or changed.

Two kinds of flock, all or nothing: ``LOCK`` (in the state dir: the state files deployctl writes
there) and, with ``GPU_DEVICES`` (the host's gpu_devices glob), one lock per GPU device file it
matches, in a directory every user of the host shares (``/run/lock``, else ``/var/lock``,
``/dev/shm``, ``/tmp``: the first world-writable sticky one), named after the device's real path.
Two configs that name the same host with different state dirs (or users) therefore contend for the
GPUs they share: the stop-stale and ``fuser -k`` of one must never hit the other's server.
A GPU lock file holds its holder's owner JSON, so a refusal names it; a holder that may not write it
(another user's file: written only by its owner, issue 38) leaves the note in ``LOCK.<euid>.owner``
beside it instead, removed on release.

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

# state_files, not host_ops: the lock's reads and its one write are there, and the lock
# program (one per host and run) no longer compiles host_ops nor imports argparse (about 9 ms of its CPU)
if __package__:  # imported locally, as deploy.remote.host_lock
    from . import state_files
else:  # sent inline: deploy/engine/locks.py bundles state_files beside it (deploy/facts/inline.py)
    import state_files  # type: ignore[no-redef]

#: where the per-GPU locks live: shared by every user of the host (FHS /run/lock first)
SHARED_DIRS = ("/run/lock", "/var/lock", "/dev/shm", "/tmp")
MAX_DEVICES = 1024


def _read_owner(path: str):
    # non-blocking, a regular file, 64 KiB, 64 levels deep: a FIFO there must not hold the lock helper
    text, problem = state_files.read_regular(path, 65536)
    if problem is not None:
        return {"unreadable": problem[:200]}
    if text is None:
        return None
    try:
        document = state_files.loads_json(text)
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


class Refused(OSError):
    """A lock file that is not one deployctl may use: printed as one line naming it, deployctl exits 10."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str, why: str) -> Refused:
    return Refused("refused to use the GPU lock %s: %s; not a regular file of its own, nothing written" % (path, why))


def _check_shared(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "it is %s" % _kind(st.st_mode))
    if st.st_nlink != 1:
        # `ln VICTIM /run/lock/deployctl-gpu-....lock`: writing the owner note would truncate VICTIM
        raise _refuse(path, "it is a hard link (%d names)" % st.st_nlink)


def _open_shared(path: str):
    """Open (or create, mode 0666 so every user can lock it) a lock file in the shared directory:
    ``(fd, writable)``. Another user of the host may plant anything there (a symbolic or hard link
    to a file root owns, a FIFO, a device), so: never through a link (O_NOFOLLOW), never blocking
    (O_NONBLOCK), never truncated at open, fstat'ed before use: a regular file with one name, else
    Refused naming it. Only a file of our own effective uid is ever written (the owner note); another
    deployctl user's lock file is flocked read-only (the GPUs stay contended) and never written. A
    second O_RDWR open must be the very file the first one checked (st_dev/st_ino), else Refused."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    for _ in range(3):
        try:
            seen = os.lstat(path)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                continue  # another run created it in between: open that one
            os.fchmod(fd, 0o666)  # the umask must not keep other users from locking the same GPU
            return fd, True
        _check_shared(path, seen)  # a FIFO or device is refused before it is even opened
        try:
            fd = os.open(path, flags | os.O_RDONLY)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refuse(path, "it is a symbolic link") from None
            raise
        try:
            first = os.fstat(fd)
            _check_shared(path, first)
            if (first.st_dev, first.st_ino) != (seen.st_dev, seen.st_ino):
                raise _refuse(path, "it was replaced while it was opened")
            if first.st_uid != os.geteuid():
                return fd, False  # another user's lock: flock it, never write it
            try:
                second_fd = os.open(path, flags | os.O_RDWR)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise _refuse(path, "it was replaced by a symbolic link while it was opened") from None
                if exc.errno in (errno.EACCES, errno.EPERM):
                    return fd, False
                if exc.errno == errno.ENOENT:
                    raise _refuse(path, "it was removed while it was opened") from None
                raise
            second = os.fstat(second_fd)
            if (second.st_dev, second.st_ino) != (first.st_dev, first.st_ino):
                os.close(second_fd)
                raise _refuse(path, "it was replaced while it was opened")
            os.close(fd)
            return second_fd, True
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise
    raise OSError("cannot open %s" % path)


def _read_fd(fd: int):
    try:
        document = state_files.loads_json(os.pread(fd, 65536, 0).decode("utf-8", "replace") or "null")
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)[:200]}
    return document if isinstance(document, dict) or document is None else {"unreadable": str(document)[:200]}


def _write_fd(fd: int, text: str) -> None:
    """The owner note of a GPU lock file this process opened writable (its own, one name): fstat'ed
    again first, a file that gained a name since (a hard link) is left alone."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
    except OSError:
        pass  # the lock holds, only its owner note is missing


MAX_NOTES = 16


def _note_path(path: str, uid: int) -> str:
    return "%s.%d.owner" % (path, uid)


def _write_note(path: str, text: str):
    """The owner note of a GPU lock file that is another user's (so never written, issue 38): beside
    it, a file of this user's own, ``LOCK.<euid>.owner``, created O_EXCL|O_NOFOLLOW (a stale one of
    ours is replaced; anything else there, planted by another user, is left alone: no note). The path
    written, or None."""
    note = _note_path(path, os.geteuid())
    try:
        st = os.lstat(note)
    except FileNotFoundError:
        st = None
    except OSError:
        return None
    try:
        if st is not None:
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
                return None  # not a note of ours (a link, a hard link to one of our files): left alone
            os.unlink(note)
        fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, text.encode())
    except OSError:
        pass
    finally:
        os.close(fd)
    return note


def _remove_note(note: str) -> None:
    try:
        st = os.lstat(note)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1:
            os.unlink(note)
    except OSError:
        pass


def _read_note(note: str):
    try:
        fd = os.open(note, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 65536:
            return None
        document = state_files.loads_json(os.read(fd, 65537).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return document if isinstance(document, dict) else None


def _holder(path: str, fd: int):
    """Who holds a GPU lock: the newest of its own note and the ``LOCK.<uid>.owner`` notes beside it
    (a holder that could not write the lock file, another user's, wrote one; only a note the uid in
    its name owns counts)."""
    found = []
    holder = _read_fd(fd)
    if holder is not None:
        found.append((os.fstat(fd).st_mtime, holder))
    for note in sorted(glob.glob(glob.escape(path) + ".*.owner"))[:MAX_NOTES]:
        try:
            st = os.lstat(note)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and note == _note_path(path, st.st_uid):
            document = _read_note(note)
            if document is not None:
                found.append((st.st_mtime, document))
    return max(found, key=lambda item: item[0])[1] if found else None


def _busy(exc: OSError) -> bool:
    return exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


def _open_state_lock(lock_path: str) -> int:
    """The state dir's lock file, created 0600: never through a link, never blocking on a FIFO, a
    regular file or Refused naming it (it is only flocked, never written)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("refused to use the host lock %s: it is a symbolic link; not a regular file, "
                          "nothing written" % lock_path) from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise Refused("refused to use the host lock %s: it is %s; not a regular file, nothing written"
                          % (lock_path, "a directory" if exc.errno == errno.EISDIR else "a socket")) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise Refused("refused to use the host lock %s: it is %s; not a regular file, nothing written"
                      % (lock_path, _kind(mode)))
    return fd


def hold(lock_path: str, owner_json: str, stdin=None, stdout=None, gpu_devices=None, directory=None) -> int:
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    owner_path = lock_path + ".owner.json"
    owner = json.loads(owner_json)
    state_dir = os.path.dirname(lock_path) or "."
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = _open_state_lock(lock_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if not _busy(exc):
            raise
        stdout.write(json.dumps({"acquired": False, "owner": _read_owner(owner_path)}) + "\n")
        stdout.flush()
        return 0
    gpu_fds = []  # type: list[int]
    writable = []  # type: list[int]
    theirs = []  # type: list[str]
    if gpu_devices is not None:
        for device, path in gpu_lock_paths(gpu_devices, directory or shared_dir()):
            try:
                gpu_fd, mine = _open_shared(path)
            except BaseException:
                for other in gpu_fds + [fd]:
                    os.close(other)
                raise
            try:
                fcntl.flock(gpu_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _holder(path, gpu_fd)
                for other in gpu_fds + [gpu_fd, fd]:
                    os.close(other)
                if not _busy(exc):
                    raise
                stdout.write(json.dumps({"acquired": False, "owner": holder, "device": device, "lock": path}) + "\n")
                stdout.flush()
                return 0
            gpu_fds.append(gpu_fd)
            if mine:
                writable.append(gpu_fd)
            else:
                theirs.append(path)
    previous = _read_owner(owner_path)
    owner["host_pid"] = os.getpid()
    for gpu_fd in writable:
        _write_fd(gpu_fd, json.dumps(owner) + "\n")
    notes = [n for n in (_write_note(path, json.dumps(owner) + "\n") for path in theirs) if n is not None]
    # the one safe write (an exclusive temporary name; a link planted there is never written through)
    state_files.replace_file(owner_path, (json.dumps(owner) + "\n").encode("utf-8"), 0o644)
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
            for gpu_fd in writable:
                _write_fd(gpu_fd, "")
            for note in notes:
                _remove_note(note)
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
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            # issue 39: a full disk was reported as a traceback's last line, and the run's headline guessed at
            # another deployctl; say which filesystem is full and what is left on it (one line, parsed locally)
            sys.stderr.write(disk_full_line(exc, os.path.dirname(args[1]) or ".") + "\n")
            return 1
        # one line naming the path (deployctl quotes it: exit 10 for a refusal or a write failure)
        sys.stderr.write("deployctl-host-lock: %s\n" % exc)
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
