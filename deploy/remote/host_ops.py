#!/usr/bin/env python3
"""Host-side operations for deployctl: standalone, Python 3.8+ standard library only.

Uploaded by SFTP to the host's persistent state directory and run as
``python3 host_ops.py <command> ...``; each command prints exactly one JSON document on stdout,
which the orchestrator parses strictly. Importable locally for tests.

Commands:
  stop-processes  SIGTERM, wait up to a grace period, SIGKILL: every python3 process of this user
                  (the hand-run ``killall python3``) or only the server recorded in a PID file.
  probe           Is the server PID alive, what does GET /health answer, what is the last log line.
  server-state    The PID file's server: alive, /health, and the deployment record launch wrote.
  accept-check    Greedy /generate requests; the measured speculative accept length.
  watch-health    Probe every --interval s until --timeout; one probe JSON line per change (and a
                  heartbeat every --every s): wait-ready's poll, on the host, over one channel.
  watch-gpus      Run the given nvidia-smi queries every --interval s until --timeout; one JSON line
                  per change (and a heartbeat): wait-gpus-free's poll, on the host, over one channel.
  write-file      stdin to FILE the safe way (replace_file): deployment.json, last-good.json.

The watch commands print JSON lines and never decide: the orchestrator parses each line strictly
and closes the channel once it has its answer (the next line then ends the loop on a broken pipe).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat as stat_module
import sys
import time

TYPE_CHECKING = False  # typing, subprocess, socket, shlex: imported where used (7 ms of each helper's start)
if TYPE_CHECKING:
    from typing import Any, Dict, List

if __package__:  # imported locally, as deploy.remote.host_ops
    from .state_files import (MAX_JSON_DEPTH, MAX_RECORD_BYTES, cmd_api_key, cmd_write_file, last_line, loads_json,
                              not_started_by_us, read_regular, record_time, replace_file, server_api_key)
else:  # the installed helper and the inline programs carry state_files beside it (deploy/facts/helpers.py)
    from state_files import (MAX_JSON_DEPTH, MAX_RECORD_BYTES, cmd_api_key, cmd_write_file,  # type: ignore[no-redef]
                             last_line, loads_json, not_started_by_us, read_regular, record_time,
                             replace_file, server_api_key)

PYTHON_EXE = re.compile(r"^python3(\.\d+)?$")


def _http():
    """http_plain (not urllib.request: 29 ms of every helper's start), imported by the calls that use it."""
    if __package__:
        from . import http_plain
    else:  # the helper and the inline programs carry it (deploy/facts/helpers.py host_ops_modules)
        import http_plain
    return http_plain


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


def parent_pid(pid: int) -> int | None:
    """The parent's PID, or None when the process is gone or its stat is unreadable."""
    try:
        stat = _stat(pid)
    except (ValueError, IndexError):
        return None
    return stat[1] if stat is not None else None


def real_uid(pid: int) -> int | None:
    try:
        return _uid(pid)
    except (ValueError, IndexError):
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


#: host_lock.py's first argument: the lock of the deployctl run that is stopping processes
HOST_LOCK_MARK = "deployctl-host-lock"


def holds_host_lock(pid: int) -> bool:
    raw = _read("/proc/%d/cmdline" % pid) or ""
    return HOST_LOCK_MARK in raw.split("\0")


def select_user_python(protected: set, exclude=()) -> list:
    uid = os.getuid()
    return sorted(
        pid for pid in all_pids()
        if pid not in protected and _uid(pid) == uid and is_python3(pid) and not holds_host_lock(pid)
        and not any(pattern in cmdline(pid) for pattern in exclude)
    )


#: a PID file holds one decimal PID and a newline; anything longer is not one of ours
MAX_PIDFILE_BYTES = 64
#: the kernel's ceiling for /proc/sys/kernel/pid_max on 64-bit Linux (PID_MAX_LIMIT, 2**22)
PID_MAX_LIMIT = 1 << 22


def pid_max() -> int:
    text, _ = read_regular("/proc/sys/kernel/pid_max", 32)
    try:
        return min(int((text or "").strip()), PID_MAX_LIMIT)
    except ValueError:
        return PID_MAX_LIMIT


def read_pidfile(pidfile: str):
    """(pid, problem): the PID file's PID when it is one a server of ours could have, else (None, why)."""
    text, problem = read_regular(pidfile, MAX_PIDFILE_BYTES)
    if text is None:
        return None, problem or "no PID file at %s: no server launched by deployctl is recorded" % pidfile
    body = text.strip()
    if not re.match(r"^[0-9]{1,10}$", body):
        return None, "PID file %s holds %r, not a PID; ignored" % (pidfile, body[:40])
    pid = int(body)
    if pid <= 1:
        # 0 signals the whole process group, 1 is init: never a server deployctl launched
        return None, "PID file %s holds %d, which is never a server's PID (0: process group, 1: init); ignored" % (
            pidfile, pid)
    if pid > pid_max():
        return None, "PID file %s holds %d, above this kernel's pid_max %d; ignored" % (pidfile, pid, pid_max())
    if pid in own_ancestry():
        return None, "PID file %s holds %d, this helper or one of its parents (sshd, shell); ignored" % (pidfile, pid)
    return pid, None


def cmdline_argv(pid: int) -> list:
    raw, _ = read_regular("/proc/%d/cmdline" % pid, 1 << 20)
    return [part for part in (raw or "").split("\0") if part]


def _recorded_argv(record) -> list | None:
    # a drafter swapped into the running server (deploy/steps/swap_drafter.py) records the argv it
    # now serves as (the new drafter's path) and keeps the process's own as launched_argv
    argv = (record.get("launched_argv") or record.get("argv")) if isinstance(record, dict) else None
    if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
        return argv
    return None


def same_argv(live: list, argv: list) -> bool:
    """Whether the live command line is the recorded argv: the arguments exact, except that a
    recorded ``~/...`` path (launch quotes --model-path and the drafter with quote_path, so the
    shell expanded it) is this user's home; argv[0] may show as the interpreter a venv or pyenv
    shim exec'd."""
    if len(live) != len(argv) or not live:
        return False
    same = all(a == b or (b.startswith("~") and a == os.path.expanduser(b)) for a, b in zip(live[1:], argv[1:]))
    return same and os.path.basename(live[0]).startswith(("python", os.path.basename(argv[0])))


def find_recorded_server(record, uid: int, recorded_at=None) -> int | None:
    """A live process of ``uid`` whose command line is the recorded server's argv (whatever the PID file says)."""
    argv = _recorded_argv(record)
    if argv is None:
        return None
    protected = own_ancestry()
    for pid in all_pids():
        if pid not in protected and alive(pid) and _uid(pid) == uid and same_argv(cmdline_argv(pid), argv) and \
                not_the_recorded_server(pid, recorded_at) is None:
            return pid
    return None


def not_the_recorded_server(pid: int, recorded_at) -> str | None:
    """Why the process ``pid`` (whose command line is the recorded argv) is still not provably the
    server launch recorded, or None (state_files.not_started_by_us: the one rule)."""
    return not_started_by_us(pid, recorded_at, "the deployment record")


def check_server_pid(pidfile: str, record, expect: str = "sglang", recorded_at=None) -> dict:
    """Whether the PID file names the server deployctl launched: the ``pid_check`` of server-state and stop.

    ``verified``: alive, its command line is deployment.json's argv, its owner the deploy user and
    its start time not after the record's (``recorded_at``, the record's mtime); ``unverified``:
    alive, no record to compare with, but its command line has ``expect``; ``not-ours``: alive but
    another program (a PID reused after a reboot, a hand edit, another user's process); ``dead``;
    ``invalid`` (0, 1, negative, huge, not a number, not a regular file); ``none`` (no PID file).
    Only ``verified`` may be signalled: a ``tail -f sglang.log`` or a shell whose argv mentions
    SGLang is ``unverified`` at best (issue 31). ``running`` says what really runs: the PID's
    command line, or a live process whose command line is the recorded argv when the PID file
    does not name it.
    """
    pid, problem = read_pidfile(pidfile)
    result = {"pid": pid, "pid_check": "none", "pid_note": problem, "running": None}
    if pid is None:
        result["pid_check"] = "none" if problem is None or problem.startswith("no PID file") else "invalid"
    elif not alive(pid):
        result.update(pid_check="dead", pid_note="server PID %d from %s is not running" % (pid, pidfile))
    else:
        live = cmdline_argv(pid)
        argv = _recorded_argv(record)
        why = not_the_recorded_server(pid, recorded_at) if argv is not None and same_argv(live, argv) else None
        if argv is not None and same_argv(live, argv) and why is None:
            result["pid_check"] = "verified"
        elif why is not None:
            result.update(pid_check="not-ours", running=" ".join(live)[:300],
                          pid_note="PID %d from %s has the recorded command line but %s; not touched" % (
                              pid, pidfile, why))
        elif argv is None and expect and expect in " ".join(live):
            result.update(pid_check="unverified", pid_note="PID %d runs %s; no deployment record proves it is the "
                          "server deployctl launched; not touched" % (pid, expect))
        else:
            # The PID was reused by an unrelated process (after a reboot) or the file was edited:
            # never signal that one.
            result.update(pid_check="not-ours", running=" ".join(live)[:300],
                          pid_note="PID %d from %s is %r, not the server deployctl launched (PID reused?); not touched" % (
                              pid, pidfile, " ".join(live)[:120]))
    if result["pid_check"] not in ("verified", "unverified"):
        other = find_recorded_server(record, os.getuid(), recorded_at)
        if other is not None:
            result["running"] = "PID %d: %s" % (other, " ".join(cmdline_argv(other))[:300])
            result["pid_note"] = "%s; the server deployctl launched runs as PID %d, which %s does not name" % (
                result["pid_note"] or "no PID", other, pidfile)
            result["pid_check"] = "elsewhere"
    return result


def select_server(pidfile: str, protected: set, expect: str, record_path: str = ""):
    """The server's PID from the PID file plus every process of its session (TP workers).

    Third value: the PID check (check_server_pid); only a verified PID is ever signalled.
    """
    record = _read_json_file(record_path) if record_path else None
    check = check_server_pid(pidfile, record, expect, record_time(record_path) if record_path else None)
    if check["pid_check"] != "verified":
        return [], check["pid_note"], check
    leader = check["pid"]
    members = []
    for pid in all_pids():
        stat = _stat(pid)
        if stat is not None and stat[2] == leader and pid not in protected:
            members.append(pid)
    if leader not in members and leader not in protected:
        members.append(leader)
    return sorted(members), check["pid_note"], check


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
    check = None
    if args.scope == "user":
        pids = select_user_python(protected, args.exclude)
    else:
        pids, note, check = select_server(args.pidfile, protected, args.expect, args.record)
    stopped = stop_processes(pids, args.grace)
    if args.scope == "pidfile" and args.pidfile and all(p["exited"] for p in stopped) and \
            check is not None and check["pid_check"] in ("verified", "dead"):
        try:
            os.unlink(args.pidfile)
        except OSError:
            pass
    document = {"scope": args.scope, "processes": stopped, "note": note, "helper_pid": os.getpid()}
    if check is not None:
        document.update(pid_check=check["pid_check"], running=check["running"])
    return document


def http_status(url: str, timeout: float) -> dict:
    """GET url: {"status", "error", "error_kind", "body"}.

    error_kind tells loading from broken: ``refused`` (nothing listens yet: SGLang binds its port
    only when uvicorn starts, after the weights are loaded) and ``timeout`` are "still loading";
    anything else (no route, reset, DNS) is an error the caller reports at once.
    """
    import socket  # lazily: stop-processes and watch-gpus never use the network
    result = {"status": None, "error": None, "error_kind": None, "body": ""}  # type: Dict[str, Any]
    try:
        result["status"], _, body = _http().fetch("GET", url, timeout=timeout, limit=300)
        result["body"] = body.decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        result["error"] = str(exc)[:200]
        if isinstance(exc, ConnectionRefusedError):
            result["error_kind"] = "refused"
        elif isinstance(exc, (TimeoutError, socket.timeout)) or "timed out" in str(exc):
            result["error_kind"] = "timeout"
        else:
            result["error_kind"] = "other"
    return result


def cmd_probe(args) -> dict:
    result = {"pid": args.pid, "alive": alive(args.pid)}
    result.update(http_status(args.url, args.timeout))
    result["last_log_line"] = last_line(args.log) if args.log else ""
    return result


def _emit(document: dict) -> bool:
    """One JSON line, flushed at once; False when the reader went away (channel closed)."""
    try:
        sys.stdout.write(json.dumps(document) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError):
        # no "Exception ignored" noise when the interpreter flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return False
    return True


def watch(sample, key, interval_s: float, every_s: float, timeout_s: float, until_stdin_eof: bool = False) -> int:
    """Sample every ``interval_s``; emit when ``key(sample)`` changes or ``every_s`` passed; stop at the deadline.

    ``until_stdin_eof``: also stop at once when stdin reaches EOF. deployctl closes its side of the
    channel when it has its answer and waits for this loop to exit, so no poller outlives the step
    (a stray python3 of the deploy user, seen by the next step or the next deployctl).
    """
    deadline = time.monotonic() + timeout_s
    last_key, last_emit = None, 0.0
    while True:
        document = sample()
        now = time.monotonic()
        if key(document) != last_key or now - last_emit >= every_s:
            if not _emit(document):
                return 0
            last_key, last_emit = key(document), now
        if now >= deadline:
            return 0
        wait = min(interval_s, max(0.0, deadline - now))
        if until_stdin_eof:
            readable, _, _ = select.select([0], [], [], wait)
            if readable and not os.read(0, 4096):
                return 0
        else:
            time.sleep(wait)


def cmd_watch_health(args) -> int:
    def sample() -> dict:
        return cmd_probe(args)

    return watch(sample, lambda d: (d["alive"], d["status"], d["error_kind"]), args.interval, args.every, args.timeout_total,
                 args.until_stdin_eof)


#: an nvidia-smi answer is a few KB (a line per GPU and per process); 60 MB took over 90 s to ship
MAX_QUERY_BYTES = 4 << 20


def run_bounded(argv: list, timeout_s: float, limit: int = MAX_QUERY_BYTES, env=None) -> dict:
    """Run ``argv``: {"exit_code", "stdout", "stderr"}; killed past ``timeout_s`` (exit 124) or once it
    prints more than ``limit`` bytes (exit 125, stderr says so), never read whole into memory."""
    import subprocess
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        return {"exit_code": 127, "stdout": "", "stderr": str(exc)[:300]}
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr
    out_fd, err_fd = stdout.fileno(), stderr.fileno()
    data = {out_fd: bytearray(), err_fd: bytearray()}
    open_fds = [out_fd, err_fd]
    deadline = time.monotonic() + timeout_s
    verdict = None
    try:
        while open_fds and verdict is None:
            left = deadline - time.monotonic()
            if left <= 0:
                verdict = (124, "%s did not answer within %g s" % (argv[0], timeout_s))
                break
            readable, _, _ = select.select(open_fds, [], [], min(left, 0.5))
            for fd in readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.remove(fd)
                    continue
                data[fd] += chunk
                if len(data[fd]) > limit:
                    verdict = (125, "%s printed more than %d bytes; stopped (not an answer deployctl reads)"
                               % (argv[0], limit))
    finally:
        if verdict is not None or open_fds:
            proc.kill()
        stdout.close()
        stderr.close()
        code = proc.wait()
    if verdict is not None:
        return {"exit_code": verdict[0], "stdout": "", "stderr": verdict[1]}
    return {"exit_code": code, "stdout": bytes(data[out_fd]).decode("utf-8", "replace"),
            "stderr": bytes(data[err_fd]).decode("utf-8", "replace")[-2000:]}


def _run_query(command: str) -> dict:
    import shlex
    return run_bounded(shlex.split(command), 30.0)


def cmd_watch_gpus(args) -> int:
    def sample() -> dict:
        return {"gpus": _run_query(args.gpu_query), "apps": _run_query(args.apps_query)}

    return watch(sample, lambda d: json.dumps(d, sort_keys=True), args.interval, args.every, args.timeout_total,
                 args.until_stdin_eof)


def _read_json_file(path: str):
    text, problem = read_regular(path, MAX_RECORD_BYTES)
    if text is None:
        return {"unreadable": problem} if problem else None
    try:
        document = loads_json(text)
    except ValueError as exc:
        return {"unreadable": "%s: not JSON (%s): %r" % (path, exc, text[:200])}
    return document if isinstance(document, dict) else {"unreadable": "%s: %r" % (path, text[:200])}


def cmd_server_state(args) -> dict:
    """What is serving now: the PID file's process (checked against the record), the record, /health."""
    record = _read_json_file(args.record)
    check = check_server_pid(args.pidfile, record if isinstance(record, dict) and "unreadable" not in record else None,
                             recorded_at=record_time(args.record))
    pid = check["pid"]
    running = check["pid_check"] in ("verified", "unverified")
    result = {"pid": pid, "alive": running, "cmdline": cmdline(pid)[:300] if running and pid is not None else "",
              "record": record, "pid_check": check["pid_check"], "pid_note": check["pid_note"],
              "running": check["running"]}
    result.update(http_status(args.url, args.timeout) if running else
                  {"status": None, "error": None, "error_kind": None, "body": ""})
    return result


PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences why the sky is blue.",
    "List the first ten prime numbers, separated by commas.",
    "Translate to French: The server is up and the drafter accepts tokens.",
)


