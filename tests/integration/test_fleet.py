"""Issue 9 over the real-sshd sandbox: SGLang's real router (sglang-router 0.3.2) in front of three
SIMULATED replicas, rolling redeploys that drain and re-add workers."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from deploy.errors import ExitCode
from tests.integration.fleet_client import StreamingClient, stream_once
from tests.integration.helpers import cli_json, cli_json_err, write_config

pytestmark = pytest.mark.sandbox
REPO = Path(__file__).resolve().parents[2]
ROUTER_PYTHON = REPO / ".router-venv" / "bin" / "python"
FAST = {"SGLANG_SIM_LOAD_SECONDS": "0.5", "SGLANG_SIM_WARMUP_SECONDS": "0.1"}
ROUTER_PORT = 30080
HOSTS = ("sb1", "sb2", "sb3")


@pytest.fixture(autouse=True)
def _router_installed():
    if not ROUTER_PYTHON.is_file():
        pytest.skip(f"{ROUTER_PYTHON} missing: run tests/bootstrap.sh (installs sglang-router 0.3.2 there)")


def fleet_config(sandbox, tmp_path: Path, policy: str = "round_robin", **env) -> Path:
    router = {"host": "sb1", "port": ROUTER_PORT, "policy": policy, "python": str(ROUTER_PYTHON),
              "startup_timeout_s": 60, "drain_timeout_s": 30}
    return write_config(sandbox, tmp_path, run={"env": FAST | env, "router": router})


def router_base(sandbox) -> str:
    return f"http://{sandbox.host('sb1').address}:{ROUTER_PORT}"


def router_workers(sandbox) -> list[dict]:
    with urllib.request.urlopen(router_base(sandbox) + "/workers", timeout=10) as resp:
        return json.load(resp)["workers"]


def generate_via_router(sandbox) -> dict:
    req = urllib.request.Request(router_base(sandbox) + "/generate", method="POST",
                                 data=json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 4}}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        return json.load(resp)


def generate_lines(sandbox, host: str) -> int:
    """/generate requests the replica's current log shows from somewhere else than itself."""
    out = sandbox.run(host, "grep -c 'POST /generate HTTP' ~/.deployctl/logs/latest.log || true")
    return int(out.stdout.strip() or 0)


def summary(doc: dict) -> str:
    """The fleet part and each host's error: what a failed assertion should show first."""
    hosts = [{k: h.get(k) for k in ("host", "outcome", "error", "cause", "warnings")} for h in doc.get("hosts", [])]
    return json.dumps({"fleet": doc.get("fleet"), "hosts": hosts}, indent=1)[:6000]


def worker_url(sandbox, host: str) -> str:
    return f"http://{sandbox.host(host).address}:30000"


def test_up_with_router_reaches_every_replica_and_down_stops_all(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = fleet_config(sb, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    phases = [p["phase"] for p in doc["fleet"]["phases"]]
    assert phases[-1] == "router end-to-end" and all(p["status"] == "ok" for p in doc["fleet"]["phases"])
    # one host at a time by default with a router: three batches
    assert [p for p in phases if "redeploy" in p] == ["batch 1/3 redeploy sb1", "batch 2/3 redeploy sb2",
                                                       "batch 3/3 redeploy sb3"]
    workers = router_workers(sb)
    assert sorted(w["url"] for w in workers) == sorted(worker_url(sb, h) for h in HOSTS)
    assert all(w["is_healthy"] for w in workers)
    before = {h: generate_lines(sb, h) for h in HOSTS}
    for _ in range(6):  # round_robin: each replica gets two
        assert generate_via_router(sb)["text"]
    after = {h: generate_lines(sb, h) for h in HOSTS}
    assert all(after[h] >= before[h] + 1 for h in HOSTS), (before, after)
    ok, why = stream_once(sb.host("sb1").address, ROUTER_PORT)
    assert ok, why

    pid = int(sb.run("sb1", "cat ~/.deployctl/router/router.pid").stdout)
    code, doc = cli_json(capsys, "-c", str(path), "down", "--json")
    assert code == 0, summary(doc)
    assert doc["router"]["stopped"] is True and doc["router"]["pid"] == pid, doc["router"]
    state = sb.run("sb1", f"ps -o stat= -p {pid} || true").stdout.strip()
    assert state == "" or state.startswith("Z"), f"router still running after down: {state}"
    for host in HOSTS:
        left = sb.run(host, "ps -u $(id -u) -o stat=,args= | grep -v '^Z' | grep -E 'sglang.launch_server|sglang_router|sglang::router' | grep -v grep || true").stdout.strip()
        assert left == "", (host, left)
