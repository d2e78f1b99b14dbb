#!/usr/bin/env python3
"""The host side's file primitives: bounded reads, bounded JSON, the one safe write.

Standalone, Python 3.8+ standard library only; host_ops.py imports it, and every program deployctl
sends or installs carries it beside host_ops (deploy/facts/helpers.py host_ops_modules): the
installed ``helpers/host_ops.py`` is both, bundled by deploy/facts/inline.py. Every file a host-side
helper reads is a regular file opened non-blocking and read with a size limit; every JSON document
is bounded in depth; every file written goes through replace_file (issue 31).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat as stat_module
import sys

#: deployment.json / last-good.json are a few KB (argv, fingerprints, numbers)
MAX_RECORD_BYTES = 1 << 20


def read_regular(path: str, limit: int):
    """(text, problem): a regular file's text, at most ``limit`` bytes; (None, None) when absent.

    stat first and open O_NONBLOCK: a FIFO planted as a state file must not block the helper (a
    drafter FIFO held doctor/up for 75 s), /dev/zero must not fill memory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, "%s: cannot read: %s" % (path, exc.strerror or exc)
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            return None, "%s is not a regular file (a FIFO, device, socket or directory); ignored" % path
        if st.st_size > limit:
            return None, "%s is %d bytes, over the limit of %d; ignored" % (path, st.st_size, limit)
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            return None, "%s is over the limit of %d bytes; ignored" % (path, limit)
        return data.decode("utf-8", "replace"), None
    except OSError as exc:
        return None, "%s: cannot read: %s" % (path, exc.strerror or exc)
    finally:
        os.close(fd)


def process_start_time(pid: int):
    """When ``pid`` started (seconds since the epoch): /proc/PID/stat starttime (clock ticks since
    boot) plus /proc/stat btime; None when unreadable."""
    raw, _ = read_regular("/proc/%d/stat" % pid, 4096)
    boot, _ = read_regular("/proc/stat", 1 << 20)
    try:
        ticks = int(raw[raw.rfind(")") + 2:].split()[19][:20])
        btime = next(int(line.split()[1][:20]) for line in (boot or "").splitlines() if line.startswith("btime "))
        return btime + ticks / float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, IndexError, TypeError, AttributeError, StopIteration, OSError):
        return None


#: /proc's btime is whole seconds: the start time it gives may read up to a second late
START_SLACK_S = 1.0


def process_uid(pid: int):
    """The real uid of ``pid`` (/proc/PID/status ``Uid:``), None when unreadable."""
    text, _ = read_regular("/proc/%d/status" % pid, 65536)
    for line in (text or "").splitlines():
        if line.startswith("Uid:"):
            try:
                return int(line.split()[1])
            except (ValueError, IndexError):
                return None
    return None


def not_started_by_us(pid: int, written_at, what: str):
    """Why the live process ``pid`` is not provably the one a file of ours was written for (None:
    it is): another user's process, or one that started after ``what`` was written at
    ``written_at`` (a PID reused after a reboot, issue 31). The server's record (host_ops) and a
    router's PID file (fleet_ops, issues 38 and 44) are judged by this one rule."""
    owner = process_uid(pid)
    if owner != os.getuid():
        return "owned by uid %s, not the deploy user (uid %d)" % (owner, os.getuid())
    if written_at is not None:
        started = process_start_time(pid)
        if started is None:
            return "its start time is unreadable"
        if started > written_at + START_SLACK_S:
            return "it started %.0f s after %s was written" % (started - written_at, what)
    return None


