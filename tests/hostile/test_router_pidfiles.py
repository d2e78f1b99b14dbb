"""Round 4 (issues 38 and 44): a router PID file names the router only when it provably is deployctl's.

`down` SIGTERMed another user's process whose command line mentioned the router, and two fleets
whose routers share a router host shared one ``router/router.pid``, whoever wrote it last: team
B's `down` stopped team A's router. Now each router port has its own PID file and a PID is taken
for the router only when its process has a router's command line, is the deploy user's, and
started before its PID file was written. Generated: every router mark, other owners, reused PIDs,
links, and the pre-upgrade ``router/router.pid``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.fleet.router_package import ROUTER_CMDLINE_MARKS
from deploy.host.state_layout import RouterPaths
from deploy.remote import fleet_ops

NOBODY = 65534
#: a stand-in router process: its command line carries a router mark; it listens when asked
LISTENER = ("import signal, socket, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a router dies on SIGTERM, whatever it inherited\n"
            "s = socket.socket()\n"
            "s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True)\n"
            "time.sleep(60)\n")


def _start(mark: str, user: int | None = None) -> tuple[subprocess.Popen, int]:
    """A process whose command line has ``mark``, listening on a port it prints: (process, port)."""
    python = "/usr/bin/python3" if user is not None else sys.executable  # nobody cannot reach /root
    proc = subprocess.Popen([python, "-c", LISTENER, mark], stdout=subprocess.PIPE, text=True,
                            user=user, start_new_session=True, cwd="/")
    port = int(proc.stdout.readline())
    return proc, port


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def _pidfile(root: Path, port: int, pid: int) -> Path:
    path = Path(RouterPaths(str(root), port).pidfile)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid}\n")
    return path


@pytest.mark.parametrize("mark", ROUTER_CMDLINE_MARKS)
def test_another_users_router_is_never_signalled(tmp_path, mark):
    if os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"):
        pytest.skip("starting another user's process needs root and the system python")
    proc, port = _start(mark, user=NOBODY)
    try:
        pidfile = _pidfile(tmp_path, port, proc.pid)
        answer = fleet_ops.stop_router(str(pidfile), 1.0)
        assert answer["stopped"] is False and answer["signal"] is None, answer
        assert "owned by uid 65534" in answer["note"] and "not touched" in answer["note"]
        state = fleet_ops.router_state(str(pidfile), "http://127.0.0.1:1/workers", 1.0)
        assert state["alive"] is False and "owned by uid 65534" in state["note"]
        assert fleet_ops.ports(str(pidfile), [port])["router_pid"] is None
        assert proc.poll() is None  # still running, never signalled
    finally:
        _end(proc)


@pytest.mark.parametrize("mark", ROUTER_CMDLINE_MARKS)
def test_a_router_started_after_its_pid_file_was_written_is_a_reused_pid(tmp_path, mark):
    proc, port = _start(mark)
    try:
        pidfile = _pidfile(tmp_path, port, proc.pid)
        an_hour_ago = time.time() - 3600
        os.utime(pidfile, (an_hour_ago, an_hour_ago))  # written before this process existed
        answer = fleet_ops.stop_router(str(pidfile), 1.0)
        assert answer["stopped"] is False and "after its PID file was written" in answer["note"], answer
        assert proc.poll() is None
    finally:
        _end(proc)


@pytest.mark.parametrize("mark", ROUTER_CMDLINE_MARKS)
def test_our_own_router_is_stopped(tmp_path, mark):
    proc, port = _start(mark)
    try:
        pidfile = _pidfile(tmp_path, port, proc.pid)
        state = fleet_ops.router_state(str(pidfile), "http://127.0.0.1:1/workers", 1.0)
        assert state["alive"] is True and state["note"] == ""
        answer = fleet_ops.stop_router(str(pidfile), 5.0)
        assert answer["stopped"] is True and answer["signal"] == "TERM", answer
        proc.wait(timeout=10)
    finally:
        _end(proc)


def test_a_pid_file_that_is_a_link_is_no_router(tmp_path):
    proc, port = _start("smg::router")
    try:
        real = tmp_path / "elsewhere.pid"
        real.write_text(f"{proc.pid}\n")
        pidfile = Path(RouterPaths(str(tmp_path), port).pidfile)
        pidfile.parent.mkdir(parents=True)
        pidfile.symlink_to(real)
        assert fleet_ops.stop_router(str(pidfile), 1.0)["stopped"] is False
        assert proc.poll() is None
    finally:
        _end(proc)


def test_two_routers_on_one_host_keep_their_own_pid_files(tmp_path):
    """Team A's and team B's routers on one router host, one state dir, two ports: B's stop is B's."""
    team_a, port_a = _start("smg::router")
    team_b, port_b = _start("sglang::router")
    try:
        a = _pidfile(tmp_path, port_a, team_a.pid)
        b = _pidfile(tmp_path, port_b, team_b.pid)
        assert a != b and a.parent.name == str(port_a) and b.parent.name == str(port_b)
        assert fleet_ops.stop_router(str(b), 5.0)["stopped"] is True
        team_b.wait(timeout=10)
        assert team_a.poll() is None
        assert fleet_ops.router_state(str(a), "http://127.0.0.1:1/workers", 1.0)["alive"] is True
    finally:
        _end(team_a)
        _end(team_b)


@pytest.mark.parametrize("listens", [True, False])
def test_a_router_started_before_the_upgrade_is_found_by_its_port(tmp_path, listens):
    """The old ``router/router.pid`` (one per state dir) still names this port's router, but only
    when its process listens on the port: another port's router is never taken for this one's."""
    proc, port = _start("smg::router")
    try:
        legacy = tmp_path / "router" / "router.pid"
        legacy.parent.mkdir(parents=True)
        legacy.write_text(f"{proc.pid}\n")
        other = port + 1 if port < 65535 else port - 1
        pidfile = RouterPaths(str(tmp_path), port if listens else other).pidfile
        pid, alive, _ = fleet_ops.router_pid(pidfile)
        assert alive is listens and (pid == proc.pid) is listens
        assert fleet_ops.stop_router(pidfile, 5.0)["stopped"] is listens
        if listens:
            proc.wait(timeout=10)
        else:
            assert proc.poll() is None
    finally:
        _end(proc)


def test_the_inline_program_carries_the_checks(tmp_path):
    """fleet_ops travels inline with listeners.py and state_files.py: the checks run there too."""
    from deploy.fleet.router import fleet_ops_program

    proc, port = _start("smg::router")
    try:
        pidfile = _pidfile(tmp_path, port, proc.pid)
        an_hour_ago = time.time() - 3600
        os.utime(pidfile, (an_hour_ago, an_hour_ago))
        out = subprocess.run([sys.executable, "-I", "-S", "-c", fleet_ops_program(), "stop-router", str(pidfile),
                              "--timeout", "1"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert '"stopped": false' in out.stdout and "after its PID file was written" in out.stdout
        assert proc.poll() is None
    finally:
        _end(proc)
