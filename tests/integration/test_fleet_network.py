"""Issue 27 over the real-sshd sandbox, with both real router packages (smg 1.13.0, sglang-router
0.3.2): a fleet bound to 0.0.0.0, the router's other ports, a router that dies mid-roll.

Each SIMULATED host has its own network stack (sandbox/sim_network.c, preloaded into its user's
processes): a 0.0.0.0 bind answers on the host's address, 127.0.0.1 is the host's own, so a worker
URL naming 127.0.0.1 reaches only the router host's own replica, as on a real network."""

from __future__ import annotations

import time

import pytest

from tests.integration.fleet_client import StreamingClient
from tests.integration.helpers import cli_json
from tests.integration.test_fleet import (HOSTS, ROUTER_PORT, fleet_config, generate_lines, generate_via_router,
                                          new_checkpoint, router_package, router_workers, server_pid, summary,
                                          worker_url, _router_installed)

pytestmark = pytest.mark.sandbox
__all__ = ["router_package", "_router_installed"]  # fixtures, used by name


def wildcard_config(sandbox, tmp_path, package: str, **env):
    import yaml

    path = fleet_config(sandbox, tmp_path, package=package, **env)
    config = yaml.safe_load(path.read_text())
    config["runs"][0]["serve_host"] = "0.0.0.0"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_fleet_bound_to_0000_serves_from_every_replica_and_rolls_with_no_failed_request(
        clean_sandbox, tmp_path, capsys, router_package):
    sb = clean_sandbox
    if not sb.own_network:
        pytest.skip("no C compiler: the sandbox hosts share one network stack (sandbox/sim_network.c)")
    path = wildcard_config(sb, tmp_path, router_package, SGLANG_SIM_TIME_SCALE="0.05")
    code, doc = cli_json(capsys, "-c", str(path), "plan", "--json")
    assert code == 0
    assert doc["fleet"]["router"]["workers"] == {h: worker_url(sb, h) for h in HOSTS}
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    preflight = doc["fleet"]["phases"][0]
    assert all(f"{h} {worker_url(sb, h)}" in preflight["detail"] for h in HOSTS), preflight
    workers = router_workers(sb)
    assert sorted(w["url"] for w in workers) == sorted(worker_url(sb, h) for h in HOSTS)
    assert all(w["is_healthy"] for w in workers), workers
    before = {h: generate_lines(sb, h) for h in HOSTS}
    for _ in range(6):
        assert generate_via_router(sb)["text"]
    after = {h: generate_lines(sb, h) for h in HOSTS}
    assert all(after[h] > before[h] for h in HOSTS), (before, after)  # all three serve, not one
    old = {h: server_pid(sb, h) for h in HOSTS}
    for host in HOSTS:
        new_checkpoint(sb, host)
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=3, max_new_tokens=512) as client:
        time.sleep(0.3)
        code, doc = cli_json(capsys, "-c", str(path), "restart", "--serial", "1", "--json")
        time.sleep(0.3)
    assert code == 0, summary(doc)
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert client.stats.ok >= 10, client.stats.ok
    assert all(server_pid(sb, h) != old[h] for h in HOSTS)
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in HOSTS)


def router_pid(sandbox) -> int:
    return int(sandbox.run("sb1", f"cat ~/.deployctl/router/{ROUTER_PORT}/router.pid").stdout)


def test_a_router_killed_mid_roll_stops_it_exit_14_untouched_replicas_serve_and_the_restart_has_them_all(
        clean_sandbox, tmp_path, capsys, router_package):
    import threading

    from deploy.base.errors import ExitCode
    from tests.integration.helpers import wait_until
    from tests.integration.test_fleet import health

    sb = clean_sandbox
    path = fleet_config(sb, tmp_path, package=router_package)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    old = {h: server_pid(sb, h) for h in HOSTS}
    first_router = router_pid(sb)
    for host in HOSTS:
        new_checkpoint(sb, host)
    killed: list[str] = []

    def kill_router_once_sb2_is_out():
        # batch 1 (sb1) redeployed and back, batch 2 (sb2) taken out: the router dies (by its PID)
        def sb2_out() -> bool:
            try:
                healthy = {w["url"] for w in router_workers(sb) if w["is_healthy"]}
            except OSError:
                return False
            # the router's answer first: it is one HTTP request, the PID file one ssh command (10 polls a second)
            return worker_url(sb, "sb2") not in healthy and server_pid(sb, "sb1") != old["sb1"]
        try:
            wait_until(sb2_out, timeout=240, interval=0.1, what="batch 2 taken out of the router")
        except AssertionError as exc:
            killed.append(f"never: {exc}")
            return
        killed.append(sb.run("sb1", f"kill -9 {first_router}").stderr or "killed")

    killer = threading.Thread(target=kill_router_once_sb2_is_out, daemon=True)
    killer.start()
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--serial", "1", "--json")
    killer.join(timeout=30)
    assert killed == ["killed"], killed
    assert code == ExitCode.ROUTER_LOST, summary(doc)
    phases = {p["phase"]: p for p in doc["fleet"]["phases"]}
    failed = [p for p in doc["fleet"]["phases"] if p["status"] == "failed"]
    assert failed and failed[0]["exit_code"] == ExitCode.ROUTER_LOST, failed
    assert "router" in failed[0]["detail"] and ("died" in failed[0]["detail"]), failed[0]
    assert "\x1b" not in doc["fleet"]["error"]
    # the roll stopped before the next removal: batch 3 untouched, serving what it served
    assert phases["batch 3/3 router-remove sb3"]["status"] == "not-run"
    assert phases["batch 3/3 redeploy sb3"]["status"] == "not-run"
    assert server_pid(sb, "sb3") == old["sb3"] and health(sb, "sb3") == 200
    # the router was started again with EVERY healthy replica, sb1 (redeployed in batch 1) included
    assert router_pid(sb) != first_router
    workers = router_workers(sb)
    assert sorted(w["url"] for w in workers) == sorted(worker_url(sb, h) for h in HOSTS), workers
    assert all(w["is_healthy"] for w in workers), workers
    for _ in range(3):
        assert generate_via_router(sb)["text"]
    # the host switches packages (router.python now has the other one): gpu-status and doctor name
    # the package the running router is, and the installed one
    import yaml

    from tests.integration.test_fleet import ROUTER_PYTHONS

    other = next(p for p in ROUTER_PYTHONS if p != router_package)
    config = yaml.safe_load(path.read_text())
    config["runs"][0]["router"]["python"] = str(ROUTER_PYTHONS[other])
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    [router] = doc["routers"]
    assert router["running_package"] == router_package and router["package"]["name"] == other, router
    assert f"installed for router.python: {other}" in router["package_text"]
    code, doc = cli_json(capsys, "-c", str(path), "doctor", "--json")
    checks = {c["name"]: c for c in next(h for h in doc["hosts"] if h["host"] == "sb1")["checks"]}
    assert checks["router-running"]["status"] == "warn" and router_package in checks["router-running"]["reason"]
