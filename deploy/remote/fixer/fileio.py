"""Crash-safe file I/O: pread/pwrite loops, chunked copy_file_range, tmp + fsync + rename, and the
fault-injection hooks (DEPLOYCTL_FIX_KILL_AT, DEPLOYCTL_FIX_COPY_CHUNK) the kill tests use."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import signal
import stat
from typing import Callable, Dict, Optional

from .errors import EXIT_IO, FixError

TMP_SUFFIX = ".tmp-fix"
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
DEFAULT_COPY_CHUNK = 8 << 20

_stage_hits: Dict[str, int] = {}


def _stage(name: str) -> None:
    """Fault-injection point: see DEPLOYCTL_FIX_KILL_AT in the package docstring (fixer/__init__.py)."""
    spec = os.environ.get("DEPLOYCTL_FIX_KILL_AT")
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want != name:
        return
    _stage_hits[name] = _stage_hits.get(name, 0) + 1
    if _stage_hits[name] == int(nth or "1"):
        os.kill(os.getpid(), signal.SIGKILL)


def _copy_chunk() -> int:
    value = os.environ.get("DEPLOYCTL_FIX_COPY_CHUNK")
    if value and value.isdigit() and int(value) > 0:
        return int(value)
    return DEFAULT_COPY_CHUNK


def _io_error(action: str, path: str, exc: OSError, tail: str = "") -> FixError:
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM):
        why = "permission denied (read-only file or directory)"
    elif code == errno.EROFS:
        why = "read-only file system"
    elif code == errno.ENOSPC:
        why = "no space left on device"
    elif code == getattr(errno, "EDQUOT", -1):
        why = "disk quota exceeded"
    else:
        why = exc.strerror or str(exc)
    return FixError(EXIT_IO, "cannot %s %s: %s%s" % (action, path, why, tail))


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _close_quiet(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (some filesystems refuse fsync on a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tmp_path(path: str) -> str:
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + TMP_SUFFIX)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _copy_range(src_fd: int, dst_fd: int, src_off: int, length: int, dst_off: int,
                after_chunk: Optional[Callable[[], None]] = None) -> None:
    """Copy ``length`` bytes in bounded chunks; the kernel does it when it can (no user copy)."""
    chunk = _copy_chunk()
    use_cfr = hasattr(os, "copy_file_range")
    while length > 0:
        n = 0
        want = min(chunk, length)
        if use_cfr:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, src_off, dst_off)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                     errno.EBADF, errno.EPERM):
                    raise
                use_cfr = False
                continue
        else:
            data = os.pread(src_fd, want, src_off)
            if data:
                _write_all(dst_fd, data, dst_off)
            n = len(data)
        if n <= 0:
            raise OSError(errno.EIO, "source ended %d bytes early" % length)
        src_off += n
        dst_off += n
        length -= n
        if after_chunk is not None:
            after_chunk()


def _atomic_write(path: str, data: bytes, stage_tmp: str = "", stage_before: str = "",
                  stage_after: str = "") -> None:
    """tmp file in the same directory, fsync, os.replace, fsync the directory."""
    tmp = _tmp_path(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    fd = None
    try:
        # never through what is already there: a link planted at the tmp name would send the
        # bytes out of the checkpoint directory
        _unlink_quiet(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600)
        _write_all(fd, data, 0)
        if stage_tmp:
            _stage(stage_tmp)
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = None
        if stage_before:
            _stage(stage_before)
        os.replace(tmp, path)
    except OSError as exc:
        _close_quiet(fd)
        _unlink_quiet(tmp)
        raise _io_error("write", path, exc, "; %s is unchanged" % os.path.basename(path))
    _fsync_dir(os.path.dirname(path) or ".")
    if stage_after:
        _stage(stage_after)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _page_size() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 4096
