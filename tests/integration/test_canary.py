"""Issue 43 over the real-sshd sandbox: a canary judged on live traffic behind SGLang's real router
(smg and sglang-router), three SIMULATED replicas, steady client traffic from a live prompt mix the
built-in prompts do not have (instructions: sandbox/sim_sglang/.../prompt_kinds.py).

One fleet `up` per router package, then: a drafter better on the built-in prompts (it passes verify)
and worse on the live mix is rolled back after its window, quarantined, the other replicas never
touched, no failed request; then a better drafter is promoted and every replica ends on it."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.fleet_client import StreamingClient
from tests.integration.helpers import FAST, cli_json_err, write_config
from tests.integration.test_fleet import (HOSTS, ROUTER_PORT, ROUTER_PYTHONS, new_checkpoint, router_workers,
                                          server_pid, summary, worker_url)

pytestmark = pytest.mark.sandbox

LIVE_MIX = ("Translate to German: the meeting moves to Thursday.", "Rewrite this email so it sounds friendlier.",
            "Draft a polite reply declining the invitation.", "Give three names for a bakery.")
CANARY = {"replicas": 1, "window": "60s", "interval": 1, "min_requests": 40}


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


def test_a_canary_worse_on_live_traffic_is_rolled_back_and_a_better_one_promoted(clean_sandbox, tmp_path, capsys,
                                                                                  router_package):
    sb = clean_sandbox
    router = {"host": "sb1", "port": ROUTER_PORT, "policy": "round_robin",
              "python": str(ROUTER_PYTHONS[router_package]), "startup_timeout_s": 60, "drain_timeout_s": 30}
    path = write_config(sb, tmp_path, run={"env": FAST, "router": router, "rollout": {"canary": CANARY}})
    code, doc, err = cli_json_err(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    code, doc, err = cli_json_err(capsys, "-c", str(path), "plan", "restart", "--json")
    assert code == 0
    phases = [p["phase"] for p in doc["fleet"]["phases"]]
    assert phases[1] == "canary: last good of sb1" and any(p.startswith("canary window sb1") for p in phases), phases

    # better on the built-in prompts (verify passes), half the extra tokens on the live mix of instructions
    old = {h: server_pid(sb, h) for h in HOSTS}
    for host in HOSTS:
        kinds_marker(sb, host, {"instruct": 0.5, "*": 1.1})
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
    assert server_pid(sb, "sb1") != old["sb1"]  # relaunched on its last good drafter, verified
    assert {h: server_pid(sb, h) for h in ("sb2", "sb3")} == {h: old[h] for h in ("sb2", "sb3")}  # never touched
    quarantine = json.loads(sb.run("sb1", "cat ~/.deployctl/quarantine.json").stdout)
    reasons = [e["reason"] for e in (quarantine.get("entries") or quarantine).values() if isinstance(e, dict)]
    assert any(r.startswith("canary: live acceptance") for r in reasons), quarantine
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)

    # a drafter better on every kind: promoted, every replica ends on it
    for host in HOSTS:
        kinds_marker(sb, host, {"*": 1.15})
        new_checkpoint(sb, host)
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=64,
                         prompts=LIVE_MIX, pause_s=0.02) as client:
        time.sleep(1.0)
        code, doc, err = cli_json_err(capsys, "-c", str(path), "restart", "--json")
        time.sleep(0.5)
    assert code == 0, summary(doc) + err[-3000:]
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert doc["fleet"]["canary"]["outcome"] == "promote", doc["fleet"]["canary"]
    assert all(h["outcome"] == "ok" for h in doc["hosts"]), summary(doc)
    assert all(server_pid(sb, h) != old[h] for h in HOSTS)
