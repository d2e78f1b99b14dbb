"""HTTP calls made from a fleet host (standard library, Python 3.8+), sent inline with ``python3 -c``.

deployctl talks to the router's management API and to each worker's ``/v1/loads`` from the router
host: that is where the router reaches the workers from, so what works here works for the router.

    fleet_ops.py request METHOD URL [JSON_BODY] [--timeout S]
        one JSON line: {"status": int|null, "body": str, "error": str|null, "error_kind": ...}
    fleet_ops.py router-packages
        {"packages": {"smg": "1.13.0"|null, "sglang-router": "0.3.2"|null}, "python": sys.executable}
        from the package metadata of this interpreter (never imported: each loads a ~100 MB Rust
        extension)
    fleet_ops.py stop-router PIDFILE [--timeout GRACE]
        SIGTERM the router named by PIDFILE (only if its command line says router), SIGKILL after
        GRACE: {"pid", "stopped": bool, "signal": "TERM"|"KILL"|null, "note"}
    fleet_ops.py router-state PIDFILE URL
        {"pid", "alive", "status", "body", "cmdline"} (URL: the router's GET /workers; cmdline: the
        running router's, which names its package)
    fleet_ops.py reach URL [URL ...] [--timeout S]
        {"reach": [{"url", "reachable": bool, "listening": bool, "error": str|null}]}: can this host
        open a TCP connection to each URL's host and port (what the router will need). A refused
        connection still reaches the host (no server there yet is fine before a first deploy); a
        name that does not resolve, a timeout or no route does not.
    fleet_ops.py ports PIDFILE PORT [PORT ...]
        {"router_pid": int|null, "ports": [{"port", "listeners": [{"address", "holders": [{"pid",
        "cmdline", "router": bool}]}], "errors": [...]}]}: every socket in LISTEN on each port
        (listeners.py), its holders, and whether a holder is the router PIDFILE names; which
        listener clashes with which bind address is decided by deployctl (fleet/router_ports.py)
    fleet_ops.py poll SECONDS request GET URL [--timeout S]
    fleet_ops.py poll SECONDS members PIDFILE WORKERS_URL [--timeout S]
    fleet_ops.py poll SECONDS metrics URL [URL ...] [--timeout S]
        one JSON line every SECONDS (0.05-5) until stdin reaches EOF (deployctl decided and shut its
        side of the channel), stdout is closed, or the command's own bound (coreutils timeout) ends it: ``request``'s answer, or
        {"state": {"pid", "alive"} of the router PIDFILE names, "workers": GET WORKERS_URL's answer}. deployctl's waits on
        the router (membership, a worker's drain) decide on each line as it comes: one interpreter
        and one SSH channel per wait, where a command per poll started ~25 of each for one smg drain
        settle (issue 26: 800 such starts were a sixth of the test suite's host CPU).
        ``metrics`` (the canary's window, issue 43; SECONDS 0.5-300): {"at": epoch seconds, "reads":
        {URL: {"status", "error", "lines": [the CANARY_SERIES lines of its /metrics]}}}, every worker read
        at the same instant (one thread each); a worker whose /metrics is not 200 (no --enable-metrics)
        gets "server_info": its GET /server_info answer instead

Sent inline with http_plain.py, listeners.py and state_files.py (deploy/facts/inline.py); run as a file, it imports them
from beside it. A router PID file names the router only when its process is provably the one deployctl
started there: a router's command line, the deploy user's, started before the PID file was written
(``router_pid``); one PID file per router port, ``<state_dir>/router/PORT/router.pid`` (issue 44).
"""

import json
import os
import stat
import re
import signal
import socket
import sys

try:  # imported locally, as deploy.remote.fleet_ops
    from .http_plain import fetch
    from .listeners import listeners, socket_owners
    from .state_files import not_started_by_us
except ImportError:  # sent inline with its modules, or run as a file next to them
    from http_plain import fetch  # type: ignore[no-redef]  # not urllib.request: 29 ms of each call
    from listeners import listeners, socket_owners  # type: ignore[no-redef]
    from state_files import not_started_by_us  # type: ignore[no-redef]

