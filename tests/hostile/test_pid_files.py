"""server.pid made hostile: never signal anything but the server deployctl launched.

A PID file holding 1 (init), 0 (the process group), a negative or huge number, digits of another
script, or the PID of a live process whose command line is not deployment.json's argv: nothing is
signalled, the PID file stays, and the report says what really runs (``pid_check``, ``running``;
RELIABILITY's headlines read them from the server-state fact). Real processes, real helper
(deploy/remote/host_ops.py run as the host runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from deploy.facts.host_helper import parse_stop_report
from deploy.facts.server import parse_server_state
from deploy.remote import host_ops

SLEEPER = "import time; time.sleep(120)"


def run_helper(*args):
    out = subprocess.run([sys.executable, host_ops.__file__, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def spawn(*extra):
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "sglang.launch_server", *extra], start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(host_ops.cmdline_argv(proc.pid)) < 3:
        time.sleep(0.01)
    return proc


@pytest.fixture
def server(tmp_path):
    """A stand-in server process plus the deployment.json launch would have written for it."""
    proc = spawn("--port", "30000")
    record = tmp_path / "deployment.json"
    record.write_text(json.dumps({"argv": host_ops.cmdline_argv(proc.pid), "pid": proc.pid}))
    yield proc, record
    proc.kill()
    proc.wait()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


BAD_CONTENTS = {
    "init": "1", "init-newline": "1\n", "zero": "0", "zero-padded-init": "0001", "negative": "-1",
    "negative-big": "-4242", "huge": "99999999999999999999", "above-pid-max": str(host_ops.pid_max() + 1),
    "limit": str(host_ops.PID_MAX_LIMIT + 1), "plus": "+1", "hex": "0x10", "float": "12.0", "exp": "1e3",
    "empty": "", "spaces-inside": "12 34", "two-lines": "1\n2\n", "arabic-digits": "\u0661\u0662",
    "superscript": "\u00b2", "nul": "\x00", "text": "sglang", "json": '{"pid": 1}', "long": "1" * 100,
    "digits-5000": "9" * 5000,  # int() refuses over 4300 digits: status's host program crashed (issue 31)
}


def _sorted_ids(d):
    return sorted(d)


@pytest.mark.parametrize("verb", ["stop", "state"])
@pytest.mark.parametrize("name", _sorted_ids(BAD_CONTENTS))
def test_bad_pidfile_content_never_signals(tmp_path, server, verb, name):
    proc, record = server
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(BAD_CONTENTS[name])
    before = pidfile.read_bytes()
    if verb == "stop":
        doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "0.2",
                         "--record", str(record))
        report = parse_stop_report(json.dumps(doc), "h")
        assert report.processes == []
        assert report.pid_check == "elsewhere"  # the recorded server still runs: said, not hidden
        assert str(proc.pid) in (report.running or "")
    else:
        doc = run_helper("server-state", "--pidfile", str(pidfile), "--record", str(record), "--url",
                         "http://127.0.0.1:9/health", "--timeout", "0.2")
        state = parse_server_state(json.dumps(doc), "h")
        assert not state.alive and state.pid_check == "elsewhere"
        assert "unknown" in state.describe() and str(proc.pid) in state.describe()
    assert proc.poll() is None, "the server was signalled"
    assert pidfile.read_bytes() == before


@pytest.mark.parametrize("name", _sorted_ids(BAD_CONTENTS))
def test_bad_pidfile_without_a_running_server_is_invalid(tmp_path, name):
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(BAD_CONTENTS[name])
    check = host_ops.check_server_pid(str(pidfile), {"argv": ["python3", "-m", "sglang.launch_server", "--x"]})
    assert check["pid_check"] == "invalid" and str(pidfile) in check["pid_note"]


def _fifo(path):
    os.mkfifo(path)


def _dir(path):
    path.mkdir()


def _zero(path):
    path.symlink_to("/dev/zero")


def _big(path):
    with open(path, "wb") as handle:
        handle.truncate(1 << 30)


NOT_REGULAR = {"fifo": _fifo, "directory": _dir, "dev-zero": _zero, "sparse-1g": _big}


@pytest.mark.parametrize("name", sorted(NOT_REGULAR))
@pytest.mark.parametrize("which", ["pidfile", "record"])
def test_state_files_not_regular_never_block(tmp_path, name, which):
    pidfile, record = tmp_path / "server.pid", tmp_path / "deployment.json"
    target = pidfile if which == "pidfile" else record
    NOT_REGULAR[name](target)
    if which == "record":
        pidfile.write_text(f"{_dead_pid()}\n")
    started = time.monotonic()
    doc = run_helper("server-state", "--pidfile", str(pidfile), "--record", str(record), "--url",
                     "http://127.0.0.1:9/health", "--timeout", "0.2")
    assert time.monotonic() - started < 20
    state = parse_server_state(json.dumps(doc), "h")
    assert not state.alive
    if which == "pidfile":
        assert state.pid_check == "invalid" and str(pidfile) in (state.pid_note or "")
    else:
        assert state.record is None and str(record) in doc["record"]["unreadable"]


OTHER_PROGRAMS = {
    "plain-sleeper": [sys.executable, "-c", SLEEPER],
    "sglang-other-port": [sys.executable, "-c", SLEEPER, "sglang.launch_server", "--port", "30001"],
    "sglang-extra-arg": [sys.executable, "-c", SLEEPER, "sglang.launch_server", "--port", "30000", "--x"],
    "sglang-fewer-args": [sys.executable, "-c", SLEEPER, "sglang.launch_server", "--port"],
}


@pytest.mark.parametrize("name", sorted(OTHER_PROGRAMS))
@pytest.mark.parametrize("record_server", [True, False], ids=["server-running", "server-gone"])
def test_live_pid_of_another_program_is_not_touched(tmp_path, name, record_server):
    other = subprocess.Popen(OTHER_PROGRAMS[name], start_new_session=True)
    server = spawn("--port", "30000") if record_server else None
    argv = [sys.executable, "-c", SLEEPER, "sglang.launch_server", "--port", "30000"]
    record = tmp_path / "deployment.json"
    record.write_text(json.dumps({"argv": argv}))
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{other.pid}\n")
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(host_ops.cmdline_argv(other.pid)) < 3:
            time.sleep(0.01)
        doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "0.2",
                         "--record", str(record))
        assert doc["processes"] == [] and other.poll() is None
        if record_server:
            assert doc["pid_check"] == "elsewhere" and f"PID {server.pid}" in doc["running"]
        else:
            assert doc["pid_check"] == "not-ours" and "not the server" in doc["note"]
        assert pidfile.exists()
    finally:
        for p in (other, server):
            if p is not None:
                p.kill()
                p.wait()


def test_the_recorded_server_is_verified_and_stopped(tmp_path, server):
    proc, record = server
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{proc.pid}\n")
    state = host_ops.check_server_pid(str(pidfile), json.loads(record.read_text()))
    assert state["pid_check"] == "verified"
    doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "2",
                     "--record", str(record))
    assert [p["pid"] for p in doc["processes"]] == [proc.pid] and doc["pid_check"] == "verified"
    proc.wait(timeout=10)
    assert not pidfile.exists()


def test_no_record_falls_back_to_unverified(tmp_path, server):
    proc, _ = server
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{proc.pid}\n")
    check = host_ops.check_server_pid(str(pidfile), None)
    assert check["pid_check"] == "unverified"


def test_own_ancestry_is_never_a_server(tmp_path):
    """The helper's own PID in the PID file, and the record naming its own command line.

    Run in a child whose command line no other process has (tmp_path is in it): under pytest-xdist
    the sibling workers share this process's argv, and the check rightly finds one of them as the
    recorded server running "elsewhere"."""
    pidfile = tmp_path / "server.pid"
    program = ("import json, os, sys; from deploy.remote import host_ops; pidfile = sys.argv[1]; "
               "open(pidfile, 'w').write('%d\\n' % os.getpid()); "
               "print(json.dumps(host_ops.check_server_pid(pidfile, {'argv': host_ops.cmdline_argv(os.getpid())})))")
    proc = subprocess.run([sys.executable, "-c", program, str(pidfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    check = json.loads(proc.stdout)
    assert check["pid_check"] == "invalid" and "this helper or one of its parents" in check["pid_note"], check


class _Ctx:
    """Just what stop-stale's run reads."""

    def __init__(self, stdout):
        from deploy.steps import stop_stale

        self.host = type("H", (), {"name": "gpu-a", "python": "python3"})()
        self.settings = stop_stale.Settings(step="stop-stale")
        self.paths = type("P", (), {"root": "/srv/d", "pidfile": "/srv/d/server.pid",
                                    "helper": lambda self, n: "/srv/d/helpers/" + n})()
        self.run = type("R", (), {"timeouts": type("T", (), {"stop_grace_s": 1.0})()})()
        self._stdout = stdout
        self.lines = []

    def timeout(self, s):
        return s

    def execute(self, action):
        return type("Res", (), {"stdout": self._stdout})()

    def progress(self, line):
        self.lines.append(line)


