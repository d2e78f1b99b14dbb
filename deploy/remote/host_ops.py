#!/usr/bin/env python3
"""Host-side operations for deployctl: standalone, Python 3.8+ standard library only.

Uploaded by SFTP to the host's persistent state directory and run as
``python3 host_ops.py <command> ...``; each command prints exactly one JSON document on stdout,
which the orchestrator parses strictly. Importable locally for tests.

Commands:
  stop-processes  SIGTERM, wait up to a grace period, SIGKILL: every python3 process of this user
                  (the seeds' ``killall python3``) or only the server recorded in a PID file.
  probe           Is the server PID alive, what does GET /health answer, what is the last log line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request

PYTHON_EXE = re.compile(r"^python3(\.\d+)?$")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return None


def _stat(pid: int):
    """(state, ppid, sid) from /proc/PID/stat, or None when the process is gone."""
    raw = _read("/proc/%d/stat" % pid)
    if raw is None:
        return None
    # comm may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[3])


def _uid(pid: int) -> int | None:
    status = _read("/proc/%d/status" % pid)
    if status is None:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def cmdline(pid: int) -> str:
    raw = _read("/proc/%d/cmdline" % pid) or ""
    return " ".join(part for part in raw.split("\0") if part)


def is_python3(pid: int) -> bool:
    comm = (_read("/proc/%d/comm" % pid) or "").strip()
    if PYTHON_EXE.match(comm):
        return True
    try:
        # SGLang renames its scheduler processes (setproctitle "sglang::scheduler_TP0"), so
        # killall's comm match misses them; the executable still says python3.
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        return False
    return bool(PYTHON_EXE.match(exe))


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def all_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def own_ancestry() -> set:
    """This helper and every process above it (shell, sshd session): never to be killed."""
    pids = set()
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return pids


def select_user_python(protected: set) -> list:
    uid = os.getuid()
    return sorted(
        pid for pid in all_pids() if pid not in protected and _uid(pid) == uid and is_python3(pid)
    )


def select_server(pidfile: str, protected: set, expect: str):
    """The server's PID from the PID file plus every process of its session (TP workers)."""
    text = _read(pidfile)
    if text is None:
        return [], "no PID file at %s: no server launched by deployctl is recorded" % pidfile
    text = text.strip()
    if not text.isdigit():
        return [], "PID file %s holds %r, not a PID; ignored" % (pidfile, text[:40])
    leader = int(text)
    if not alive(leader):
        return [], "server PID %d from %s is not running" % (leader, pidfile)
    if expect and expect not in cmdline(leader):
        # The PID was reused by an unrelated process after a reboot: never kill that one.
        return [], "PID %d is now %r, not the server (PID reused); not touched" % (leader, cmdline(leader)[:120])
    members = []
    for pid in all_pids():
        stat = _stat(pid)
        if stat is not None and stat[2] == leader and pid not in protected:
            members.append(pid)
    if leader not in members and leader not in protected:
        members.append(leader)
    return sorted(members), None


def _signal(pid: int, sig: int) -> str | None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return None
    except PermissionError as exc:
        return str(exc)
    return None


def stop_processes(pids: list, grace_s: float, poll_s: float = 0.05) -> list:
    report = {pid: {"pid": pid, "cmdline": cmdline(pid), "signal": "TERM", "exited": False} for pid in pids}
    for pid in pids:
        err = _signal(pid, signal.SIGTERM)
        if err:
            report[pid]["error"] = err
    deadline = time.monotonic() + grace_s
    waiting = [p for p in pids if alive(p)]
    while waiting and time.monotonic() < deadline:
        time.sleep(poll_s)
        waiting = [p for p in waiting if alive(p)]
    for pid in waiting:
        report[pid]["signal"] = "KILL"
        err = _signal(pid, signal.SIGKILL)
        if err:
            report[pid]["error"] = err
    deadline = time.monotonic() + 5.0
    while waiting and time.monotonic() < deadline:
        time.sleep(poll_s)
        waiting = [p for p in waiting if alive(p)]
    for pid in pids:
        report[pid]["exited"] = pid not in waiting
    return [report[pid] for pid in pids]


def cmd_stop(args) -> dict:
    protected = own_ancestry()
    note = None
    if args.scope == "user":
        pids = select_user_python(protected)
    else:
        pids, note = select_server(args.pidfile, protected, args.expect)
    stopped = stop_processes(pids, args.grace)
    if args.scope == "pidfile" and args.pidfile and all(p["exited"] for p in stopped):
        try:
            os.unlink(args.pidfile)
        except OSError:
            pass
    return {"scope": args.scope, "processes": stopped, "note": note, "helper_pid": os.getpid()}


def last_line(path: str, max_bytes: int = 8192) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    # progress bars rewrite the line with '\r'
    lines = [ln for ln in re.split(r"[\r\n]+", tail) if ln.strip()]
    return lines[-1].strip()[:300] if lines else ""


def cmd_probe(args) -> dict:
    result = {"pid": args.pid, "alive": alive(args.pid), "status": None, "error": None}
    try:
        with urllib.request.urlopen(args.url, timeout=args.timeout) as resp:
            result["status"] = resp.status
    except urllib.error.HTTPError as exc:
        result["status"] = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        result["error"] = str(reason)[:200]
    result["last_log_line"] = last_line(args.log) if args.log else ""
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="host_ops.py")
    sub = parser.add_subparsers(dest="command", required=True)
    stop = sub.add_parser("stop-processes")
    stop.add_argument("--scope", choices=("user", "pidfile"), required=True)
    stop.add_argument("--pidfile", default="")
    stop.add_argument("--expect", default="sglang", help="substring the PID file's process must have")
    stop.add_argument("--grace", type=float, default=30.0)
    probe = sub.add_parser("probe")
    probe.add_argument("--url", required=True)
    probe.add_argument("--pid", type=int, required=True)
    probe.add_argument("--log", default="")
    probe.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.command == "stop-processes":
        if args.scope == "pidfile" and not args.pidfile:
            parser.error("--scope pidfile needs --pidfile")
        document = cmd_stop(args)
    else:
        document = cmd_probe(args)
    sys.stdout.write(json.dumps(document) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