MAX_BODY = 1 << 20
#: the same marks as deploy/fleet/router_package.py ROUTER_CMDLINE_MARKS (a unit test keeps them equal)
ROUTER_CMDLINE_MARKS = ("sglang_router", "sglang::router", "smg.launch_router", "smg::router")


def _kind(exc) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, ConnectionRefusedError):
        return "refused"
    if isinstance(reason, (TimeoutError, socket.timeout)) or "timed out" in str(reason):
        return "timeout"
    return "other"


def request(method: str, url: str, body, timeout: float) -> dict:
    data = None if body is None else json.dumps(body).encode()
    headers = None if data is None else {"Content-Type": "application/json"}
    result: dict = {"status": None, "body": "", "error": None, "error_kind": None}
    try:
        result["status"], _, answer = fetch(method, url, data, headers, timeout, MAX_BODY)
        result["body"] = answer.decode("utf-8", "replace")
    except (OSError, ValueError) as exc:
        result["error"] = str(exc)[:300]
        result["error_kind"] = _kind(exc)
    return result


#: SGLang's router under its two names: Shepherd Model Gateway (smg, 2026-) and sglang-router (-0.3.2)
ROUTER_PACKAGES = ("smg", "sglang-router")


def router_packages() -> dict:
    try:
        from importlib import metadata
    except ImportError:  # Python 3.7
        return {"packages": {}, "python": sys.executable, "error": "python older than 3.8"}
    found = {}  # type: dict
    for name in ROUTER_PACKAGES:
        try:
            found[name] = str(metadata.version(name))[:64]
        except metadata.PackageNotFoundError:
            found[name] = None
    return {"packages": found, "python": sys.executable, "error": None}


def _pid_of(pidfile: str):
    """The PID a router PID file holds: a small regular file holding 2..pid_max, else None."""
    path = os.path.expanduser(pidfile)  # "~/..." arrives quoted, unexpanded
    try:
        # never through a link, and a FIFO never blocks (HOSTILE, issues 22 and 38)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 64).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    if not re.match(r"^[0-9]{1,10}$", text):
        return None
    pid = int(text)
    return pid if 1 < pid <= (1 << 22) and pid != os.getpid() else None  # never init, never ourselves


def _is_router(pid: int) -> bool:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmd = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
        with open("/proc/%d/stat" % pid) as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    # launch_router renames itself with setproctitle: "sglang::router" (sglang-router), "smg::router"
    # (smg); before that the command line names the module. Either package's router is ours: one
    # started before the host switched packages must still be stopped by `down`.
    return state not in ("Z", "X") and any(mark in cmd for mark in ROUTER_CMDLINE_MARKS)


def _not_ours(pid: int, pidfile: str):
    """Why the router process ``pid`` is not provably the one deployctl started and wrote ``pidfile``
    for, or None: another user's (round 4, issue 38: `down` SIGTERMed another user's process whose
    command line named the router), or started after the PID file was written (a PID reused)."""
    try:
        written = os.lstat(os.path.expanduser(pidfile)).st_mtime
    except OSError:
        return "its PID file is gone"
    return not_started_by_us(pid, written, "its PID file")


def _legacy_pidfile(pidfile: str):
    """deployctl before issue 44 kept one ``router/router.pid`` per state dir, whichever router wrote
    it last; now each router has ``router/PORT/router.pid``. The old file still names this port's
    router only when its process listens on PORT (a router started before the upgrade)."""
    directory = os.path.dirname(os.path.expanduser(pidfile))
    port = os.path.basename(directory)
    if not port.isdigit():
        return None, None
    return os.path.join(os.path.dirname(directory), "router.pid"), int(port)


def _listens_on(pid: int, port: int) -> bool:
    found, _ = listeners(port)
    return pid in socket_owners([f["inode"] for f in found])


