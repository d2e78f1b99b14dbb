"""The host-side helper against real local processes (scope pidfile only: scope user would stop
every python3 of this user, pytest included; it is covered on the sandbox hosts)."""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from deploy.remote import host_ops

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
OBEYS_TERM = "import time; time.sleep(120)"


def _ignores_term(pid: int) -> bool:
    """Whether ``pid`` has SIGTERM ignored (/proc/PID/status SigIgn, bit 15 - 1)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return False
    return bool(int(fields["SigIgn"].strip(), 16) & (1 << (signal.SIGTERM - 1)))


def spawn_session(program, *extra):
    """A server-like process group: leader + one child in its session, like SGLang's TP workers."""
    leader = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {program!r}]); {program}",
         "sglang.launch_server", *extra],
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        members = [p for p in host_ops.all_pids() if (host_ops._stat(p) or ("", 0, 0))[2] == leader.pid]
        # a member that has not yet run its signal.signal() still dies of SIGTERM: under load the
        # child was listed before its interpreter got that far, and the test saw TERM, not KILL
        if len(members) >= 2 and (program != IGNORES_TERM or all(_ignores_term(p) for p in members)):
            return leader, members
        time.sleep(0.02)
    leader.kill()
    raise AssertionError("session did not start")


def record_of(tmp_path, pid) -> str:
    """The deployment.json launch writes after starting ``pid``: only a recorded server is signalled."""
    record = tmp_path / "deployment.json"
    record.write_text(json.dumps({"argv": host_ops.cmdline_argv(pid), "pid": pid}))
    return str(record)


def run_helper(*args):
    out = subprocess.run([sys.executable, host_ops.__file__, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_pidfile_scope_stops_the_whole_session_with_sigkill_after_grace(tmp_path):
    leader, members = spawn_session(IGNORES_TERM)
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{leader.pid}\n")
    try:
        doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "0.3",
                         "--record", record_of(tmp_path, leader.pid))
        stopped = {p["pid"]: p for p in doc["processes"]}
        assert set(stopped) == set(members)
        assert all(p["signal"] == "KILL" and p["exited"] for p in stopped.values())
        assert "sglang.launch_server" in stopped[leader.pid]["cmdline"]
        assert not pidfile.exists()
    finally:
        leader.wait(timeout=10)


def test_sigterm_is_enough_for_a_process_that_obeys(tmp_path):
    leader, members = spawn_session(OBEYS_TERM)
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(str(leader.pid))
    doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "20",
                     "--record", record_of(tmp_path, leader.pid))
    assert {p["signal"] for p in doc["processes"]} == {"TERM"}
    assert all(p["exited"] for p in doc["processes"])
    leader.wait(timeout=10)


