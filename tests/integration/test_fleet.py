"""Issues 9 and 18 over the real-sshd sandbox: SGLang's real router under both of its names (smg
1.13.0, Shepherd Model Gateway, and sglang-router 0.3.2) in front of three SIMULATED replicas,
rolling redeploys that drain and re-add workers. Tests that take ``router_package`` run against
both packages; the others run against smg, the package SGLang's docs install today."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from deploy.base.errors import ExitCode
from tests.integration.fleet_client import StreamingClient, stream_once
from deploy.cli.main import main
from tests.integration.helpers import FAST, REPO, cli_json, default_signals, nightly_with, wait_until, write_config

pytestmark = pytest.mark.sandbox
#: each package in its own venv (tests/bootstrap.sh): "only smg installed" is a real situation
ROUTER_PYTHONS = {"smg": REPO / ".smg-venv" / "bin" / "python",
                  "sglang-router": REPO / ".router-venv" / "bin" / "python"}
ROUTER_VERSIONS = {"smg": "1.13.0", "sglang-router": "0.3.2"}
ROUTER_PYTHON = ROUTER_PYTHONS["smg"]
ROUTER_PORT = 30080
HOSTS = ("sb1", "sb2", "sb3")


@pytest.fixture(autouse=True)
def _router_installed():
    for python in ROUTER_PYTHONS.values():
        if not python.is_file():
            pytest.skip(f"{python} missing: run tests/bootstrap.sh (installs smg 1.13.0 and sglang-router 0.3.2)")


@pytest.fixture(params=sorted(ROUTER_PYTHONS))
def router_package(request) -> str:
    return request.param


def fleet_config(sandbox, tmp_path: Path, policy: str = "round_robin", package: str = "smg", **env) -> Path:
    router = {"host": "sb1", "port": ROUTER_PORT, "policy": policy, "python": str(ROUTER_PYTHONS[package]),
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


def test_up_with_router_reaches_every_replica_rolls_with_no_failed_request_and_down_stops_all(
        clean_sandbox, tmp_path, capsys, router_package):
    """Holds, on one fleet `up` per router package, the former
    test_up_with_router_reaches_every_replica_and_down_stops_all and, between its checks of the
    fresh fleet and its `down`s, the former test_rolling_restart_with_streaming_client_fails_no_request
    (which deployed the same fleet from scratch for it). The whole test runs at
    SGLANG_SIM_TIME_SCALE=0.05, the rolling restart's (its long streams must still be in flight at
    every removal); the up checks send short requests only."""
    sb = clean_sandbox
    path = fleet_config(sb, tmp_path, package=router_package, SGLANG_SIM_TIME_SCALE="0.05")
    code, doc = cli_json(capsys, "-c", str(path), "plan", "--json")
    assert code == 0
    assert doc["fleet"]["batches"] == [["sb1"], ["sb2"], ["sb3"]]
    assert doc["fleet"]["router"]["argv"][-4:] == ["--worker-urls"] + [worker_url(sb, h) for h in HOSTS]
    code, doc = cli_json(capsys, "-c", str(path), "doctor", "--json")
    checks = {c["name"]: c for c in next(h for h in doc["hosts"] if h["host"] == "sb1")["checks"]}
    assert checks["router-package"]["status"] == "pass", checks["router-package"]
    assert f"{router_package} {ROUTER_VERSIONS[router_package]}" in checks["router-package"]["reason"]
    assert checks["router-port"]["status"] == "pass", checks["router-port"]
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    phases = [p["phase"] for p in doc["fleet"]["phases"]]
    assert phases[-1] == "router end-to-end" and all(p["status"] == "ok" for p in doc["fleet"]["phases"])
    # one host at a time by default with a router: three batches
    assert [p for p in phases if "redeploy" in p] == ["batch 1/3 redeploy sb1", "batch 2/3 redeploy sb2",
                                                       "batch 3/3 redeploy sb3"]
    # issue 42: the probe of a fresh host (no fixer yet) is a plain line, not python's "can't open file"
    details = {p["phase"]: p.get("detail") or "" for p in doc["fleet"]["phases"]}
    assert "sb2 (fixer not on the host yet; uploading it with the redeploy)" in details["batch 2/3 check unchanged sb2"]
    assert not [d for d in details.values() if "can't open file" in d], details
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
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    [router] = doc["routers"]
    assert router["package"] == {"name": router_package, "version": ROUTER_VERSIONS[router_package]}, router
    assert router["alive"] and sorted(w["url"] for w in router["workers"]) == sorted(worker_url(sb, h) for h in HOSTS)
    code, doc = cli_json(capsys, "-c", str(path), "doctor", "--json")
    checks = {c["name"]: c for c in next(h for h in doc["hosts"] if h["host"] == "sb1")["checks"]}
    assert checks["router-port"]["status"] == "pass" and "deployctl started" in checks["router-port"]["reason"]

    # -- former test_rolling_restart_with_streaming_client_fails_no_request: the fleet as `up` left it
    old = {h: server_pid(sb, h) for h in HOSTS}
    for host in HOSTS:
        new_checkpoint(sb, host)
    # long streams (~0.7 s each): every removal finds requests in flight, which must run to the end
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=2048) as client:
        time.sleep(0.5)
        code, doc = cli_json(capsys, "-c", str(path), "restart", "--serial", "1", "--json")
        time.sleep(0.5)
    assert code == 0, summary(doc)
    stats = client.stats
    assert stats.failed == 0, stats.errors[:5]
    assert stats.ok >= 20, stats.ok
    long_ones = [end - start for start, end, ok in stats.timeline if ok]
    assert sorted(long_ones)[len(long_ones) // 2] > 0.3, "the streams were too short to test draining"
    assert all(server_pid(sb, h) != old[h] for h in HOSTS)  # every replica really was redeployed
    rotation = doc["fleet"]["rotation"]
    assert sorted(rotation) == list(HOSTS)
    assert all(0 < rotation[h]["out_of_rotation_s"] < 60 for h in HOSTS), rotation
    # requests kept flowing while each replica was out: some finished inside every window
    workers = router_workers(sb)
    assert sorted(w["url"] for w in workers) == sorted(worker_url(sb, h) for h in HOSTS)
    assert all(w["is_healthy"] for w in workers), workers

    pid = int(sb.run("sb1", f"cat ~/.deployctl/router/{ROUTER_PORT}/router.pid").stdout)
    # Some replicas down (merged from test_down_of_some_replicas_takes_them_out_of_the_router_which_
    # keeps_serving, which deployed the same fleet from scratch for it): sb1 is the router host AND
    # a replica: its replica goes, the router stays for sb2
    code, doc = cli_json(capsys, "-c", str(path), "down", "--host", "sb1", "--host", "sb3", "--json")
    assert code == 0, summary(doc)
    assert doc["router"]["stopped"] is False and sorted(doc["router"]["removed"]) == sorted(
        worker_url(sb, h) for h in ("sb1", "sb3")), doc["router"]
    assert int(sb.run("sb1", f"cat ~/.deployctl/router/{ROUTER_PORT}/router.pid").stdout) == pid
    assert sb.run("sb1", f"ps -o stat= -p {pid}").stdout.strip()[:1] in ("S", "R")
    assert [w["url"] for w in router_workers(sb)] == [worker_url(sb, "sb2")]
    assert not running(sb, "sb1") and not running(sb, "sb3") and running(sb, "sb2")
    before = generate_lines(sb, "sb2")
    for _ in range(3):  # nothing goes to a stopped worker
        assert generate_via_router(sb)["text"]
    assert generate_lines(sb, "sb2") >= before + 3
    # the whole run brought down: the router stops too
    code, doc = cli_json(capsys, "-c", str(path), "down", "--json")
    assert code == 0, summary(doc)
    assert doc["router"]["stopped"] is True and doc["router"]["pid"] == pid, doc["router"]
    state = sb.run("sb1", f"ps -o stat= -p {pid} || true").stdout.strip()
    assert state == "" or state.startswith("Z"), f"router still running after down: {state}"
    for host in HOSTS:
        left = sb.run(host, "ps -u $(id -u) -o stat=,args= | grep -v '^Z' | grep -E 'sglang.launch_server|sglang_router|sglang::router|smg' | grep -v grep || true").stdout.strip()
        assert left == "", (host, left)


def new_checkpoint(sandbox, host: str, marker: str | None = None) -> None:
    """A new checkpoint lands on the host's configured drafter path (same file, last 64 tensor bytes
    and mtime changed), maybe marked bad by a SIMULATION marker file."""
    drafter = sandbox.host(host).drafter_dir
    weights = f"{drafter}/model.safetensors"
    command = (f"size=$(stat -c %s {weights}) && head -c 64 /dev/urandom | "
               f"dd of={weights} bs=1 seek=$((size - 64)) conv=notrunc status=none && "
               f"touch -d '+{int(time.time()) % 1000 + 1} seconds' {weights}")
    if marker:
        command += f" && printf x > {drafter}/SIMULATION-{marker}"
    assert sandbox.run(host, command).returncode == 0


def running_on(sandbox, host: str) -> int:
    with urllib.request.urlopen(f"{worker_url(sandbox, host)}/v1/loads", timeout=5) as resp:
        return sum(int(entry["num_running_reqs"]) for entry in json.load(resp)["loads"])


def server_pid(sandbox, host: str) -> int:
    return int(sandbox.run(host, "cat ~/.deployctl/server.pid").stdout)


def test_a_failing_doctor_a_drain_timeout_and_a_failing_batch_each_stop_the_roll(clean_sandbox, tmp_path, capsys):
    """Holds three former tests on one fleet `up` (each deployed its own from scratch), in sequence:
    test_a_failing_replica_doctor_stops_the_roll_before_any_replica_is_touched (issue 18: every router
    check and every replica's doctor run before the first replica is stopped; before, batch 1 was
    redeployed and only then did a later check fail), then
    test_drain_timeout_leaves_the_batch_serving_and_back_in_the_router, then
    test_failing_batch_stops_the_roll_later_batch_untouched_router_keeps_routing. Each part asserts
    that the roll it stopped left every replica serving, in the router, unchanged but for what it
    redeployed: the state the next part starts from (new checkpoints pending on the hosts change
    nothing there: each part lands its own)."""
    sb = clean_sandbox
    path = fleet_config(sb, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    old = {h: server_pid(sb, h) for h in HOSTS}
    records = {h: sb.run(h, "cat ~/.deployctl/deployment.json").stdout for h in HOSTS}
    for host in HOSTS:
        new_checkpoint(sb, host)
    # sb3's login environment sets SGLang's test knob: its doctor fails (issue 19's check)
    assert sb.run("sb3", "echo 'export SGLANG_SIMULATE_ACC_LEN=3.5' >> ~/.bashrc").returncode == 0
    try:
        code, doc = cli_json(capsys, "-c", str(path), "restart", "--serial", "1", "--json")
    finally:
        sb.run("sb3", "sed -i '/SGLANG_SIMULATE_ACC_LEN/d' ~/.bashrc")
    assert code == ExitCode.VERIFY, summary(doc)
    phases = doc["fleet"]["phases"]
    assert phases[0]["phase"].startswith("pre-flight") and phases[0]["status"] == "failed", phases[0]
    assert "sb3" in phases[0]["detail"] and "no replica was stopped" in phases[0]["detail"]
    for phase in phases[1:]:  # router-add runs always (it puts back what a batch took out): nothing here
        assert phase["status"] == "not-run" or ("router-add" in phase["phase"] and
                                               phase["detail"].startswith("nothing of this batch")), phase
    assert {h: server_pid(sb, h) for h in HOSTS} == old
    assert {h: sb.run(h, "cat ~/.deployctl/deployment.json").stdout for h in HOSTS} == records
    assert all(h["outcome"] != "ok" for h in doc["hosts"]), [(h["host"], h["outcome"]) for h in doc["hosts"]]
    workers = router_workers(sb)
    assert sorted(w["url"] for w in workers) == sorted(worker_url(sb, h) for h in HOSTS)
    assert all(w["is_healthy"] for w in workers)

    # -- former test_drain_timeout_leaves_the_batch_serving_and_back_in_the_router: nothing was touched
    old = {h: server_pid(sb, h) for h in HOSTS}
    text = yaml.safe_load(path.read_text())
    text["runs"][0]["router"]["drain_timeout_s"] = 0.5
    drain = tmp_path / "drain" / "deployctl.yaml"  # the other parts keep the default 30 s
    drain.parent.mkdir()
    drain.write_text(yaml.safe_dump(text))
    new_checkpoint(sb, "sb1")
    # requests straight to sb1 (~6 s each), back to back for as long as the restart runs: whenever
    # the roll takes sb1 out of the router, sb1 still has one in flight (one request alone could end
    # before the drain starts on a loaded machine, where the pre-drain probe takes seconds)
    import threading

    finished: list = []
    stop = threading.Event()

    def keep_sb1_busy():
        while not stop.is_set() and len(finished) < 30:
            finished.append(stream_once(sb.host("sb1").address, 30000, 16384))

    worker = threading.Thread(target=keep_sb1_busy, daemon=True)
    worker.start()
    wait_until(lambda: running_on(sb, "sb1") > 0, timeout=10, what="sb1 to have a request in flight")
    code, doc = cli_json(capsys, "-c", str(drain), "restart", "--serial", "1", "--json")
    stop.set()
    worker.join(timeout=60)
    assert code == ExitCode.TIMEOUT, summary(doc)
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    assert phases["batch 1/3 drain sb1"]["status"] == "failed"
    assert "in flight after the drain timeout" in phases["batch 1/3 drain sb1"]["detail"]
    assert phases["batch 1/3 redeploy sb1"]["status"] == "not-run"
    assert phases["batch 1/3 router-add sb1"]["status"] == "ok"
    assert {h: server_pid(sb, h) for h in HOSTS} == old  # nothing was redeployed
    assert finished and all(f == (True, "") for f in finished), finished  # each long request ran to its end
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)

    # -- former test_failing_batch_stops_the_roll_later_batch_untouched_router_keeps_routing
    old = {h: server_pid(sb, h) for h in HOSTS}
    record = {h: sb.run(h, "cat ~/.deployctl/deployment.json").stdout for h in HOSTS}
    new_checkpoint(sb, "sb1")
    new_checkpoint(sb, "sb2", marker="crash-during-load")  # batch 2's new drafter cannot load
    new_checkpoint(sb, "sb3")
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=2) as client:
        code, doc = cli_json(capsys, "-c", str(path), "restart", "--serial", "1", "--json")
    assert code == ExitCode.ROLLED_BACK, summary(doc)
    phases = {p["phase"]: p["status"] for p in doc["fleet"]["phases"]}
    assert phases["batch 1/3 redeploy sb1"] == "ok"
    assert phases["batch 2/3 redeploy sb2"] == "failed"
    assert phases["batch 2/3 router-add sb2"] == "ok"  # rolled back to its last good: serving again
    assert phases["batch 3/3 router-remove sb3"] == "not-run"
    assert phases["batch 3/3 redeploy sb3"] == "not-run"
    assert phases["router end-to-end"] == "not-run"
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts["sb1"]["outcome"] == "ok" and hosts["sb2"]["outcome"] == "rolled-back"
    assert all(s["status"] == "not-run" for s in hosts["sb3"]["steps"])
    # batch 3 untouched: same server, same recorded deployment
    assert server_pid(sb, "sb3") == old["sb3"]
    assert sb.run("sb3", "cat ~/.deployctl/deployment.json").stdout == record["sb3"]
    assert server_pid(sb, "sb1") != old["sb1"]
    # the router still routes, to healthy workers only, and nothing the client sent failed
    workers = router_workers(sb)
    assert sorted(w["url"] for w in workers) == sorted(worker_url(sb, h) for h in HOSTS)
    assert all(w["is_healthy"] for w in workers)
    for _ in range(3):
        assert generate_via_router(sb)["text"]
    assert client.stats.failed == 0, client.stats.errors[:5]


def test_serial_that_empties_the_router_is_refused(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = fleet_config(sb, tmp_path)
    code = main(["-c", str(path), "restart", "--serial", "3"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "--serial 3 takes all 3 replica(s)" in err and "--allow-downtime" in err
    assert "Traceback" not in err
    # nothing was touched: no server, no router
    for host in HOSTS:
        assert sb.run(host, "test -e ~/.deployctl/server.pid").returncode != 0


def nodes_config(sandbox, tmp_path: Path, **env) -> Path:
    return write_config(sandbox, tmp_path, run={"group": None, "nodes": ["sb1", "sb2"], "env": FAST | env,
                                                "dist_init_port": 30001})


def argv_of(sandbox, host: str) -> list[str]:
    return json.loads(sandbox.run(host, "cat ~/.deployctl/deployment.json").stdout)["argv"]


def running(sandbox, host: str) -> str:
    return sandbox.run(host, "ps -u $(id -u) -o stat=,args= | grep -v '^Z' | grep 'sglang.launch_server' "
                             "| grep -v grep || true").stdout.strip()


def test_two_node_server_launches_rank0_first_with_consistent_flags(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = nodes_config(sb, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    names = [p["phase"] for p in doc["fleet"]["phases"]]
    assert names.index("rank 0 launch sb1") < names.index("ranks 1+ launch sb2") < names.index(
        "rank 0 ready and verified sb1")
    a, b = argv_of(sb, "sb1"), argv_of(sb, "sb2")
    rank = {h: argv[argv.index("--node-rank") + 1] for h, argv in (("sb1", a), ("sb2", b))}
    assert rank == {"sb1": "0", "sb2": "1"}
    for argv in (a, b):
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--dist-init-addr") + 1] == f"{sb.host('sb1').address}:30001"
    strip = lambda argv, host: [x for i, x in enumerate(argv) if not (i > 0 and argv[i - 1] in ("--node-rank", "--host"))]  # noqa: E731
    assert strip(a, "sb1") == strip(b, "sb2")  # the same argv but the rank (and each node's own bind address)
    steps = {h["host"]: {s["step"]: s["status"] for s in h["steps"]} for h in doc["hosts"]}
    assert steps["sb1"]["verify-acceptance"] == "ok" and steps["sb2"]["verify-acceptance"] == "skipped"
    assert running(sb, "sb1") and running(sb, "sb2")
    # rank 1 serves no HTTP
    assert sb.run("sb2", f"python3 -c \"import socket; socket.create_connection(('{sb.host('sb2').address}', 30000), 1)\"").returncode != 0
    # unchanged: converges as one deployment, nothing restarted
    pids = {h: server_pid(sb, h) for h in ("sb1", "sb2")}
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    assert {h: server_pid(sb, h) for h in ("sb1", "sb2")} == pids


def test_rank1_dying_during_load_tears_down_both_nodes(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = nodes_config(sb, tmp_path, SGLANG_SIM_LOAD_SECONDS="6")
    import threading

    def kill_rank1_when_loading():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = sb.run("sb2", "grep -l 'Load weight begin' ~/.deployctl/logs/latest.log 2>/dev/null && cat ~/.deployctl/server.pid")
            lines = out.stdout.split()
            if out.returncode == 0 and len(lines) == 2:
                sb.run("sb2", f"kill -9 {lines[1]}")
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank1_when_loading, daemon=True)
    killer.start()
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    killer.join(timeout=70)
    assert code != 0, summary(doc)
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    assert phases["rank 0 ready and verified sb1"]["status"] == "failed"
    assert "Connection closed by peer" in phases["rank 0 ready and verified sb1"]["detail"] or \
        "died" in phases["rank 0 ready and verified sb1"]["detail"], phases
    assert phases["stop every node"]["status"] == "ok"
    assert not running(sb, "sb1") and not running(sb, "sb2")


def health(sandbox, host: str, port: int = 30000) -> int:
    with urllib.request.urlopen(f"http://{sandbox.host(host).address}:{port}/health", timeout=10) as resp:
        return resp.status


def test_node_group_with_a_drafter_crashing_during_load_rolls_back_every_node(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = nodes_config(sb, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    good = {h: json.loads(sb.run(h, "cat ~/.deployctl/last-good.json").stdout) for h in ("sb1", "sb2")}
    group = {h: good[h]["node_group"] for h in good}
    assert group["sb1"]["id"] == group["sb2"]["id"] and [group[h]["rank"] for h in ("sb1", "sb2")] == [0, 1]
    assert group["sb1"]["dist_init_addr"] == f"{sb.host('sb1').address}:30001"
    good_argv = {h: argv_of(sb, h) for h in ("sb1", "sb2")}
    old = {h: server_pid(sb, h) for h in ("sb1", "sb2")}
    for host in ("sb1", "sb2"):  # the new checkpoint lands on every node; it crashes while loading
        new_checkpoint(sb, host, marker="crash-during-load")
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    assert code == ExitCode.ROLLED_BACK, summary(doc)
    names = [p["phase"] for p in doc["fleet"]["phases"]]
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    assert phases["rank 0 ready and verified sb1"]["status"] == "failed"
    assert names.index("rollback: rank 0 launch sb1") < names.index("rollback: ranks 1+ launch sb2") < \
        names.index("rollback: rank 0 ready and verified sb1") < names.index("rollback: ranks 1+ alive")
    assert all(phases[n]["status"] == "ok" for n in names if n.startswith("rollback:")), phases
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert {h: hosts[h]["outcome"] for h in hosts} == {"sb1": "rolled-back", "sb2": "rolled-back"}
    assert "previous deployment restored and verified on every node" in hosts["sb1"]["error"]
    assert "server died" in hosts["sb1"]["cause"]
    # both nodes run the previous deployment again: each its own argv (rank, bind address), the
    # previous drafter store path, the same dist-init address; relaunched, not left over
    for host in ("sb1", "sb2"):
        assert argv_of(sb, host) == good_argv[host]
        assert server_pid(sb, host) != old[host]
        line = running(sb, host)
        assert good[host]["drafter_path"].replace("~/", "") in line and \
            f"--dist-init-addr {sb.host('sb1').address}:30001" in line, line
    assert health(sb, "sb1") == 200
    assert "--node-rank 1" in running(sb, "sb2")
    # the last good records were not replaced by the failed deployment
    assert {h: json.loads(sb.run(h, "cat ~/.deployctl/last-good.json").stdout)["node_group"] for h in good} == group

    # --no-rollback keeps the old behaviour: every node stopped, exit 1
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--no-rollback", "--json")
    assert code == ExitCode.FAILED, summary(doc)
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    assert phases["stop every node"]["status"] == "ok" and "--no-rollback" in phases["stop every node"]["detail"]
    assert not any(n.startswith("rollback:") for n in phases)
    assert not running(sb, "sb1") and not running(sb, "sb2")


def test_a_held_dist_init_port_is_refused_before_any_node_is_stopped(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = nodes_config(sb, tmp_path)
    address = sb.host("sb1").address
    holder = int(sb.run("sb1", f"setsid nohup python3 -c \"import socket,time; s=socket.socket(); "
                               # SO_REUSEADDR: the earlier tests' rendezvous connections may sit in TIME_WAIT
                               f"s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                               f"s.bind(('{address}', 30001)); s.listen(); time.sleep(120)\" "
                               "> ~/stray-listener.log 2>&1 < /dev/null & echo $!").stdout.strip())
    probe = f"python3 -c \"import socket; socket.create_connection(('{address}', 30001), 1)\""
    try:
        wait_until(lambda: sb.run("sb1", probe).returncode == 0, what="the stray listener (~/stray-listener.log)")
        code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    finally:
        sb.run("sb1", f"kill {holder}")
    assert code == ExitCode.VERIFY, summary(doc)
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    check = phases["rank 0 dist-init port sb1"]
    assert check["status"] == "failed" and f"pid {holder}" in check["detail"] and "30001" in check["detail"], check
    assert phases["every node: stop-stale, free GPUs"]["status"] == "not-run", phases
    for host in ("sb1", "sb2"):
        assert sb.run(host, "test -e ~/.deployctl/server.pid").returncode != 0 and not running(sb, host)


def test_doctor_fails_a_router_host_without_sglang_router(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = write_config(sb, tmp_path, run={"env": FAST, "router": {"host": "sb2", "port": ROUTER_PORT,
                                                                    "python": "python3"}})
    # something else listens on the router's port
    sb.run("sb2", f"setsid nohup python3 -c \"import socket,time; s=socket.socket(); "
                  f"s.bind(('{sb.host('sb2').address}', {ROUTER_PORT})); s.listen(); time.sleep(60)\" "
                  "> /dev/null 2>&1 < /dev/null &")
    time.sleep(0.5)
    code, doc = cli_json(capsys, "-c", str(path), "doctor", "--json")
    assert code == ExitCode.VERIFY
    checks = {c["name"]: c for c in next(h for h in doc["hosts"] if h["host"] == "sb2")["checks"]}
    assert checks["router-package"]["status"] == "fail"
    assert "neither smg nor sglang-router" in checks["router-package"]["reason"]
    assert "pip install smg" in checks["router-package"]["fix"]
    # router.package forces a package that router.python lacks; a policy only smg has, on sglang-router
    for router, expected in (({"python": str(ROUTER_PYTHONS["smg"]), "package": "sglang-router"},
                               "router.package is 'sglang-router' but it is not installed there (found: smg 1.13.0)"),
                              ({"python": str(ROUTER_PYTHONS["sglang-router"]), "policy": "least_load"},
                               "'least_load' is not a policy of sglang-router 0.3.2")):
        (tmp_path / router.get("package", "policy")).mkdir()
        forced = write_config(sb, tmp_path / router.get("package", "policy"),
                              run={"env": FAST, "router": {"host": "sb2", "port": ROUTER_PORT + 1, **router}})
        code, doc = cli_json(capsys, "-c", str(forced), "doctor", "--json")
        assert code == ExitCode.VERIFY
        check = next(c for c in next(h for h in doc["hosts"] if h["host"] == "sb2")["checks"]
                     if c["name"] == "router-package")
        assert check["status"] == "fail" and expected in check["reason"], check
    assert checks["router-port"]["status"] == "fail" and f":{ROUTER_PORT}" in checks["router-port"]["reason"]


def test_an_unchanged_replica_stays_in_the_router_and_nightly_rolls_one_at_a_time_and_converges(
        clean_sandbox, tmp_path, capsys):
    """Holds two former tests on one fleet `up` (each deployed its own from scratch):
    test_an_unchanged_replica_stays_in_the_router_and_a_changed_one_is_drained (a repeated `up`
    after a new checkpoint on sb2), then test_nightly_behind_the_router_rolls_one_at_a_time_and_converges
    (another new checkpoint on sb2, `nightly`): the first part leaves the fleet converged with every
    replica in the router, which is the state the nightly part started from. The nightly benchmarks
    4 rounds per replica (helpers.nightly_with), not the shipped 12: its subject is the roll, and
    every replica's gate is a baseline here (last good records from `up`)."""
    sb = clean_sandbox
    path = fleet_config(sb, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    pids = {h: server_pid(sb, h) for h in HOSTS}
    new_checkpoint(sb, "sb2")
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=2) as client:
        code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    assert {h["host"]: h["outcome"] for h in doc["hosts"]} == {"sb1": "converged", "sb2": "ok", "sb3": "converged"}
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    assert "kept in the router: sb1" in phases["batch 1/3 check unchanged sb1"]["detail"]
    assert "to redeploy: sb2 (argv, drafter fingerprint changed)" in phases["batch 2/3 check unchanged sb2"]["detail"]
    assert "removed 0 worker(s)" in phases["batch 1/3 router-remove sb1"]["detail"]
    assert "removed 1 worker(s)" in phases["batch 2/3 router-remove sb2"]["detail"]
    rotation = doc["fleet"]["rotation"]
    assert rotation["sb1"] == {"out_of_rotation_s": 0.0, "note": "stayed in the router: unchanged"} == rotation["sb3"]
    assert rotation["sb2"]["out_of_rotation_s"] > 0
    assert server_pid(sb, "sb1") == pids["sb1"] and server_pid(sb, "sb2") != pids["sb2"]
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)
    # -- former test_nightly_behind_the_router_rolls_one_at_a_time_and_converges: the fleet converged again
    pids = {h: server_pid(sb, h) for h in HOSTS}
    new_checkpoint(sb, "sb2")
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=2) as client:
        code, doc = cli_json(capsys, "-c", str(path), "nightly", "--json",
                             "--playbook", str(nightly_with(tmp_path, rounds=4)))
    assert code == 0, summary(doc)
    outcomes = {h["host"]: h["outcome"] for h in doc["hosts"]}
    assert outcomes == {"sb1": "converged", "sb2": "ok", "sb3": "converged"}
    assert [p["phase"] for p in doc["fleet"]["phases"] if "redeploy" in p["phase"]] == [
        "batch 1/3 redeploy sb1", "batch 2/3 redeploy sb2", "batch 3/3 redeploy sb3"]
    assert server_pid(sb, "sb2") != pids["sb2"] and server_pid(sb, "sb1") == pids["sb1"]
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)