def router_pid(pidfile: str):
    """(pid, alive, note): the router ``pidfile`` names, ``alive`` only when it provably is the one
    deployctl started there (alive, a router's command line, the deploy user's, started before its
    PID file was written); ``note`` says why a live PID was not taken for it."""
    pid = _pid_of(pidfile)
    if pid is None and not os.path.lexists(os.path.expanduser(pidfile)):
        legacy, port = _legacy_pidfile(pidfile)
        if legacy is not None:
            old = _pid_of(legacy)
            if old is not None and _is_router(old) and _not_ours(old, legacy) is None and _listens_on(old, port):
                return old, True, ""
    if pid is None or not _is_router(pid):
        return pid, False, ""
    why = _not_ours(pid, pidfile)
    if why is not None:
        return pid, False, "PID %d from %s runs a router but %s; not touched" % (pid, pidfile, why)
    return pid, True, ""


def stop_router(pidfile: str, grace: float) -> dict:
    import time

    pid, alive, note = router_pid(pidfile)
    if pid is None or not alive:
        return {"pid": pid, "stopped": False, "signal": None, "note": note or "no router running (PID file %s)" % pidfile}
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _is_router(pid):
            return {"pid": pid, "stopped": True, "signal": "TERM", "note": ""}
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if not _is_router(pid):
            return {"pid": pid, "stopped": True, "signal": "KILL", "note": ""}
        time.sleep(0.05)
    return {"pid": pid, "stopped": False, "signal": "KILL", "note": "still alive after SIGKILL"}


def router_state(pidfile: str, url: str, timeout: float) -> dict:
    pid, alive, note = router_pid(pidfile)
    out = {"pid": pid, "alive": alive, "status": None, "body": "", "cmdline": _cmdline(pid) if alive else "",
           "note": note}
    if alive:
        got = request("GET", url, None, timeout)
        out["status"], out["body"] = got["status"], got["body"][:65536]
    return out


def reach(urls, timeout: float) -> dict:
    try:
        from urllib.parse import urlsplit
    except ImportError:  # pragma: no cover - Python 2
        return {"reach": [], "error": "python too old"}
    out = []
    for url in urls:
        entry = {"url": url, "reachable": False, "listening": False, "error": None}
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
            if not host:
                raise ValueError("no host in the URL")
            socket.create_connection((host, port), timeout=timeout).close()
            entry["reachable"] = entry["listening"] = True
        except ConnectionRefusedError:
            entry["reachable"] = True
        except (OSError, ValueError) as exc:
            entry["error"] = (type(exc).__name__ + ": " + str(exc))[:200]
        out.append(entry)
    return {"reach": out, "error": None}


def _cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read(4096).replace(b"\0", b" ").decode("utf-8", "replace").strip()[:300]
    except OSError:
        return ""


def ports(pidfile: str, wanted) -> dict:
    router, alive, _ = router_pid(pidfile)
    router = router if alive else None
    out = []
    for port in wanted:
        found, errors = listeners(port)
        owners = socket_owners([f["inode"] for f in found])
        entries = []
        for entry in found:
            holders = [{"pid": pid, "cmdline": _cmdline(pid), "router": pid == router}
                       for pid, inodes in sorted(owners.items()) if entry["inode"] in inodes]
            entries.append({"address": entry["address"], "uid": entry.get("uid"), "holders": holders})
        out.append({"port": port, "listeners": entries, "errors": errors})
    return {"router_pid": router, "ports": out, "uid": os.getuid()}


#: a poll line stays well inside deployctl's 1 MiB line bound (deploy/ssh/transport.py), JSON escapes included;
#: a longer answer arrives cut and fails deployctl's strict parse, naming the host
POLL_BODY = 1 << 18


def _cut(answer: dict) -> dict:
    answer["body"] = answer["body"][:POLL_BODY]
    return answer


def members(pidfile: str, workers_url: str, timeout: float) -> dict:
    """The router's process (is it alive?) and its worker list: one GET a round, not router-state's too."""
    pid, alive, _ = router_pid(pidfile)
    return {"state": {"pid": pid, "alive": alive},
            "workers": _cut(request("GET", workers_url, None, timeout))}


def poll(interval: float, once) -> int:
    """Print ``once()`` as a JSON line every ``interval`` seconds until stdin reaches EOF or stdout is
    closed. deployctl shuts its side of the channel when it has decided and waits for this loop to
    exit (deploy/ssh/transport.py _end_watch), so no poller outlives the wait: a stray python3 of the
    deploy user would be one more process for the next stop-stale to find."""
    import select
    import time

    while True:
        started = time.monotonic()
        try:
            sys.stdout.write(json.dumps(once()) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, OSError):  # deployctl closed the channel
            return 0
        readable, _, _ = select.select([0], [], [], max(0.0, interval - (time.monotonic() - started)))
        if readable and not os.read(0, 4096):
            return 0