def record_time(path: str):
    """deployment.json's mtime: launch writes it after the server started, so the recorded server
    started before it. None when there is no regular record file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime if stat_module.S_ISREG(st.st_mode) else None




#: deploy/base/limits.py MAX_JSON_DEPTH: the deepest JSON document any reader accepts
MAX_JSON_DEPTH = 64


def loads_json(text, max_depth: int = MAX_JSON_DEPTH):
    """``json.loads`` bounded in depth (deploy/base/limits.py parse_json's host-side twin): ValueError for
    a document nested deeper than ``max_depth``, never a RecursionError; walked without recursion."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("nested more than %d levels deep" % max_depth)
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > max_depth:
            raise ValueError("nested more than %d levels deep" % max_depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value


def _kind(mode: int) -> str:
    for test, name in ((stat_module.S_ISLNK, "a symbolic link"), (stat_module.S_ISDIR, "a directory"),
                       (stat_module.S_ISFIFO, "a FIFO"), (stat_module.S_ISSOCK, "a socket"),
                       (stat_module.S_ISCHR, "a character device"), (stat_module.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def replace_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` the one safe way every host-side file deployctl writes is written.

    A temporary name beside it, created O_CREAT|O_EXCL|O_NOFOLLOW (a link planted at the temporary
    name is never written through), fsynced, then renamed over ``path`` only when ``path`` is a
    regular file or absent: a FIFO, device, directory, socket or link there is refused (OSError
    naming it), never replaced (issue 31). A reader sees the old file or the new one.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat_module.S_ISREG(st.st_mode):
        raise OSError(errno.EEXIST, "%s is %s, not a regular file; not replaced" % (path, _kind(st.st_mode)))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(100):
        tmp = "%s.%d.%d.tmp" % (path, os.getpid(), attempt)
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(errno.EEXIST, "%s: no free temporary name beside it" % path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def cmd_write_file(args) -> int:
    """stdin (at most MAX_RECORD_BYTES) -> ``args.path`` via replace_file; silent on success (the
    launch script's only output is the server PID)."""
    data = sys.stdin.buffer.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        sys.stderr.write("host_ops.py write-file: more than %d bytes on stdin; %s not written\n"
                         % (MAX_RECORD_BYTES, args.path))
        return 1
    try:
        replace_file(os.path.expanduser(args.path), data, int(args.mode, 8))
    except OSError as exc:
        sys.stderr.write("host_ops.py write-file: %s\n" % (exc.strerror if exc.filename is None else exc))
        return 1
    return 0


def last_line(path: str, max_bytes: int = 8192) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO as the log must not block the probe
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            return "(%s is not a regular file)" % path
        os.lseek(fd, max(0, st.st_size - max_bytes), os.SEEK_SET)
        tail = os.read(fd, max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
    # progress bars rewrite the line with '\r'
    lines = [ln for ln in re.split(r"[\r\n]+", tail) if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


def server_api_key(record_path: str):
    """(key, problem): the ``--api-key`` the running server was launched with, read from its deployment
    record on this host (its argv; the last one wins, as with argparse). (None, None) without one.

    SGLang (srt/utils/auth.py, 0.5.x) refuses /generate and /server_info with 401 unless the request
    carries ``Authorization: Bearer <--api-key>``; /health and /metrics are always open, so a server
    with a key passed wait-ready and then failed every verify. The key is read here, on the host,
    never sent on a command line or printed: deployctl's commands name the record, not the key.
    ``--admin-api-key`` guards only the admin routes, which neither the check nor bench_serving uses.
    """
    text, problem = read_regular(record_path, MAX_RECORD_BYTES)
    if problem is not None:
        return None, problem
    if text is None:
        return None, None
    try:
        record = loads_json(text)
    except ValueError as exc:
        return None, "%s: not JSON: %s" % (record_path, exc)
    argv = record.get("argv") if isinstance(record, dict) else None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return None, "%s: no argv list of strings" % record_path
    key = None
    for i, arg in enumerate(argv):
        if arg == "--api-key" and i + 1 < len(argv):
            key = argv[i + 1]
        elif arg.startswith("--api-key="):
            key = arg[len("--api-key="):]
    return key, None


def cmd_api_key(args) -> int:
    """``host_ops.py api-key --record PATH``: the key on stdout (nothing without one), for the shell that
    starts bench_serving (``OPENAI_API_KEY="$(...)"``); a record it cannot read: exit 1, why on stderr."""
    found, problem = server_api_key(args.record)
    if problem is not None:
        sys.stderr.write("host_ops api-key: %s\n" % problem)
        return 1
    sys.stdout.write(found or "")
    return 0