def test_down_fails_while_the_recorded_server_runs_elsewhere():
    from deploy.base.errors import DeployError
    from deploy.steps import stop_stale

    doc = {"scope": "pidfile", "processes": [], "note": "PID file /srv/d/server.pid holds 1 ...",
           "helper_pid": 9, "pid_check": "elsewhere", "running": "PID 4242: python3 -m sglang.launch_server"}
    with pytest.raises(DeployError) as caught:
        stop_stale.run(_Ctx(json.dumps(doc)))
    assert caught.value.exit_code != 0 and "4242" in str(caught.value)


def test_stop_command_names_the_record():
    from deploy.steps import stop_stale

    command = stop_stale.command(_Ctx(""))
    assert "--record /srv/d/deployment.json" in command


@pytest.mark.parametrize("name", _sorted_ids(BAD_CONTENTS))
def test_router_pidfile_bad_content_is_no_router(tmp_path, name):
    from deploy.remote import fleet_ops

    pidfile = tmp_path / "router.pid"
    pidfile.write_text(BAD_CONTENTS[name])
    pid = fleet_ops._pid_of(str(pidfile))
    assert pid is None or (1 < pid <= host_ops.PID_MAX_LIMIT)
    assert pid not in (0, 1)


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_router_pidfile_not_regular(tmp_path, kind):
    from deploy.remote import fleet_ops

    pidfile = tmp_path / "router.pid"
    NOT_REGULAR[kind](pidfile)
    started = time.monotonic()
    assert fleet_ops._pid_of(str(pidfile)) is None
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero"])
def test_probe_log_not_regular_never_blocks(tmp_path, kind):
    log = tmp_path / "latest.log"
    {"fifo": _fifo, "directory": _dir, "dev-zero": _zero}[kind](log)
    started = time.monotonic()
    line = host_ops.last_line(str(log))
    assert time.monotonic() - started < 5
    assert line == "" or "not a regular file" in line


