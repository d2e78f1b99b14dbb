#!/usr/bin/env python3
"""Hold the host's deployctl lock for as long as deployctl's SSH channel to this process is open.

Standalone, Python 3.8+ standard library only. deployctl sends this file's source inline
(``python3 -c SOURCE deployctl-host-lock LOCK OWNER_JSON``) so the lock is taken before anything is uploaded or changed.

``flock(LOCK_EX | LOCK_NB)`` on ``LOCK``; then one JSON line on stdout:
``{"acquired": true, "previous": OWNER|null}`` (``previous``: an owner file left by a holder that
is gone, e.g. a deployctl killed with SIGKILL) or ``{"acquired": false, "owner": OWNER|null}``.
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
import json
import os
import sys


def _read_owner(path: str):
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read(65536).decode("utf-8", "replace"))
        return document if isinstance(document, dict) else {"unreadable": str(document)[:200]}
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)[:200]}


def hold(lock_path: str, owner_json: str, stdin=None, stdout=None) -> int:
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout
    owner_path = lock_path + ".owner.json"
    owner = json.loads(owner_json)
    directory = os.path.dirname(lock_path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise
        stdout.write(json.dumps({"acquired": False, "owner": _read_owner(owner_path)}) + "\n")
        stdout.flush()
        return 0
    previous = _read_owner(owner_path)
    owner["host_pid"] = os.getpid()
    tmp = "%s.%d.tmp" % (owner_path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write(json.dumps(owner) + "\n")
    os.replace(tmp, owner_path)
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
        os.close(fd)
    return 0


#: first argument, so host_ops.py stop-processes (scope user: every python3 of the deploy user)
#: recognises this process and never kills the lock of the run that is stopping processes
MARK = "deployctl-host-lock"


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] != MARK:
        sys.stderr.write("usage: host_lock.py %s LOCK_PATH OWNER_JSON\n" % MARK)
        return 2
    return hold(args[1], args[2])


if __name__ == "__main__":
    sys.exit(main())