def test_reused_pid_is_never_killed(tmp_path):
    bystander = subprocess.Popen([sys.executable, "-c", OBEYS_TERM])
    try:
        pidfile = tmp_path / "server.pid"
        pidfile.write_text(str(bystander.pid))
        doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "1")
        assert doc["processes"] == [] and "PID reused" in doc["note"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("content, note", [(None, "no PID file"), ("garbage", "not a PID"), ("999999999", "pid_max")])
def test_pidfile_problems_are_notes_not_kills(tmp_path, content, note):
    pidfile = tmp_path / "server.pid"
    if content is not None:
        pidfile.write_text(content)
    doc = run_helper("stop-processes", "--scope", "pidfile", "--pidfile", str(pidfile), "--grace", "1")
    assert doc["processes"] == [] and note in doc["note"]


def test_own_ancestry_is_protected():
    assert os.getpid() in host_ops.own_ancestry()
    assert os.getppid() in host_ops.own_ancestry()


def test_probe_reports_status_alive_and_last_log_line(tmp_path):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    log = tmp_path / "sglang.log"
    log.write_text("Load weight begin\nLoading safetensors checkpoint shards:  20% Completed\rLoading safetensors checkpoint shards:  40% Completed\r")
    try:
        doc = run_helper("probe", "--url", f"http://127.0.0.1:{server.server_port}/health", "--pid", str(os.getpid()), "--log", str(log))
        assert doc == {"pid": os.getpid(), "alive": True, "status": 503, "error": None, "error_kind": None,
                       "body": "", "last_log_line": "Loading safetensors checkpoint shards:  40% Completed"}
    finally:
        server.shutdown()
    doc = run_helper("probe", "--url", "http://127.0.0.1:9/health", "--pid", "999999999")
    assert doc["alive"] is False and doc["status"] is None and doc["error"] and doc["error_kind"] == "refused"


HELPER = host_ops.__file__


def _watch(*args, timeout=20):
    done = subprocess.run([sys.executable, HELPER, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_watch_health_prints_a_probe_per_change_and_stops_at_its_own_deadline():
    answers = iter([503, 503, 503, 200])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(next(answers, 200))
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        lines = _watch("watch-health", "--url", f"http://127.0.0.1:{server.server_port}/health", "--pid",
                       str(os.getpid()), "--interval", "0.05", "--every", "60", "--for", "1")
    finally:
        server.shutdown()
    # 503 three times is one change, then 200: two lines, not one per poll; ends by itself after --for
    assert [line["status"] for line in lines] == [503, 200]
    assert 1 <= time.monotonic() - started < 10


def test_watch_health_heartbeat_and_a_dead_pid():
    lines = _watch("watch-health", "--url", "http://127.0.0.1:9/health", "--pid", "999999999", "--interval", "0.05",
                   "--every", "0.2", "--for", "0.7")
    assert all(line["alive"] is False and line["error_kind"] == "refused" for line in lines)
    assert 3 <= len(lines) <= 6  # a heartbeat every 0.2 s over 0.7 s, nothing in between


def test_watch_gpus_runs_the_given_queries_and_reports_exit_codes(tmp_path):
    counter = tmp_path / "n"
    counter.write_text("0")
    # a query whose answer changes once: the third sample onwards reads "free"
    query = (f"{sys.executable} -c \"import pathlib; p = pathlib.Path('{counter}'); n = int(p.read_text()) + 1; "
             f"p.write_text(str(n)); print('busy' if n < 3 else 'free')\"")
    lines = _watch("watch-gpus", "--gpu-query", query, "--apps-query", "false", "--interval", "0.05",
                   "--every", "60", "--for", "3")  # three interpreter starts: 0.5 s was too short on a busy machine
    assert [line["gpus"]["stdout"] for line in lines] == ["busy\n", "free\n"]
    assert all(line["apps"]["exit_code"] == 1 for line in lines)
    missing = _watch("watch-gpus", "--gpu-query", "no-such-nvidia-smi", "--apps-query", "true", "--for", "0")
    assert missing[0]["gpus"]["exit_code"] == 127 and "no-such-nvidia-smi" in missing[0]["gpus"]["stderr"]


def test_watch_ends_when_its_reader_goes_away():
    """deployctl closes the channel once it has its answer: the host loop must not run on to --for."""
    proc = subprocess.Popen([sys.executable, HELPER, "watch-health", "--url", "http://127.0.0.1:9/health", "--pid", "1",
                             "--interval", "0.05", "--every", "0.05", "--for", "60"], stdout=subprocess.PIPE)
    try:
        assert json.loads(proc.stdout.readline())["error_kind"] == "refused"
        proc.stdout.close()
        assert proc.wait(10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("verb,args", [
    ("watch-health", ["--url", "http://127.0.0.1:9/health", "--pid", "1"]),
    ("watch-gpus", ["--gpu-query", "true", "--apps-query", "true"]),
])
def test_watch_stops_at_once_when_its_stdin_ends(verb, args):
    """deployctl sends EOF when it has its answer and waits for the loop to exit: with a heartbeat of
    60 s (no write to fail on), only the stdin EOF can end it before --for."""
    proc = subprocess.Popen([sys.executable, HELPER, verb, *args, "--interval", "0.05", "--every", "60", "--for", "60",
                             "--until-stdin-eof"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert json.loads(proc.stdout.readline())  # the first sample is always emitted
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# --- a server launched with --api-key: the accept check and bench_serving authenticate ---------------

def _sglang_auth():
    """The sandbox stand-in's decide_request_auth (SGLang 0.5.21 = 0.5.23's srt/utils/auth.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "sandbox/sim_sglang/sglang/srt/utils/auth.py"
    spec = importlib.util.spec_from_file_location("sim_sglang_auth", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.decide_request_auth


def keyed_server(api_key, admin_api_key=None):
    """A server that answers /generate and /server_info as SGLang does, behind SGLang's own auth rule;
    ``seen``: each request's (path, Authorization header)."""
    decide = _sglang_auth()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _route(self, method):
            path = self.path.split("?", 1)[0]
            header = self.headers.get("Authorization")
            seen.append((path, header))
            if method == "POST":
                self.rfile.read(int(self.headers.get("content-length") or 0))
            if not decide(method=method, path=path, authorization_header=header, api_key=api_key,
                          admin_api_key=admin_api_key):
                body, status = b'{"error": "Unauthorized"}', 401
            elif path == "/generate":
                body, status = json.dumps({"text": "x", "meta_info": {"completion_tokens": 30,
                                                                      "spec_verify_ct": 10}}).encode(), 200
            else:
                body, status = json.dumps({"internal_states": [{"avg_spec_accept_length": 3.0}]}).encode(), 200
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def _record(tmp_path, argv) -> str:
    path = tmp_path / "deployment.json"
    path.write_text(json.dumps({"argv": ["python3", "-m", "sglang.launch_server", *argv], "pid": 1}))
    return str(path)


@pytest.mark.parametrize("argv, key", [
    (["--api-key", "K1"], "K1"),
    (["--api-key=K 2"], "K 2"),                                   # the = form, a space inside
    (["--api-key", "old", "--api-key", "new"], "new"),            # argparse keeps the last
    (["--api-key", "K3", "--admin-api-key", "ADM"], "K3"),        # NORMAL routes take the API key, not the admin's
    (["--admin-api-key", "ADM"], None),                           # admin only: /generate and /server_info are open
    ([], None),
])
def test_the_accept_check_sends_the_servers_own_api_key_read_from_its_record(tmp_path, argv, key):
    admin = next((a for i, a in enumerate(argv) if i and argv[i - 1] == "--admin-api-key"), None)
    server, seen = keyed_server(key, admin)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        doc = run_helper("accept-check", "--base", base, "--requests", "2", "--key-from", _record(tmp_path, argv))
        assert doc["ok"] is True and doc["accept_length"] == 3.0 and doc["server_avg_spec_accept_length"] == 3.0, doc
        assert {h for _, h in seen} == {None if key is None else f"Bearer {key}"}
        assert {p for p, _ in seen} == {"/generate", "/server_info"}
        # without the record (deployctl before the fix): a keyed server refuses /generate
        seen.clear()
        bare = run_helper("accept-check", "--base", base, "--requests", "1")
        assert bare["ok"] is (key is None), bare
        if key is not None:
            assert "401" in bare["error"], bare
        # the benchmark's key, for OPENAI_API_KEY: printed by the helper, nothing without one
        out = subprocess.run([sys.executable, HELPER, "api-key", "--record", _record(tmp_path, argv)],
                             capture_output=True, text=True, timeout=30)
        assert (out.returncode, out.stdout) == (0, key or "")
    finally:
        server.shutdown()


@pytest.mark.parametrize("make, problem", [
    (lambda p: p.write_text("not json"), "not JSON"),
    (lambda p: p.write_text(json.dumps({"argv": "python3 --api-key K"})), "no argv list of strings"),
    (lambda p: p.write_text(json.dumps({"argv": ["--api-key", 7]})), "no argv list of strings"),
    (lambda p: p.write_text(json.dumps([1, 2])), "no argv list of strings"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
])
def test_a_record_the_key_cannot_be_read_from_is_an_error_naming_it_never_a_keyless_request(tmp_path, make, problem):
    path = tmp_path / "deployment.json"
    make(path)
    server, seen = keyed_server("K")
    try:
        doc = run_helper("accept-check", "--base", f"http://127.0.0.1:{server.server_port}", "--requests", "1",
                         "--key-from", str(path))
        assert doc["ok"] is False and "could not be read" in doc["error"] and problem in doc["error"], doc
        assert seen == []  # nothing sent
        out = subprocess.run([sys.executable, HELPER, "api-key", "--record", str(path)], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 1 and out.stdout == "" and problem in out.stderr
    finally:
        server.shutdown()


def test_no_record_yet_means_no_key():
    assert host_ops.server_api_key("/nonexistent/deployment.json") == (None, None)