def _post_json(url: str, payload: dict, timeout: float, headers=None) -> dict:
    # bounded in bytes and depth: a /generate reply is a few KB; a 4xx/5xx raises HTTPStatusError
    return loads_json(_http().post_json(url, payload, timeout, headers, MAX_RECORD_BYTES + 1).decode("utf-8"))


def cmd_accept(args) -> dict:
    """Greedy generations; accept length = completion tokens / verify steps (SGLang meta_info).

    1.00 means no draft token was ever accepted: the drafter's weights were dropped by the
    loader, or fc was bypassed (single hidden state). Both happened in real deployments.
    """
    prompts = list(PROMPTS)
    if args.prompts_json:
        try:
            given = json.loads(args.prompts_json)
        except ValueError:
            given = None
        if not isinstance(given, list) or not given or not all(isinstance(p, str) for p in given):
            return {"ok": False, "error": "--prompts-json must be a non-empty JSON list of strings", "samples": []}
        prompts = given
    auth = {}  # type: Dict[str, str]
    if args.key_from:
        key, problem = server_api_key(args.key_from)
        if problem is not None:
            return {"ok": False, "error": "the server's --api-key could not be read: %s" % problem, "samples": []}
        if key:
            auth = {"Authorization": "Bearer " + key}

    def one(i):
        # type: (int) -> Dict[str, Any]
        payload = {"text": prompts[i % len(prompts)],
                   "sampling_params": {"max_new_tokens": args.max_new_tokens, "temperature": 0}}
        try:
            reply = _post_json(args.base + "/generate", payload, args.timeout, auth)
        except _http().HTTPStatusError as exc:
            why = " (SGLang answers 401 without the server's --api-key)" if exc.code == 401 else ""
            return {"error": "POST /generate answered %d %s%s" % (exc.code, exc.reason, why)}
        except (OSError, ValueError) as exc:
            return {"error": "POST /generate failed: %s" % (exc,)}
        meta = reply.get("meta_info") if isinstance(reply, dict) else None
        if not isinstance(meta, dict):
            return {"error": "/generate reply has no meta_info: %r" % (str(reply)[:200],)}
        tokens, verify = meta.get("completion_tokens"), meta.get("spec_verify_ct")
        if not isinstance(tokens, int) or not isinstance(verify, int) or verify <= 0:
            return {"error": "meta_info lacks completion_tokens/spec_verify_ct (is speculative decoding on?): %r"
                    % (str(meta)[:200],)}
        return {"completion_tokens": tokens, "spec_verify_ct": verify}

    # Concurrently, at most --concurrency in flight (each request bounded by --timeout): four
    # sequential 256-token generations took four times one on a real server.
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(args.concurrency, args.requests, 64))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(one, range(args.requests)))
    samples = [r for r in results if "error" not in r]  # type: List[Dict[str, Any]]
    failed = [r["error"] for r in results if "error" in r]
    if failed:
        return {"ok": False, "error": failed[0], "samples": samples}
    total_tokens = sum(s["completion_tokens"] for s in samples)
    total_verify = sum(s["spec_verify_ct"] for s in samples)
    server_avg = None
    for path in ("/server_info", "/get_server_info"):
        try:
            status, _, body = _http().fetch("GET", args.base + path, None, auth, args.timeout, MAX_RECORD_BYTES + 1)
            if status != 200:
                continue
            states = loads_json(body.decode("utf-8")).get("internal_states") or [{}]
            server_avg = states[0].get("avg_spec_accept_length")
            break
        except (OSError, ValueError, AttributeError, IndexError):
            continue
    return {"ok": True, "accept_length": total_tokens / total_verify, "completion_tokens": total_tokens,
            "spec_verify_ct": total_verify, "server_avg_spec_accept_length": server_avg, "samples": samples}


def main(argv=None) -> int:
    if __package__:
        from .host_ops_args import USAGE, UsageError, parse_args
    else:  # the helper and the inline programs carry it (deploy/facts/helpers.py host_ops_modules)
        from host_ops_args import USAGE, UsageError, parse_args  # type: ignore[no-redef]
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["-h"], ["--help"]) or "--help" in argv[1:2]:
        sys.stdout.write(USAGE)
        return 0
    try:
        args = parse_args(argv)
    except UsageError as error:
        sys.stderr.write(USAGE + f"host_ops.py: error: {error}\n")
        return 2
    if args.command == "write-file":
        return cmd_write_file(args)
    if args.command == "watch-health":
        return cmd_watch_health(args)
    if args.command == "watch-gpus":
        return cmd_watch_gpus(args)
    if args.command == "api-key":
        return cmd_api_key(args)
    if args.command == "accept-check":
        document = cmd_accept(args)
    elif args.command == "stop-processes":
        document = cmd_stop(args)
    elif args.command == "server-state":
        document = cmd_server_state(args)
    else:
        document = cmd_probe(args)
    sys.stdout.write(json.dumps(document) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
