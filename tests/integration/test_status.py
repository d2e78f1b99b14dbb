"""Issue 21: `deployctl status` over the real-sshd sandbox with the stand-in SGLang (SIMULATED GPUs).

The stand-in serves /metrics with SGLang's names when started with --enable-metrics (up adds it)
and lets acceptance decay while it serves when ``~/.sim/accept_factor`` holds a factor: the
tests write it on the host, the server keeps its PID, and `status --check` turns 12 and back.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from deploy.base.errors import ExitCode
from deploy.ssh.transport import HostConnection
from tests.integration.helpers import REPO, cli_json, cli_json_err, nightly_with, wait_until, write_config

pytestmark = pytest.mark.sandbox



def one_host(sandbox, tmp_path, name="sb1"):
    return str(write_config(sandbox, tmp_path, run={"group": None, "hosts": [name]}))


def deployed_pid(capsys, path: str, verb: str = "up", *argv: str) -> int:
    code, doc = cli_json(capsys, "-c", path, verb, "--json", *argv)
    assert code == 0, json.dumps(doc, indent=1)[-3000:]
    [host] = doc["hosts"]
    steps = {s["step"]: s for s in host["steps"]}
    return steps["launch"]["data"]["pid"]


def decay(sandbox, host: str, factor: float | None) -> None:
    sim = sandbox.host(host).sim_dir
    command = f"rm -f {sim}/accept_factor" if factor is None else f"echo {factor} > {sim}/accept_factor"
    assert sandbox.run(host, command).returncode == 0


def test_check_is_healthy_then_12_while_acceptance_decays_then_healthy_again(clean_sandbox, tmp_path, capsys):
    path = one_host(clean_sandbox, tmp_path)
    pid = deployed_pid(capsys, path)

    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--json")
    [host] = doc["hosts"]
    assert code == 0, (err, json.dumps(host, indent=1))
    assert host["verdict"] == "healthy" and host["pid"] == pid and host["configured"] is True
    assert host["live"]["source"] == "metrics" and "sglang:spec_accept_length" in host["live"]["accept_source"]
    assert host["live"]["accept_length"] > 2.0 and host["last_good"]["accept_length"] > 2.0
    assert host["uptime_s"] is not None and host["uptime_s"] >= 0 and host["drafter_fingerprint"]
    assert host["draft_tokens"] == 16 and host["health"] == 200

    decay(clean_sandbox, "sb1", 0.3)  # acceptance decays while the server keeps serving
    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--probe", "--json")
    [host] = doc["hosts"]
    assert code == ExitCode.REGRESSION, (err, json.dumps(host, indent=1))
    assert host["verdict"] == "regression" and host["pid"] == pid
    assert "sb1: regression against the last good deployment" in err and f"pid {pid}" in err
    assert "accept length 1." in err and "vs last good " in err and "minimum 90%" in err
    # the gauge itself fell: without --probe the check sees it too (last decode interval)
    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--json")
    assert code == ExitCode.REGRESSION and doc["hosts"][0]["live"]["accept_length"] < 2.0, err

    decay(clean_sandbox, "sb1", None)
    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--probe", "--json")
    [host] = doc["hosts"]
    assert code == 0, (err, json.dumps(host, indent=1))
    assert host["verdict"] == "healthy" and host["pid"] == pid and host["live"]["accept_length"] > 2.0
    # nothing was restarted or written by any of it
    assert clean_sandbox.run("sb1", f"cat {clean_sandbox.host('sb1').state_dir}/server.pid").stdout.strip() == str(pid)


def test_throughput_is_compared_with_the_last_good_benchmark_under_its_load(clean_sandbox, tmp_path, capsys):
    """The nightly that records the last good benchmark runs 4 rounds (helpers.nightly_with), not the
    shipped 12: status compares its probe with the rounds' median, however many there were."""
    path = one_host(clean_sandbox, tmp_path)
    pid = deployed_pid(capsys, path, "nightly", "--playbook", str(nightly_with(tmp_path, rounds=4)))
    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--probe", "--json")
    [host] = doc["hosts"]
    assert code == 0, (err, json.dumps(host, indent=1))
    assert host["live"]["throughput_comparable"] is True and host["probe"]["concurrency"] == 4
    assert host["probe"]["max_new_tokens"] == 256 and host["last_good"]["output_tok_s"] > 0
    assert any(line.startswith("output tok/s ") for line in host["comparisons"])
    prom = tmp_path / "deployctl.prom"
    decay(clean_sandbox, "sb1", 0.5)
    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--probe", "--json",
                                  "--prom-file", str(prom), "--min-accept-fraction", "0.5")
    [host] = doc["hosts"]
    # accept length ~1 + 0.5 x 1.9 is over half the last good one; output tok/s is not over 90%
    assert code == ExitCode.REGRESSION and host["pid"] == pid, err
    assert [r.split(" ")[0:2] for r in host["regressions"]] == [["output", "tok/s"]], host["regressions"]
    text = prom.read_text()
    assert 'deployctl_status_regression{host="sb1",run="' in text and "} 1\n" in text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".deployctl.prom")] == []  # no temp left


