"""Locks, converge, honest wait-ready, rollback bookkeeping, regression gate, history: no SSH."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deploy.local import history
from deploy.base.errors import ExitCode, LockHeld
from deploy.facts.server import env_hash, parse_record, parse_server_state, same_deployment
from deploy.engine.locks import HOST_LOCK_SOURCE, describe_owner, host_lock_program, local_lock, owner_info, parse_host_lock
from deploy.remote import host_ops
from deploy.host.deployment import DesiredDeployment
from deploy.host.records import ControlMeasurement, LastGood, Metrics
from deploy.steps import regression_gate as _gate
from deploy.facts.host_helper import parse_probe
from deploy.steps.wait_ready import classify
from deploy.base.errors import RemoteOutputError
from deploy.steps.memory import StepMemory


def compare(now: dict, good: dict, *args, control: dict | None = None, **kwargs):
    """The gate's comparison of two records' metrics (and tonight's control), given as the JSON the steps write
    (deploy/host/records.py)."""
    return _gate.compare(Metrics.model_validate(now), Metrics.model_validate(good), *args,
                         control=None if control is None else ControlMeasurement.model_validate(control), **kwargs)


# ---------------------------------------------------------------------------- wait-ready

LOADING = [503]
FAIL_FAST = [s for s in range(100, 600) if s not in (200, 503)]


@pytest.mark.parametrize("status", FAIL_FAST[::7] + [404, 500, 502, 401, 301])
def test_any_status_but_200_and_503_fails_fast(status):
    assert classify({"alive": True, "status": status}) == "unhealthy"


@pytest.mark.parametrize("probe, state", [
    ({"alive": True, "status": 200}, "ready"),
    ({"alive": True, "status": 503}, "loading"),
    ({"alive": True, "status": None, "error_kind": "refused"}, "loading"),
    ({"alive": True, "status": None, "error_kind": "timeout"}, "loading"),
    ({"alive": True, "status": None, "error_kind": "other"}, "unhealthy"),
    ({"alive": False, "status": 200}, "dead"),
    ({"alive": False, "status": None, "error_kind": "refused"}, "dead"),
])
def test_probe_classification(probe, state):
    assert classify(probe) == state


@pytest.mark.parametrize("output", ['{"alive": true, "status": null, "error_kind": "weird"}', "{}", "[]", "ok",
                                    '{"alive": "yes", "status": 200}', '{"alive": true, "status": "200"}',
                                    '{"alive": true, "status": true}'])
def test_probe_output_is_parsed_strictly(output):
    with pytest.raises(RemoteOutputError):
        parse_probe(output, "h")


def _serve(status: int, body: bytes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("status", [404, 500, 200, 503])
def test_http_status_carries_a_body_excerpt(status):
    server = _serve(status, b"x" * 1000 + b"not sglang")
    try:
        result = host_ops.http_status(f"http://127.0.0.1:{server.server_port}/health", 5)
    finally:
        server.shutdown()
    assert result["status"] == status and result["body"] == "x" * 300 and result["error_kind"] is None


# ---------------------------------------------------------------------------- host lock


def _hold(lock: Path, owner: dict):
    proc = subprocess.Popen([sys.executable, "-c", host_lock_program(), "deployctl-host-lock", str(lock),
                             json.dumps(owner)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def test_host_lock_is_exclusive_names_its_owner_and_dies_with_its_channel(tmp_path):
    lock = tmp_path / "state" / "deployctl.lock"
    first, answer = _hold(lock, {"command": "up", "run": "r", "pid": 1})
    assert answer == {"acquired": True, "previous": None}
    second, refused = _hold(lock, {"command": "up", "run": "r", "pid": 2})
    assert refused["acquired"] is False and refused["owner"]["pid"] == 1 and refused["owner"]["host_pid"] == first.pid
    assert second.wait(10) == 0
    first.stdin.write("release\n")  # deployctl's clean release
    first.stdin.close()
    assert first.wait(10) == 0
    assert not Path(str(lock) + ".owner.json").exists()
    third, answer = _hold(lock, {"pid": 3})
    assert answer == {"acquired": True, "previous": None}
    third.stdin.close()  # EOF without release: sshd closing the pipe after deployctl died
    assert third.wait(10) == 0
    fourth, answer = _hold(lock, {"pid": 4})
    assert answer["acquired"] is True and answer["previous"]["pid"] == 3  # taken over, with a warning
    fourth.kill()  # SIGKILL of the helper itself: the kernel still releases the flock
    fourth.wait(10)
    fifth, answer = _hold(lock, {"pid": 5})
    assert answer["acquired"] is True and answer["previous"]["pid"] == 4
    fifth.stdin.write("release\n")
    fifth.stdin.close()
    fifth.wait(10)


@pytest.mark.parametrize("line", ["", "{}", '{"acquired": "yes"}', '{"acquired": true, "previous": 3}', "locked", "[1]"])
def test_host_lock_answer_is_parsed_strictly(line):
    with pytest.raises(RemoteOutputError):
        parse_host_lock(line, "h")


def test_lock_helper_survives_stop_stale_scope_user():
    assert host_ops.HOST_LOCK_MARK == "deployctl-host-lock"
    assert "deployctl-host-lock" in HOST_LOCK_SOURCE.read_text()


def test_local_lock_refuses_a_second_holder_naming_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = tmp_path / "deployctl.yaml"
    config.write_text("")
    owner = owner_info("up", "r")
    code = ("import sys, time; from deploy.engine.locks import local_lock; from pathlib import Path\n"
            f"with local_lock(Path({str(config)!r}), 'r', {{'command': 'nightly', 'run': 'r', 'pid': 77, "
            "'user': 'u', 'hostname': 'box', 'started_at': 'then'}):\n"
            "    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"XDG_STATE_HOME": str(tmp_path / "state")})
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(LockHeld) as exc:
        with local_lock(config, "r", owner):
            pass
    assert exc.value.exit_code == ExitCode.LOCKED and "nightly" in str(exc.value) and "pid 77" in str(exc.value)
    holder.kill()
    holder.wait(10)
    with local_lock(config, "r", owner):  # its holder is gone: free at once
        pass


def test_owner_description_says_who_and_since_when():
    text = describe_owner({"command": "up", "run": "r", "user": "ana", "hostname": "ws1", "pid": 12,
                           "started_at": "2026-11-30T18:00:00+00:00"})
    assert "ana@ws1" in text and "pid 12" in text and "since 2026-11-30T18:00:00" in text and "up" in text


# ---------------------------------------------------------------------------- converge, records


def _record(**over):
    base = {"argv": ["python3", "-m", "sglang.launch_server"], "drafter_fingerprint": "a" * 64,
            "env_hash": env_hash({}), "sglang_version": "0.5.9", "pid": 10, "log": "x.log"}
    return LastGood.model_validate(base | over)


@pytest.mark.parametrize("field, value", [("argv", ["python3"]), ("drafter_fingerprint", "b" * 64),
                                          ("env_hash", env_hash({"A": "1"})), ("sglang_version", "0.5.12")])
def test_converge_names_what_changed(field, value):
    assert DesiredDeployment.of_record(_record()).differences(_record(**{field: value})) == [field.replace("_", " ")]
    assert not same_deployment(_record(), _record(**{field: value}))


def test_same_deployment_ignores_pid_and_log():
    assert DesiredDeployment.of_record(_record()).differences(_record(pid=99, log="y.log")) == []
    assert same_deployment(_record(), _record(pid=99))
    assert DesiredDeployment.of_record(_record()).differences(None) == ["no deployment recorded"]


def test_env_hash_differs_by_value_and_never_contains_it():
    assert env_hash({"HF_TOKEN": "secret1"}) != env_hash({"HF_TOKEN": "secret2"})
    assert "secret1" not in env_hash({"HF_TOKEN": "secret1"})


@pytest.mark.parametrize("output", ["{}", '{"pid": "1", "alive": true, "status": null, "record": null}',
                                    '{"pid": 1, "alive": 1, "status": null, "record": null}',
                                    '{"pid": 1, "alive": true, "status": 200, "record": []}', "nope"])
def test_server_state_is_parsed_strictly(output):
    with pytest.raises(RemoteOutputError):
        parse_server_state(output, "h")


def test_server_state_describes_what_is_left_running():
    state = parse_server_state(json.dumps({"pid": 5, "alive": True, "status": 200, "error": None,
                                           "record": {"argv": ["sglang"], "drafter_path": "/s/d", "log": "/s/l"}}),
                               "h")
    assert "pid 5" in state.describe() and "/s/d" in state.describe()
    dead = parse_server_state(json.dumps({"pid": 5, "alive": False, "status": None, "record": None}), "h")
    assert dead.describe().startswith("nothing")


@pytest.mark.parametrize("text", ["[]", '{"argv": "python3"}', "{", "null"])
def test_records_are_parsed_strictly(text):
    with pytest.raises(RemoteOutputError):
        parse_record(text, "h", "last-good.json")


def test_missing_record_is_none():
    assert parse_record("  \n", "h", "x") is None


# ---------------------------------------------------------------------------- regression gate


@pytest.mark.parametrize("accept, tput, regressed", [
    # one throughput sample each (records from before issue 28): below the floor is inconclusive, never exit 12
    (3.0, 1000.0, 0), (2.71, 1000.0, 0), (2.69, 1000.0, 1), (3.0, 899.0, 0), (1.0, 100.0, 1), (3.5, 2000.0, 0)])
def test_regression_gate_fractions(accept, tput, regressed):
    found = compare({"accept_length": accept, "output_tok_s": tput},
                    {"accept_length": 3.0, "output_tok_s": 1000.0}, 0.9, 0.9)
    assert len(found.regressions) == regressed and len(found.lines) == 2
    assert found.inconclusive == (tput / 1000.0 < 0.9)


NIGHTLY_LOAD = {"num_prompts": 16, "input_len": 512, "output_len": 256, "max_concurrency": 4}
BENCH_LOAD = {"num_prompts": 64, "input_len": 1024, "output_len": 512, "max_concurrency": 8}


@pytest.mark.parametrize("field, value", [(k, v * 2) for k, v in NIGHTLY_LOAD.items()] + [(None, None)])
def test_throughput_compares_only_under_the_same_benchmark_load(field, value):
    """A manual `bench` run (another load) recorded the bar: nightly's lower tok/s is no regression."""
    now = {"accept_length": 3.0, "output_tok_s": 300.0, "bench_settings": NIGHTLY_LOAD}
    other = NIGHTLY_LOAD if field is None else NIGHTLY_LOAD | {field: value}
    found = compare(now, {"accept_length": 3.0, "output_tok_s": 1000.0, "bench_settings": other}, 0.9, 0.9)
    if field is None:
        assert found.regressions == [] and found.inconclusive and "output tok/s median 300.00" in found.lines[1]
    else:
        assert found.throughput is None and "no comparable baseline" in found.lines[1] and f"{field} {value}" in found.lines[1]
    legacy = {"accept_length": 3.0, "output_tok_s": 1000.0}  # recorded before the load was kept
    assert compare(now, legacy, 0.9, 0.9).throughput is None
    assert compare(now | {"bench_settings": BENCH_LOAD}, now, 0.9, 0.9).throughput is None


def test_regression_gate_skips_what_was_not_measured():
    found = compare({"accept_length": 3.0}, {"accept_length": 3.0, "output_tok_s": 10.0}, 0.9, 0.9)
    assert found.regressions == [] and "not compared" in found.lines[1]


# ---------------------------------------------------------------------------- history


def test_history_appends_and_filters(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert history.history_path() == tmp_path / "deployctl" / "history.jsonl"
    history.append([{"run": "r1", "host": "a", "outcome": "ok"}, {"run": "r2", "host": "a", "outcome": "failed"}])
    history.append([{"run": "r1", "host": "b", "outcome": "rolled-back"}])
    assert [r["host"] for r in history.read("r1")] == ["a", "b"]
    assert [r["run"] for r in history.read(host="a")] == ["r1", "r2"]
    with (tmp_path / "deployctl" / "history.jsonl").open("a") as handle:
        handle.write("garbage\n")
    warnings: list[str] = []
    assert len(history.read(warnings=warnings)) == 3  # the corrupt line is skipped, named in a warning
    assert len(warnings) == 1 and "history.jsonl:4" in warnings[0]


def test_relative_xdg_state_home_is_ignored(monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")
    assert str(history.history_path()).startswith(str(Path.home()))


# ---------------------------------------------------------------------------- generated hostile outputs

VALID_STATE = {"pid": 5, "alive": True, "cmdline": "python3 -m sglang.launch_server", "status": 200,
               "error": None, "error_kind": None, "body": "", "record": {"argv": ["x"]}}
REQUIRED_STATE = ("pid", "alive", "status", "record")
WRONG_TYPES = ["1", 1.5, [], {}, True, "null"]


def _mutations(valid: dict, required: tuple[str, ...], allowed: dict[str, tuple]):
    for key in required:
        yield {k: v for k, v in valid.items() if k != key}
        for value in WRONG_TYPES:
            if not isinstance(value, allowed[key]) or (isinstance(value, bool) and bool not in allowed[key]):
                yield valid | {key: value}


STATE_CASES = list(_mutations(VALID_STATE, REQUIRED_STATE, {
    "pid": (int, type(None)), "alive": (bool,), "status": (int, type(None)), "record": (dict, type(None))}))


@pytest.mark.parametrize("document", STATE_CASES, ids=[str(i) for i in range(len(STATE_CASES))])
def test_generated_bad_server_state_is_refused(document):
    with pytest.raises(RemoteOutputError):
        parse_server_state(json.dumps(document), "h")


LOCK_CASES = [{"previous": None}] + [{"acquired": v} for v in WRONG_TYPES if not isinstance(v, bool)] + \
    [{"acquired": True, "previous": v} for v in WRONG_TYPES if not isinstance(v, dict)] + \
    [{"acquired": False, "owner": v} for v in WRONG_TYPES if not isinstance(v, dict)]


@pytest.mark.parametrize("document", LOCK_CASES, ids=[str(i) for i in range(len(LOCK_CASES))])
def test_generated_bad_lock_answers_are_refused(document):
    with pytest.raises(RemoteOutputError):
        parse_host_lock(json.dumps(document), "h")


@pytest.mark.parametrize("cut", range(1, 40, 3))
def test_truncated_outputs_are_refused(cut):
    state = json.dumps(VALID_STATE)[:cut]
    with pytest.raises(RemoteOutputError):
        parse_server_state(state, "h")
    answer = '{"acquired": true, "previous": null}'
    if cut < len(answer):
        with pytest.raises(RemoteOutputError):
            parse_host_lock(answer[:cut], "h")


def test_local_lock_file_name_is_safe_for_any_run_name(tmp_path, monkeypatch):
    from deploy.engine.locks import local_lock_path

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    for run in ("../../etc/passwd", "a/b", "x" * 300, "ünï cødé", "\n"):
        path = local_lock_path(tmp_path / "c.yaml", run)
        assert path.parent == tmp_path / "deployctl" / "locks" and "/" not in path.name and len(path.name) < 80


# ---------------------------------------------------------------------------- orchestrator decisions (no SSH)

from types import SimpleNamespace  # noqa: E402

from deploy.base.errors import BenchmarkHarnessFailed, DeployError, Regression, ServerDied, StepTimeout  # noqa: E402
from deploy.engine.records import RunOptions, StepRecord  # noqa: E402
from deploy.engine.session import run_steps, should_roll_back  # noqa: E402
from deploy.engine.playbook import load_playbook  # noqa: E402
from deploy.steps.base import StepOutcome, StepSettings  # noqa: E402

from tests.fixtures import PLAIN_HOST as HOST, PLAIN_RUN as RUN  # noqa: E402


def fake_step(name: str, calls: list, fail: DeployError | None = None, skips: bool = False):
    def run(ctx):
        calls.append(name)
        if fail is not None:
            raise fail
        return StepOutcome("ok", name)

    module = SimpleNamespace(NAME=name, run=run, CONVERGE_SKIPS=skips)
    return SimpleNamespace(name=name, module=module, settings=StepSettings(step=name))


def test_converged_memory_skips_only_the_steps_that_stop_free_or_launch():
    calls: list = []
    steps = [fake_step("a", calls), fake_step("launch", calls, skips=True), fake_step("verify", calls)]
    records, error, _ = run_steps(steps, HOST, RUN, None, "s", lambda *a: None, StepMemory(converged=True),
                                   threading.Event())
    assert calls == ["a", "verify"] and error is None
    assert [r.status for r in records] == ["ok", "skipped", "ok"]


def test_a_lost_host_lock_stops_before_the_next_step():
    calls: list = []
    held = SimpleNamespace(running=True)
    steps = [fake_step("a", calls), fake_step("b", calls), fake_step("c", calls)]

    def drop_after_a(host, step, message):
        if step == "a" and message.startswith("ok"):
            held.running = False

    records, error, failed_at = run_steps(steps, HOST, RUN, None, "s", drop_after_a, StepMemory(host_lock=held),
                                           threading.Event())
    assert calls == ["a"] and failed_at == 1 and error.exit_code == ExitCode.LOCKED
    assert [r.status for r in records] == ["ok", "failed", "not-run"]


@pytest.mark.parametrize("failing, statuses, error, options, expected", [
    ("wait-ready", None, DeployError("x"), RunOptions(), True),
    ("launch", None, DeployError("x"), RunOptions(), True),
    ("verify-acceptance", None, DeployError("x"), RunOptions(), True),
    ("fix-keys", None, DeployError("x"), RunOptions(), False),       # before stop-stale: the old server still serves
    ("stop-stale", None, DeployError("x"), RunOptions(), False),
    ("wait-ready", None, DeployError("x"), RunOptions(rollback=False), False),
    ("wait-ready", None, LockHeld("x"), RunOptions(), False),
    ("wait-ready", {"stop-stale": "skipped"}, Regression("x"), RunOptions(), True),
    # issue 28: a benchmark harness failure after this run verified its deployment: it stays
    ("benchmark", None, BenchmarkHarnessFailed("bench_serving failed (exit 1)"), RunOptions(), False),
    ("benchmark", None, StepTimeout("bench_serving timed out"), RunOptions(), False),
    ("benchmark", {"verify-acceptance": "disabled"}, BenchmarkHarnessFailed("x"), RunOptions(), True),  # not verified
    ("benchmark", None, ServerDied("crashed on /generate"), RunOptions(), True),  # the checkpoint's
    ("regression-gate", None, Regression("x"), RunOptions(), True),
])
def test_rollback_happens_only_after_stop_stale(failing, statuses, error, options, expected):
    playbook = load_playbook("nightly")
    names = [s.name for s in playbook.steps]
    records = [StepRecord(n, (statuses or {}).get(n, "ok")) for n in names]
    assert should_roll_back(playbook, records, names.index(failing), error, options, threading.Event()) is expected


@pytest.mark.parametrize("failing", ["benchmark", "regression-gate", "record-good", "verify-acceptance"])
@pytest.mark.parametrize("touched", [None, "stop-stale", "free-gpus", "launch"])
def test_rollback_only_after_this_run_stopped_freed_or_launched(failing, touched):
    # converge found the server running as desired: stop-stale, free-gpus, launch skipped (issue 31)
    playbook = load_playbook("nightly")
    names = [s.name for s in playbook.steps]
    records = [StepRecord(n, "skipped" if n in ("stop-stale", "free-gpus", "wait-gpus-free", "launch", "wait-ready")
                          else "ok") for n in names]
    data = {"stop-stale": {"processes": [{"pid": 7}]}, "free-gpus": {"killed": [8]}, "launch": {"pid": 9}}
    if touched is not None:
        records[names.index(touched)] = StepRecord(touched, "ok", data=data[touched])
    expected = touched is not None
    # a failure that is the checkpoint's (the server died, whichever step noticed): a harness failure after
    # this run verified the deployment never rolls back (issue 28, test_rollback_happens_only_after_stop_stale)
    assert should_roll_back(playbook, records, names.index(failing), ServerDied("x"), RunOptions(),
                            threading.Event()) is expected


def test_stop_stale_that_stopped_nothing_is_no_reason_to_roll_back():
    playbook = load_playbook("up")
    names = [s.name for s in playbook.steps]
    records = [StepRecord(n, "ok") for n in names]
    records[names.index("stop-stale")] = StepRecord("stop-stale", "ok", data={"processes": []})
    records[names.index("free-gpus")] = StepRecord("free-gpus", "ok", data={"killed": []})
    records[names.index("launch")] = StepRecord("launch", "not-run")
    assert not should_roll_back(playbook, records, names.index("wait-gpus-free"), DeployError("x"), RunOptions(),
                                threading.Event())


def test_no_rollback_after_ctrl_c():
    playbook = load_playbook("up")
    names = [s.name for s in playbook.steps]
    records = [StepRecord(n, "ok") for n in names]
    cancelled = threading.Event()
    cancelled.set()
    assert not should_roll_back(playbook, records, names.index("wait-ready"), DeployError("x"), RunOptions(), cancelled)


def test_history_verb_plain_lines_and_json(capsys):
    from deploy.cli.main import main

    rows = [{"time": "t1", "verb": "up", "run": "r", "host": "a", "outcome": "ok", "exit_code": 0, "accept_length": 3.0},
            {"time": "t2", "verb": "nightly", "run": "r", "host": "b", "outcome": "rolled-back", "exit_code": 11}]
    history.append(rows)
    assert main(["history", "--host", "b"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("t2 nightly run=r host=b") and "outcome=rolled-back exit=11" in line
    assert main(["history", "--json", "-n", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == rows[-1:]
    history_file = history.history_path()
    history_file.write_text(history_file.read_text() + "{broken\n")
    # a corrupt line is skipped with a warning naming it, never fatal (issue 22)
    assert main(["history"]) == 0
    captured = capsys.readouterr()
    assert f"{history_file}:3: skipped" in captured.err and "Traceback" not in captured.err
    assert len(captured.out.splitlines()) == 2


# ---------------------------------------------------------------------------- wait-ready end to end, fake host

from deploy.base.errors import ServerDied, ServerUnhealthy  # noqa: E402
from deploy.steps import wait_ready  # noqa: E402
from deploy.steps.base import StepContext  # noqa: E402
from deploy.ssh.transport import CommandResult  # noqa: E402


class ScriptedHost:
    """Its host-side watch prints the script's probe documents, one line each, until the step has its
    answer (then the channel is closed); tail answers with a fixed log."""

    host = HOST

    def __init__(self, probes: list[dict]):
        self.probes = probes
        self.commands: list[str] = []

    def run(self, command, *, timeout=None):
        self.commands.append(command)
        if " probe " in command:
            document = {"pid": 7, "error": None, "error_kind": None, "body": "", "last_log_line": ""} | self.probes.pop(0)
            return CommandResult(command, 0, json.dumps(document), "", 0.01)
        return CommandResult(command, 0, "Load weight begin\nCUDA out of memory\n", "", 0.01)

    def check(self, command, *, timeout=None, what=""):
        return self.run(command, timeout=timeout)

    def watch(self, command, on_line, *, timeout, cancelled, silence_s=None):
        from deploy.ssh.transport import WatchResult

        self.commands.append(command)
        assert " watch-health " in command, command
        while self.probes:
            document = {"pid": 7, "error": None, "error_kind": None, "body": "", "last_log_line": ""} | self.probes.pop(0)
            if on_line(json.dumps(document)):
                return WatchResult(command, None, "")
        return WatchResult(command, 0, "")


def wait_ctx(conn):
    return StepContext(host=HOST, run=RUN, settings=wait_ready.Settings(step="wait-ready", interval_s=0.01), conn=conn,
                       launch_stamp="s", memory=StepMemory(pid=7, log="/l/sglang-x.log"))


@pytest.mark.parametrize("status", [404, 500, 401, 302, 204])
def test_wait_ready_fails_fast_with_status_and_body(status):
    conn = ScriptedHost([{"alive": True, "status": None, "error_kind": "refused"}, {"alive": True, "status": 503},
                         {"alive": True, "status": status, "body": "<html>nginx default page</html>"}])
    with pytest.raises(ServerUnhealthy) as exc:
        wait_ready.run(wait_ctx(conn))
    assert f"HTTP {status}" in str(exc.value) and "nginx default page" in str(exc.value)
    assert conn.probes == []  # it did not keep polling


def test_wait_ready_waits_through_refused_and_503_then_ready():
    conn = ScriptedHost([{"alive": True, "status": None, "error_kind": "refused"}] * 3 +
                        [{"alive": True, "status": 503}] * 3 + [{"alive": True, "status": 200}])
    assert wait_ready.run(wait_ctx(conn)).status == "ok"


def test_wait_ready_reports_server_died_with_the_log_tail():
    conn = ScriptedHost([{"alive": True, "status": 503}, {"alive": False, "status": None, "error_kind": "refused"}])
    with pytest.raises(ServerDied) as exc:
        wait_ready.run(wait_ctx(conn))
    assert "server died" in str(exc.value) and "CUDA out of memory" in str(exc.value) and exc.value.exit_code == 1


def test_a_connection_lost_mid_step_is_exit_4_whatever_the_rollback_could_not_do():
    """Issue 39: a connection lost mid-step ended as exit 1 (the rollback over the dead connection failed too)."""
    from deploy.base.errors import ConnectionFailed
    from deploy.config.models import Config
    from deploy.engine.records import HostReport
    from deploy.engine.session import HostSession
    from deploy.facts.server import RunSnapshot, ServerState

    playbook = load_playbook("nightly")
    names = [s.name for s in playbook.steps]
    lost = ConnectionFailed("h: the host stopped answering during wait-ready (no answer for 10 s)")
    records = [StepRecord(n, "ok", data={"processes": [{"pid": 4242}]} if n == "stop-stale" else {})
               for n in names[:names.index("wait-ready")]]
    records.append(StepRecord("wait-ready", "failed", detail=str(lost), exit_code=int(lost.exit_code)))
    assert should_roll_back(playbook, records, names.index("wait-ready"), lost, RunOptions(), threading.Event())

    class DeadConnection:
        def check(self, *a, **k):
            raise ConnectionFailed("h: not connected")

        run = check

        def close(self):
            pass

    config = Config.model_validate({"hosts": [HOST.model_dump()], "runs": [RUN.model_dump()]})
    session = HostSession(config, HOST, RUN, jumps=None, options=RunOptions(), progress=lambda *a: None,
                          cancelled=threading.Event(), stamp="s")
    session.conn = DeadConnection()  # type: ignore[assignment]
    good = LastGood(argv=["sglang"], drafter_path="/s/drafters/good", drafter_fingerprint="cd" * 32)
    session.memory = StepMemory(pid=5151, launched=True, host_lock=SimpleNamespace(running=False),
                                snapshot=RunSnapshot(0.0, "3.11", {}, ServerState(None, False, None, None, None), good))
    session.report = HostReport(HOST, steps=records, error=lost)
    session.roll_back(playbook)  # its first step is refused: the host lock went with the connection
    assert session.report.error.exit_code == ExitCode.CONNECTION, session.report.error
    session.close()
    error = session.report.error
    assert error.exit_code == ExitCode.CONNECTION == 4, error
    text = str(error)
    assert "the connection to h was lost" in text and "no rollback" in text
    # the headline says what this run knows it did, not only "unknown"
    assert "pid 5151" in text and "launched by this run" in text and "connection lost" in text, text
    assert session.report.serving.state == "unverified" and session.report.serving.pid == 5151
