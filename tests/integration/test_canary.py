"""Issue 43 over the real-sshd sandbox: a canary judged on live traffic behind SGLang's real router
(smg and sglang-router), three SIMULATED replicas, steady client traffic from a live prompt mix the
built-in prompts do not have (instructions: sandbox/sim_sglang/.../prompt_kinds.py).

One fleet `up` per router package, then: a drafter better on the built-in prompts (it passes verify)
and worse on the live mix is rolled back after its window, quarantined, the other replicas never
touched, no failed request; a signal mid-window leaves the canary on its last good drafter; then a
better drafter is promoted and every replica ends on it."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.fleet_client import StreamingClient
from deploy.base.errors import ExitCode
from tests.integration.helpers import FAST, REPO, cli_json_err, default_signals, write_config
from tests.integration.test_fleet import (HOSTS, ROUTER_PORT, ROUTER_PYTHONS, new_checkpoint, router_workers,
                                          server_pid, summary, worker_url)

pytestmark = pytest.mark.sandbox

LIVE_MIX = ("Translate to German: the meeting moves to Thursday.", "Rewrite this email so it sounds friendlier.",
            "Draft a polite reply declining the invitation.", "Give three names for a bakery.")
CANARY = {"replicas": 1, "window": "40s", "interval": 0.5, "min_requests": 40}


@pytest.fixture(autouse=True)
def _router_installed():
    for python in ROUTER_PYTHONS.values():
        if not python.is_file():
            pytest.skip(f"{python} missing: run tests/bootstrap.sh (installs smg 1.13.0 and sglang-router 0.3.2)")


@pytest.fixture(params=sorted(ROUTER_PYTHONS))
def router_package(request) -> str:
    return request.param


def kinds_marker(sandbox, host: str, kinds: dict | None) -> None:
    """The drafter's SIMULATION-prompt-kinds marker (None: removed), written before new_checkpoint."""
    drafter = sandbox.host(host).drafter_dir
    command = (f"printf '%s' '{json.dumps(kinds)}' > {drafter}/SIMULATION-prompt-kinds" if kinds is not None
               else f"rm -f {drafter}/SIMULATION-prompt-kinds")
    assert sandbox.run(host, command).returncode == 0


def verified(doc: dict, host: str) -> float:
    """The accept length verify-acceptance measured on ``host`` in this run (the redeploy's, not the rollback's)."""
    [entry] = [h for h in doc["hosts"] if h["host"] == host]
    return {s["step"]: s for s in entry["steps"]}["verify-acceptance"]["data"]["accept_length"]


def fingerprint(sandbox, host: str) -> str:
    """The drafter fingerprint of the deployment the host serves (deployment.json)."""
    return json.loads(sandbox.run(host, "cat ~/.deployctl/deployment.json").stdout)["drafter_fingerprint"]


def interrupted_in_window(path, during) -> str:
    """``restart`` in a child, SIGINT a few seconds into its canary window (``during()`` called first); its
    stderr."""
    import queue
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "deploy", "-c", str(path), "restart"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=default_signals)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    seen = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=5)
            except queue.Empty:
                continue
            seen.append(line)
            if "canary window sb1" in line and "start" in line:
                break
        else:
            raise AssertionError("the canary window never started:\n" + "".join(seen[-20:]))
        during()
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == ExitCode.INTERRUPTED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    return "".join(seen) + "".join(lines.get_nowait() for _ in range(lines.qsize()))