def half_speed(sandbox, host: str, directory: str) -> None:
    """SIMULATION marker: the stand-in SGLang launched from ``directory`` decodes at half speed."""
    home = sandbox.host(host).home
    target = str(directory).replace("~/", f"{home}/", 1)
    assert sandbox.run(host, f"printf 0.5 > '{target}/SIMULATION-decode-speed'").returncode == 0


def test_node_group_nightly_regression_is_exit_12_rolled_back_or_with_nothing_to_roll_back_to(
        clean_sandbox, tmp_path, capsys):
    """Every nightly here benchmarks 6 rounds (helpers.nightly_with), not the shipped 12: a half-speed
    decode is far beyond the rounds' noise, and 6 a side leave the gate's 95% interval room for an
    outlier round on a loaded machine (4, the gate's minimum, would need every pair apart)."""
    sb = clean_sandbox
    path = nodes_config(sb, tmp_path)
    nightly = ("--playbook", str(nightly_with(tmp_path, rounds=6)))
    code, doc = cli_json(capsys, "-c", str(path), "nightly", "--json", *nightly)
    assert code == 0, summary(doc)
    good = {h: json.loads(sb.run(h, "cat ~/.deployctl/last-good.json").stdout) for h in ("sb1", "sb2")}
    assert good["sb1"]["metrics"]["output_tok_s"] > 0

    # the same deployment relaunched (--force) on a host that got slower: the drafter fingerprint is the
    # last good one's, so it is the host's drift, never a slowdown of the checkpoint (issue 39; exit 12
    # before): exit 0, no rollback, the group serves on, the gate says HOST DRIFT
    for host in ("sb1", "sb2"):
        half_speed(sb, host, good[host]["drafter_path"])
    code, doc = cli_json(capsys, "-c", str(path), "nightly", "--force", "--json", *nightly)
    assert code == 0, summary(doc)
    hosts = {h["host"]: h for h in doc["hosts"]}
    gate = next(s for s in hosts["sb1"]["steps"] if s["step"] == "regression-gate")
    assert gate["detail"].startswith("HOST DRIFT, not the checkpoint"), gate["detail"]
    assert gate["data"]["throughput_gate"]["outcome"] == "drift" and gate["data"]["throughput_gate"]["unchanged"]
    assert not any(p["phase"].startswith("rollback:") for p in doc["fleet"]["phases"])
    assert health(sb, "sb1") == 200 and "--node-rank 1" in running(sb, "sb2")
    for host in ("sb1", "sb2"):
        target = good[host]["drafter_path"].replace("~/", f"{sb.host(host).home}/", 1)
        sb.run(host, f"rm -f '{target}/SIMULATION-decode-speed'")
    # the stand-in reads its decode speed at load: relaunch the good deployment at full speed, so that tonight's
    # control (same-night-control, before the next stop) measures it as it really is
    code, doc = cli_json(capsys, "-c", str(path), "nightly", "--force", "--json", *nightly)
    assert code == 0, summary(doc)

    # a new checkpoint at half speed on every node: regression, the group's last good one relaunched:
    # still exit 12 (a regression, as on one host), not 11
    for host in ("sb1", "sb2"):
        new_checkpoint(sb, host)
        half_speed(sb, host, sb.host(host).drafter_dir)
    code, doc = cli_json(capsys, "-c", str(path), "nightly", "--json", *nightly)
    assert code == ExitCode.REGRESSION, summary(doc)
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert {h: hosts[h]["outcome"] for h in hosts} == {"sb1": "regression", "sb2": "regression"}
    assert "rolled back: previous deployment restored and verified on every node" in hosts["sb1"]["error"]
    for host in ("sb1", "sb2"):
        assert good[host]["drafter_path"].replace("~/", "") in running(sb, host)
    assert health(sb, "sb1") == 200