#: the series the canary reads (SGLang 0.5.23 srt/metrics/collector.py): the accept length gauge (set at each
#: decode log line), the finished requests and generated tokens counters, the per-token latency histogram's
#: sum and count (inter_token_latency_seconds; time_per_output_token_seconds in older releases)
CANARY_SERIES = ("sglang:spec_accept_length", "sglang:num_requests_total", "sglang:generation_tokens_total",
                 "sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count",
                 "sglang:time_per_output_token_seconds_sum", "sglang:time_per_output_token_seconds_count")


def _series_name(line: str) -> str:
    return line.split("{", 1)[0].split(" ", 1)[0]


def worker_metrics(urls, timeout: float) -> dict:
    """Every worker's figures at one instant: one thread per worker, each bounded by ``timeout``."""
    import threading
    import time

    reads = {}

    def one(url: str) -> None:
        got = request("GET", url + "/metrics", None, timeout)
        entry = {"status": got["status"], "error": got["error"]}
        if got["status"] == 200:
            entry["lines"] = [ln for ln in got["body"].splitlines() if _series_name(ln) in CANARY_SERIES][:64]
        else:
            entry["server_info"] = _cut(request("GET", url + "/server_info", None, timeout))
        reads[url] = entry

    at = time.time()
    threads = [threading.Thread(target=one, args=(url,), daemon=True) for url in urls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * timeout + 1)
    for url in urls:
        reads.setdefault(url, {"status": None, "error": "no answer within the read's bound", "lines": []})
    return {"at": at, "reads": reads}


def _poll_interval(text: str):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.05 <= value <= 5 else None


def _metrics_interval(text: str):
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0.5 <= value <= 300 else None


def main(argv) -> int:
    timeout = 10.0
    if "--timeout" in argv:
        i = argv.index("--timeout")
        timeout = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if argv and argv[0] == "request" and len(argv) in (3, 4):
        body = json.loads(argv[3]) if len(argv) == 4 else None
        out = request(argv[1], argv[2], body, timeout)
    elif argv and argv[0] == "router-packages" and len(argv) == 1:
        out = router_packages()
    elif argv and argv[0] == "stop-router" and len(argv) == 2:
        out = stop_router(argv[1], timeout)
    elif argv and argv[0] == "reach" and len(argv) >= 2:
        out = reach(argv[1:], min(timeout, 10.0))
    elif argv and argv[0] == "ports" and len(argv) >= 3 and all(a.isdigit() and 0 < int(a) < 65536 for a in argv[2:]):
        out = ports(argv[1], [int(a) for a in argv[2:]])
    elif argv and argv[0] == "router-state" and len(argv) == 3:
        out = router_state(argv[1], argv[2], timeout)
    elif len(argv) == 5 and argv[0] == "poll" and argv[2] == "request" and argv[3] == "GET" \
            and _poll_interval(argv[1]) is not None:
        return poll(_poll_interval(argv[1]), lambda: _cut(request("GET", argv[4], None, timeout)))
    elif len(argv) == 5 and argv[0] == "poll" and argv[2] == "members" and _poll_interval(argv[1]) is not None:
        return poll(_poll_interval(argv[1]), lambda: members(argv[3], argv[4], timeout))
    elif len(argv) >= 4 and argv[0] == "poll" and argv[2] == "metrics" and _metrics_interval(argv[1]) is not None:
        urls = argv[3:]
        return poll(_metrics_interval(argv[1]), lambda: worker_metrics(urls, min(timeout, 10.0)))
    else:
        sys.stderr.write("usage: fleet_ops.py request METHOD URL [BODY] | router-packages | stop-router PIDFILE | "
                         "router-state PIDFILE URL | reach URL... | ports PIDFILE PORT... | "
                         "poll SECONDS (request GET URL | members PIDFILE WORKERS_URL | metrics URL...)\n")
        return 2
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
