"""Where deployctl keeps its own local state: history, local locks, nightly logs (XDG).

Every problem with that state (``$XDG_STATE_HOME`` a file or under /proc, the locks folder a file,
a lock file a folder, history a FIFO or /dev/zero, a read-only or full disk) is a
:class:`LocalStateError` naming the path, exit 10, never a traceback or a hang: reads are bounded
in bytes and refuse anything but a regular file, opens are non-blocking (a FIFO never blocks).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from deploy.base.errors import DeployError, ExitCode


class LocalStateError(DeployError):
    """deployctl's own local state (XDG state directory) cannot be read or written."""

    exit_code = ExitCode.IO


def state_home() -> Path:
    """``$XDG_STATE_HOME/deployctl``, by default ``~/.local/state/deployctl`` (XDG Base Directory)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    # The spec says a relative $XDG_STATE_HOME is invalid and must be ignored.
    root = Path(base) if base.startswith("/") else Path.home() / ".local" / "state"
    return root / "deployctl"


#: kernel pseudo-file systems: never a place for state (writes fail or mean something else)
_PSEUDO = ("/proc", "/sys", "/dev")


def check_state_root(path: Path | None = None) -> None:
    """The directory above deployctl's state (``$XDG_STATE_HOME``) is usable for reading and
    writing: a directory, not under /proc, /sys or /dev. LocalStateError naming it otherwise."""
    root = (path or state_home()).parent
    real = os.path.realpath(root)
    if any(real == p or real.startswith(p + "/") for p in _PSEUDO):
        raise LocalStateError(f"{root}: $XDG_STATE_HOME is on a kernel pseudo-file system ({real}); "
                              "point it at a real directory")
    if os.path.lexists(root) and not os.path.isdir(root):
        raise LocalStateError(f"{root}: $XDG_STATE_HOME is not a directory")


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def ensure_directory(path: Path, what: str = "deployctl's state directory") -> Path:
    """``path`` as an existing, writable directory (created 0700), else LocalStateError naming it."""
    check_state_root()
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise LocalStateError(f"{path}: {what} exists but is not a directory; move it away "
                              "(or point $XDG_STATE_HOME elsewhere)") from None
    except OSError as exc:
        raise LocalStateError(f"{path}: cannot create {what}: {_reason(exc)} "
                              "(set $XDG_STATE_HOME to a writable directory)") from None
    if not path.is_dir():
        raise LocalStateError(f"{path}: {what} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise LocalStateError(f"{path}: {what} is not writable (read-only file system or permissions)")
    return path


def require_not_directory(path: Path, what: str) -> None:
    """A lock or record file that is a directory (or another non-regular file) is refused by name."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LocalStateError(f"{path}: {what}: {_reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
        raise LocalStateError(f"{path}: {what} is {kind}; expected a regular file: move it away")


def read_regular(path: Path, limit: int, what: str) -> bytes | None:
    """The bytes of the regular file ``path`` (None when it does not exist), at most ``limit``.

    Opened O_NONBLOCK (a FIFO never blocks the open) and fstat'ed before any read: a FIFO,
    /dev/zero or a directory is refused by name; a file over ``limit`` too.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        require_not_directory(path, what)  # a socket (ENXIO) or directory: say what it is
        raise LocalStateError(f"{path}: cannot read {what}: {_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
            raise LocalStateError(f"{path}: {what} is {kind}; expected a regular file")
        if st.st_size > limit:
            raise LocalStateError(f"{path}: {what} is {st.st_size} bytes, over the limit of {limit} bytes")
        chunks, remaining = [], limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise LocalStateError(f"{path}: {what} grew over the limit of {limit} bytes while read")
        return data
    except OSError as exc:
        raise LocalStateError(f"{path}: cannot read {what}: {_reason(exc)}") from None
    finally:
        os.close(fd)


def write_regular(path: Path, data: bytes, what: str, *, append: bool) -> None:
    """Write (or append) ``data`` to the regular file ``path``, created 0600.

    O_NONBLOCK: opening a FIFO with no reader fails at once (ENXIO) instead of blocking forever;
    O_NOFOLLOW: a symbolic link planted there is never written through (issue 38); no O_TRUNC at
    the open: the file is fstat'ed first and must be a regular file with one name (a hard link to
    another file would be truncated through it) owned by this user, else refused by name before
    any byte; only then is it truncated (``append=False``).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if append else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LocalStateError(f"{path}: {what} is a symbolic link; not written through it: move it away") from None
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            require_not_directory(path, what)
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise LocalStateError(f"{path}: {what} is not a regular file (a FIFO or directory); move it away") from None
        raise LocalStateError(f"{path}: cannot write {what}: {_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LocalStateError(f"{path}: {what} is not a regular file ({_kind(st.st_mode)}); move it away")
        if st.st_nlink != 1:
            raise LocalStateError(f"{path}: {what} is a hard link ({st.st_nlink} names); not written through it: "
                                  "move it away")
        if st.st_uid != os.geteuid():
            raise LocalStateError(f"{path}: {what} belongs to uid {st.st_uid}, not this user ({os.geteuid()}); "
                                  "not written: move it away")
        if not append:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    except OSError as exc:
        raise LocalStateError(f"{path}: cannot write {what}: {_reason(exc)}") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def replace_file(path: Path, data: bytes, what: str, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` the one way deployctl writes a local file (the host side's twin
    is deploy/remote/host_ops.py replace_file): prom file, bench reports, anything it replaces.

    Never written through: the name at ``path`` must be absent or a regular file with one name.
    A symbolic link there (dangling or not), a hard link (a second name of another file), a
    device, FIFO, directory or socket is refused naming the path, exit 10, and left as it was:
    ``status --prom-file`` through a link planted in a collector directory other accounts can
    write replaced root's /etc/passwd (issue 44; issue 31 had followed links on purpose). The
    temporary file is ``mkstemp``'s (O_CREAT|O_EXCL|O_NOFOLLOW) in the same directory, named
    ``.NAME.*.tmp`` (a textfile collector reads only ``*.prom``), fsynced, then renamed over the
    name: rename(2) replaces the directory entry and never follows a link, so a link planted
    between the check and the rename is replaced as a name, never written through; a reader sees
    the old file or the new one. LocalStateError (exit 10).
    """
    import tempfile

    path = Path(path)
    refusal = refuse_planted(path, what)
    if refusal:
        raise LocalStateError(refusal)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise LocalStateError(f"{path}: cannot write {what}: {_reason(exc)}") from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise LocalStateError(f"{path}: cannot write {what}: {_reason(exc)}") from None
        raise


def refuse_planted(path: Path, what: str) -> str | None:
    """Why the name ``path`` must not be written (None: absent, or a regular file with one name).

    ``lstat``, never ``stat``: the name itself is judged, not what a link at it names."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot write {what}: {_reason(exc)}"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return (f"{path}: {what} is a symbolic link (to {target!r}); deployctl never writes through a link: "
                "remove it or name the real path; not replaced")
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: {what} is {_kind(st.st_mode)}, not a regular file; not replaced"
    if st.st_nlink != 1:
        return (f"{path}: {what} is a hard link ({st.st_nlink} names for one file, the others maybe "
                "another account's): remove this name; not replaced")
    return None