def test_ctrl_c_during_a_drain_puts_the_batch_back_into_the_router(clean_sandbox, tmp_path, capsys):
    import queue
    import signal
    import subprocess
    import sys
    import threading

    sb = clean_sandbox
    path = fleet_config(sb, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    pids = {h: server_pid(sb, h) for h in HOSTS}
    # long generations keep sb1 busy, so its drain waits: that is when Ctrl-C comes
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=2048):
        proc = subprocess.Popen([sys.executable, "-m", "deploy", "-c", str(path), "restart", "--force"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                                preexec_fn=default_signals)
        lines: queue.Queue = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
        reader.start()
        seen = []
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=5)
                except queue.Empty:
                    continue
                seen.append(line)
                if "batch 1/3 drain sb1: start" in line:
                    break
            else:
                raise AssertionError("the drain never started:\n" + "".join(seen[-20:]))
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                reader.join(timeout=30)
                raise AssertionError("no exit within 60 s of the Ctrl-C:\n" + "".join(seen[-10:]) +
                                     "".join(lines.get_nowait() for _ in range(lines.qsize()))) from None
            assert proc.returncode == ExitCode.INTERRUPTED
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    # every line deployctl wrote: the reader ends at stderr's EOF (an empty queue just after the exit
    # is not the end on a loaded machine: the reader may not have queued the last lines yet)
    reader.join(timeout=30)
    rest = "".join(seen) + "".join(lines.get_nowait() for _ in range(lines.qsize()))
    assert "Ctrl-C: putting back" in rest, rest[-2000:]
    # sb1 was taken out and drained, never touched: it serves on and is back in the router
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)
    assert {h: server_pid(sb, h) for h in HOSTS} == pids
