"""Issue 28 over the real-sshd sandbox: a benchmark harness failure is not the checkpoint's (no rollback,
no quarantine), and a signal during the benchmark stops it at once and says what was left.
SIMULATED GPUs and SGLang (sandbox/)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from deploy.local import history
from deploy.base.errors import ExitCode
from tests.integration.helpers import cli_json, nightly_with
from tests.integration.test_reliability import health, serving_pid
from tests.integration.test_safe_redeploy import config, deployctl, new_checkpoint, read_until, steps_of

pytestmark = pytest.mark.sandbox


def test_a_benchmark_timeout_keeps_the_verified_deployment_and_quarantines_nothing(clean_sandbox, tmp_path, capsys):
    path = config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    new_checkpoint(clean_sandbox)  # a new, good checkpoint; the bench harness times out on it
    # 20,000 prompts take the stand-in many seconds, whatever its `import sglang` costs: past the 1 s
    slow = nightly_with(tmp_path, timeout_s=1, rounds=1, num_prompts=20000)
    code, doc = cli_json(capsys, "-c", str(path), "nightly", "--json", "--playbook", str(slow))
    [host] = doc["hosts"]
    assert code == ExitCode.TIMEOUT, json.dumps(doc, indent=1)
    steps = steps_of(doc)
    assert steps["verify-acceptance"]["status"] == "ok" and steps["benchmark"]["status"] == "failed"
    assert host["failure_cause"] == "benchmark-harness" and "rollback" not in host
    assert "the deployment stays: verified in this run" in host["error"]
    assert not any("quarantined" in w for w in host.get("warnings", []))
    assert host["serving"]["state"] == "serving" and host["serving"]["pid"] == serving_pid(clean_sandbox)
    assert health(clean_sandbox) == "200"
    # the next nightly is not refused (exit 13 before issue 28): it converges and benchmarks
    code, doc = cli_json(capsys, "-c", str(path), "nightly", "--json", "--playbook", str(nightly_with(tmp_path, rounds=4)))
    assert code == 0, json.dumps(doc, indent=1)
    assert steps_of(doc)["quarantine"]["status"] == "skipped"  # converged: the same deployment
    assert [r["serving"] for r in history.read(host="sb1")][-2:] == ["serving", "serving"]


def test_sigterm_during_the_benchmark_stops_it_within_a_second_and_says_what_is_left(clean_sandbox, tmp_path, capsys):
    # each simulated request sleeps its simulated time: a round of bench_serving takes seconds
    path = config(clean_sandbox, tmp_path, SGLANG_SIM_TIME_SCALE="1")
    proc = deployctl("-c", str(path), "nightly", "--playbook", str(nightly_with(tmp_path, rounds=2)))
    try:
        read_until(proc, "[sb1] benchmark: start", timeout=120)
        time.sleep(0.5)  # bench_serving is sending requests now
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert took < 5, f"{took:.1f} s from SIGTERM to exit"  # the remote command's channel closed at once
    pid = serving_pid(clean_sandbox)
    assert f"left running: SGLang pid {pid} (launched by this run, verified in this run)" in err, err
    [row] = history.read(host="sb1")
    assert (row["outcome"], row["exit_code"], row["serving"]) == ("interrupted", 143, "serving")


def test_a_frozen_sshd_during_wait_ready_ends_within_the_connect_timeout_as_exit_4(clean_sandbox, tmp_path):
    """Before issue 28 a stopped sshd took 138 s against a 60 s ready timeout (the wait, then 40 s per read)."""
    path = config(clean_sandbox, tmp_path, SGLANG_SIM_LOAD_SECONDS="300")  # still loading when frozen
    proc = deployctl("-c", str(path), "up")
    sshd = None
    try:
        read_until(proc, "[sb1] wait-ready: start", timeout=120)
        sshd = _sshd_of(clean_sandbox, "[h]ost_ops.py.* watch-health")
        assert clean_sandbox.run("sb1", f"kill -STOP {sshd}").returncode == 0
        frozen_at = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - frozen_at
    finally:
        if proc.poll() is None:
            proc.kill()
        if sshd is not None:
            clean_sandbox.run("sb1", f"kill -CONT {sshd}; kill {sshd}")
    assert proc.returncode == ExitCode.CONNECTION, err
    assert "the host stopped answering" in err, err
    assert took < 25, f"{took:.0f} s from the freeze to the end (connect timeout 10 s)"


def _sshd_of(sandbox, pattern: str) -> int:
    """The sshd process serving deployctl's connection: the parent chain of the process matching pattern."""
    found = sandbox.run("sb1", f"p=$(pgrep -n -u {sandbox.host('sb1').user} -f '{pattern}'); "
                               "while [ -n \"$p\" ] && [ \"$(ps -o comm= -p \"$p\")\" != sshd ]; do "
                               "p=$(ps -o ppid= -p \"$p\" | tr -d ' '); done; echo \"$p\"")
    sshd = int(found.stdout.strip())
    mine = sandbox.run("sb1", "p=$$; while [ \"$(ps -o comm= -p \"$p\")\" != sshd ]; do "
                              "p=$(ps -o ppid= -p \"$p\" | tr -d ' '); done; echo \"$p\"")
    assert int(mine.stdout.strip()) != sshd  # never the session the test itself reaches the host by
    return sshd


def test_a_connection_that_dies_mid_command_is_exit_4_not_5(clean_sandbox, tmp_path):
    """Before issue 28 a host dying during fix-keys was exit 5 ("did not print its JSON summary"): the closed
    channel's missing exit status was read as the command's answer."""
    path = config(clean_sandbox, tmp_path, SGLANG_SIM_TIME_SCALE="1")
    proc = deployctl("-c", str(path), "nightly", "--playbook", str(nightly_with(tmp_path, rounds=2)))
    try:
        read_until(proc, "[sb1] benchmark: start", timeout=120)
        time.sleep(0.5)
        sshd = _sshd_of(clean_sandbox, "[s]glang.bench_serving")
        assert clean_sandbox.run("sb1", f"kill -9 {sshd}").returncode == 0
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == ExitCode.CONNECTION, err
    assert "connection lost while running a command" in err, err