def test_a_canary_worse_on_live_traffic_is_rolled_back_and_a_better_one_promoted(clean_sandbox, tmp_path, capsys,
                                                                                  router_package):
    sb = clean_sandbox
    router = {"host": "sb1", "port": ROUTER_PORT, "policy": "round_robin",
              "python": str(ROUTER_PYTHONS[router_package]), "startup_timeout_s": 60, "drain_timeout_s": 30}
    path = write_config(sb, tmp_path, run={"env": FAST, "router": router, "rollout": {"canary": CANARY}})
    code, doc, err = cli_json_err(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    verified_before = verified(doc, "sb1")
    code, doc, err = cli_json_err(capsys, "-c", str(path), "plan", "restart", "--json")
    assert code == 0
    phases = [p["phase"] for p in doc["fleet"]["phases"]]
    assert phases[1] == "canary: last good of sb1" and any(p.startswith("canary window sb1") for p in phases), phases

    # better on the built-in prompts (and on verify's four), half the extra tokens on the live mix of instructions
    old = {h: server_pid(sb, h) for h in HOSTS}
    for host in HOSTS:
        kinds_marker(sb, host, {"instruct": 0.5, "*": 1.25})
        new_checkpoint(sb, host)
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=64,
                         prompts=LIVE_MIX, pause_s=0.02) as client:
        time.sleep(1.0)
        code, doc, err = cli_json_err(capsys, "-c", str(path), "restart", "--json")
        time.sleep(0.5)
    assert code == 12, summary(doc) + err[-3000:]
    assert client.stats.failed == 0, client.stats.errors[:5]
    canary = doc["fleet"]["canary"]
    assert canary["outcome"] == "roll-back" and canary["decision"]["cause"] == "canary: live acceptance", canary
    assert canary["decision"]["comparisons"][0]["ratio"] < 0.9, canary
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert "rolled back" in hosts["sb1"]["error"], hosts["sb1"]
    assert verified(doc, "sb1") > verified_before, (verified(doc, "sb1"), verified_before)  # verify passed, higher
    assert server_pid(sb, "sb1") != old["sb1"]  # relaunched on its last good drafter, verified
    assert {h: server_pid(sb, h) for h in ("sb2", "sb3")} == {h: old[h] for h in ("sb2", "sb3")}  # never touched
    quarantine = json.loads(sb.run("sb1", "cat ~/.deployctl/quarantine.json").stdout)
    reasons = [e["reason"] for e in (quarantine.get("entries") or quarantine).values() if isinstance(e, dict)]
    assert any(r.startswith("canary: live acceptance") for r in reasons), quarantine
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)
    assert fingerprint(sb, "sb1") == fingerprint(sb, "sb2")  # back on the drafter the others kept

    # a signal mid-window: the canary goes back to its last good drafter (verified) and says so
    serving = fingerprint(sb, "sb1")
    for host in HOSTS:
        kinds_marker(sb, host, {"*": 1.15})
        new_checkpoint(sb, host)
    before = {h: server_pid(sb, h) for h in HOSTS}
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=64,
                         prompts=LIVE_MIX, pause_s=0.02) as client:
        def status_marks_the_canary() -> None:
            # the window's start line comes before the mark is written: read until it is (bounded)
            deadline = time.monotonic() + 30
            while True:
                code, doc, _ = cli_json_err(capsys, "-c", str(path), "status", "--json")
                marks = {h["host"]: h.get("canary") for h in doc["hosts"]}
                if marks["sb1"] is not None or time.monotonic() > deadline:
                    break
            assert marks["sb1"] is not None and marks["sb1"]["others"] == ["sb2", "sb3"], (marks, doc["hosts"][0])
            assert marks["sb2"] is None and marks["sb3"] is None, marks

        rest = interrupted_in_window(path, status_marks_the_canary)
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert "a signal during the window: the canary goes back to its last good drafter" in rest, rest[-3000:]
    assert "previous deployment restored and verified" in rest, rest[-3000:]
    assert fingerprint(sb, "sb1") == serving and server_pid(sb, "sb1") != before["sb1"]
    assert {h: server_pid(sb, h) for h in ("sb2", "sb3")} == {h: before[h] for h in ("sb2", "sb3")}
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)
    assert sb.run("sb1", "test -e ~/.deployctl/canary.json").returncode != 0  # the mark is gone

    # a drafter better on every kind (the one the signal interrupted): promoted, every replica ends on it
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=64,
                         prompts=LIVE_MIX, pause_s=0.02) as client:
        time.sleep(1.0)
        code, doc, err = cli_json_err(capsys, "-c", str(path), "restart", "--json")
        time.sleep(0.5)
    assert code == 0, summary(doc) + err[-3000:]
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert doc["fleet"]["canary"]["outcome"] == "promote", doc["fleet"]["canary"]
    assert fingerprint(sb, "sb1") != serving
    assert all(h["outcome"] == "ok" for h in doc["hosts"]), summary(doc)
    assert all(server_pid(sb, h) != old[h] for h in HOSTS)