def test_recorded_home_paths_match_the_expanded_command_line(tmp_path):
    """launch records ``--model-path ~/m`` and the shell runs it expanded: still the server."""
    home = os.path.expanduser("~")
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, "sglang.launch_server", "--model-path", f"{home}/m"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(host_ops.cmdline_argv(proc.pid)) < 5:
            time.sleep(0.01)
        pidfile = tmp_path / "server.pid"
        pidfile.write_text(f"{proc.pid}\n")
        recorded = [sys.executable, "-c", SLEEPER, "sglang.launch_server", "--model-path", "~/m"]
        assert host_ops.check_server_pid(str(pidfile), {"argv": recorded})["pid_check"] == "verified"
        other = recorded[:-1] + ["~/other"]
        assert host_ops.check_server_pid(str(pidfile), {"argv": other})["pid_check"] == "not-ours"
    finally:
        proc.kill()
        proc.wait()


# --- round 3 (issue 31): only the process that is provably the recorded server is signalled ----
def _alive(proc) -> bool:
    return proc.poll() is None


def _start(argv, **kwargs):
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            **kwargs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and host_ops.cmdline_argv(proc.pid) != [str(a) for a in argv]:
        time.sleep(0.01)
    return proc


def _lookalikes(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_text("loading\n")
    notes = tmp_path / "sglang_notes.txt"
    notes.write_text("x")
    return {
        # a user following the server's log
        "tail-f-sglang-log": ["tail", "-f", str(log)],
        # a program that merely mentions SGLang in its argv
        "argv-mentions-sglang": [sys.executable, "-c", SLEEPER, "--notes", str(notes), "sglang.launch_server"],
        # a session leader (an interactive shell) whose command line names SGLang
        "session-leader": ["sh", "-c", "sleep 120; : sglang.launch_server"],
    }


@pytest.mark.parametrize("with_record", [False, True])
@pytest.mark.parametrize("kind", ["tail-f-sglang-log", "argv-mentions-sglang", "session-leader"])
def test_a_lookalike_process_is_reported_and_never_signalled(tmp_path, server, kind, with_record):
    proc, record = server
    argv = _lookalikes(tmp_path)[kind]
    other = _start(argv, start_new_session=(kind == "session-leader"))
    try:
        pidfile = tmp_path / "server.pid"
        pidfile.write_text(f"{other.pid}\n")
        args = ["stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "0.3"]
        doc = run_helper(*args, *(["--record", str(record)] if with_record else []))
        assert doc["processes"] == [] and doc["pid_check"] in ("unverified", "not-ours", "elsewhere")
        assert str(other.pid) in doc["note"] and "not touched" in doc["note"]
        assert _alive(other) and _alive(proc) and pidfile.read_text() == f"{other.pid}\n"
    finally:
        other.kill()
        other.wait()


def test_the_recorded_argv_started_after_the_record_is_not_ours(tmp_path, server):
    proc, record = server
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{proc.pid}\n")
    past = time.time() - 3600  # the record predates the process: a PID reused by a same-looking command
    os.utime(record, (past, past))
    doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "0.3",
                     "--record", str(record))
    assert doc["processes"] == [] and doc["pid_check"] == "not-ours" and "after the deployment record" in doc["note"]
    assert _alive(proc)
    state = run_helper("server-state", "--pidfile", str(pidfile), "--record", str(record), "--url",
                       "http://127.0.0.1:9/health", "--timeout", "0.2")
    assert state["pid_check"] == "not-ours" and state["alive"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="starting another user's process needs root")
def test_the_recorded_argv_run_by_another_user_is_not_ours(tmp_path):
    argv = ["/bin/sh", "-c", "sleep 120", "sglang.launch_server", "--port", "30001"]  # nobody can run it
    other = _start(argv, user=65534, start_new_session=True, cwd="/")
    try:
        record = tmp_path / "deployment.json"
        record.write_text(json.dumps({"argv": [str(a) for a in argv], "pid": other.pid}))
        pidfile = tmp_path / "server.pid"
        pidfile.write_text(f"{other.pid}\n")
        doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "0.3",
                         "--record", str(record))
        assert doc["processes"] == [] and doc["pid_check"] == "not-ours" and "uid 65534" in doc["note"]
        assert _alive(other)
    finally:
        other.kill()
        other.wait()


def test_status_reads_a_5000_digit_pid_file_without_crashing(tmp_path):
    from deploy.remote import server_status

    pidfile = tmp_path / "server.pid"
    pidfile.write_text("9" * 5000)
    out = subprocess.run([sys.executable, server_status.__file__, "--pidfile", str(pidfile), "--record",
                          str(tmp_path / "d.json"), "--last-good", str(tmp_path / "l.json"), "--base",
                          "http://127.0.0.1:9"], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(host_ops.__file__)))
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["pid"] is None and document["alive"] is False and len(document["pidfile"]) <= 40