def test_no_server_is_not_serving_and_exit_1_under_check(clean_sandbox, tmp_path, capsys):
    path = one_host(clean_sandbox, tmp_path, "sb2")
    code, doc, err = cli_json_err(capsys, "-c", path, "status", "--check", "--json")
    [host] = doc["hosts"]
    assert code == ExitCode.FAILED and host["verdict"] == "not-serving" and host["alive"] is False
    assert "sb2: not-serving" in err
    code, doc = cli_json(capsys, "-c", path, "status", "--json")
    assert code == 0  # without --check the verb reports; it only fails when a host could not be read


def test_status_is_one_exec_channel_and_writes_nothing(clean_sandbox, tmp_path, capsys, monkeypatch):
    path = one_host(clean_sandbox, tmp_path)
    deployed_pid(capsys, path)
    state = clean_sandbox.host("sb1").state_dir
    # the server's own log grows by its access-log lines (uvicorn logs every GET); nothing else may change
    listing = f"find {state} -path {state}/logs -prune -o -printf '%p %s %T@\\n' | sort"
    before = clean_sandbox.run("sb1", listing).stdout
    assert "server.pid" in before and "deployment.json" in before
    sent = []
    original = HostConnection._exec

    def counted(self, command, *, timeout):
        sent.append(command)
        return original(self, command, timeout=timeout)

    monkeypatch.setattr(HostConnection, "_exec", counted)
    code, _ = cli_json(capsys, "-c", path, "status", "--json")
    assert code == 0 and len(sent) == 1 and "host_ops.py" not in sent[0] and "server_status" not in sent[0]  # inline: no helper file needed
    monkeypatch.undo()
    assert clean_sandbox.run("sb1", listing).stdout == before


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (tests/bootstrap.sh installs it)")
def test_watch_redraws_in_place_on_a_tmux_terminal(clean_sandbox, tmp_path, capsys):
    path = one_host(clean_sandbox, tmp_path)
    pid = deployed_pid(capsys, path)
    session = f"dctl-status-{os.getpid()}"
    socket = str(tmp_path / "tmux.sock")
    # pytest-xdist's workers have COLUMNS=80 and LINES=24 in their environment: the terminal's own
    # size must decide the table's width, as on a user's terminal
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    command = f"{sys.executable} -m deploy -c {path} status --watch 0.5; echo EXIT=$?; sleep 30"
    tmux = ["tmux", "-S", socket]
    subprocess.run(tmux + ["new-session", "-d", "-s", session, "-x", "200", "-y", "20", command],
                   check=True, env=env, cwd=REPO)
    try:
        def pane() -> str:
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", session], capture_output=True,
                                  text=True).stdout

        stamps: set[str] = set()

        def redrawn() -> bool:
            screen = pane()
            lines = [ln for ln in screen.splitlines() if "live / last good, min" in ln]
            if len(lines) == 1:  # one table on the screen: redrawn in place, never scrolled
                stamps.add(lines[0])
            return len(stamps) >= 2 and str(pid) in screen and "healthy" in screen

        wait_until(redrawn, timeout=60, interval=0.2, what="two redraws of the table in place")
        assert pane().count("live / last good, min") == 1
        subprocess.run(tmux + ["send-keys", "-t", session, "C-c"], check=True)
        wait_until(lambda: "EXIT=0" in pane(), timeout=20, what="exit 0 after Ctrl-C")
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def test_watch_without_a_terminal_prints_plain_lines_per_round(clean_sandbox, tmp_path, capsys):
    path = one_host(clean_sandbox, tmp_path)
    deployed_pid(capsys, path)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "deploy", "-c", path, "status", "--watch", "0.5", "--rounds", "2"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env=dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state")))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(" sb1 healthy " in ln and "\x1b" not in ln for ln in lines), lines
    assert time.monotonic() - started < 120
