"""The run-level plan (issue 16): a fleet's and a node group's ``plan`` are built from the same
builders their run uses (router calls, multi-node flags), no SSH."""

from __future__ import annotations

from deploy.fleet.router_package import RouterPackage

import json

import pytest

from deploy.cli.main import main
from deploy.fleet.router import OPS_SCRIPT, RouterCalls, RouterHost, fleet_ops_program
from deploy.base.shell import quote

from tests.fixtures import fleet_config  # noqa: E402

BASE = fleet_config()


def plan_json(tmp_path, capsys, extra: str, *argv: str) -> dict:
    path = tmp_path / "deployctl.yaml"
    path.write_text(BASE + extra)
    assert main(["-c", str(path), *(argv or ("plan",)), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("nodes", [["a", "b"], ["a", "b", "c"], ["c", "a"]])
def test_node_group_plan_launches_each_node_with_its_own_rank(tmp_path, capsys, nodes):
    doc = plan_json(tmp_path, capsys, f"    nodes: {json.dumps(nodes)}\n")
    rank0 = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}[nodes[0]]
    assert doc["fleet"]["dist_init_addr"] == f"{rank0}:30001"
    by_host = {h["host"]: h for h in doc["hosts"]}
    for rank, name in enumerate(nodes):
        [argv] = [c["argv"] for s in by_host[name]["steps"] if s["step"] == "launch" for c in s["commands"] if "argv" in c]
        assert argv[-6:] == ["--nnodes", str(len(nodes)), "--node-rank", str(rank), "--dist-init-addr", f"{rank0}:30001"]
        steps = [s["step"] for s in by_host[name]["steps"]]
        assert ("wait-ready" in steps) == (rank == 0) and "record-good" in steps
    phases = [p["phase"] for p in doc["fleet"]["phases"]]
    assert phases.index(f"rank 0 launch {nodes[0]}") < phases.index("ranks 1+ launch " + ",".join(nodes[1:]))
    rollback = doc["fleet"]["phases"][-1]["commands"]
    assert {c["host"] for c in rollback} == set(nodes) and all(c.get("when") for c in rollback)


@pytest.mark.parametrize("serial", ["1", "2"])
def test_fleet_plan_lists_every_router_call_per_batch(tmp_path, capsys, serial):
    doc = plan_json(tmp_path, capsys, "    group: g\n    router: {host: a}\n", "up", "--dry-run", "--serial", serial)
    phases = doc["fleet"]["phases"]
    names = [p["phase"] for p in phases]
    assert names[-1] == "router end-to-end" and len([n for n in names if "redeploy" in n]) == len(doc["fleet"]["batches"])
    removes = [c for p in phases if "router-remove" in p["phase"] for c in p["commands"] if "DELETE" in c["command"]]
    assert sorted(c["description"] for c in removes) == sorted(
        f"remove worker http://10.0.0.{i}:30000" for i in (1, 2, 3))
    # before anything is stopped: the router's package, its port, every worker URL from the router
    # host, and every replica's doctor (issue 18)
    preflight = phases[0]
    assert preflight["phase"].startswith("pre-flight"), [p["phase"] for p in phases]
    words = [c["command"].split(OPS_SCRIPT + " ")[1].split()[0] if "fleet_ops" in c["command"] else c["description"]
             for c in preflight["commands"]]
    assert words[:4] == ["router-packages", "router-state", "ports", "reach"], words
    assert all(f"http://10.0.0.{i}:30000" in preflight["commands"][3]["command"] for i in (1, 2, 3))
    assert sorted(c["host"] for c in preflight["commands"][4:]) == ["a", "b", "c"]
    assert all("doctor" in c["description"] for c in preflight["commands"][4:])
    for phase in phases[1:]:  # every router phase reads the router's state first, through fleet_ops.py
        if "redeploy" not in phase["phase"] and "drain" not in phase["phase"]:
            assert phase["commands"][0]["command"].startswith(f"python3 -I -S -c {OPS_SCRIPT} router-state "), phase
    starts = [c for p in phases for c in p["commands"] if c["description"].startswith("start the router")]
    assert starts and all(c["when"] for c in starts)


class Recorded:
    """The router host's connection: one-shot commands (``check``) and host-side loops (``watch``,
    answered with the same line until the caller decides)."""

    def __init__(self):
        self.commands: list[str] = []
        self.cancelled = None

    ANSWER = {"status": 200, "body": json.dumps({"workers": [
        {"id": "w1", "url": "http://10.0.0.2:30000", "is_healthy": True}], "text": "ok",
        "loads": [{"num_running_reqs": 0}]})}

    def check(self, command, timeout=None, what=""):
        self.commands.append(command)

        class R:
            stdout = json.dumps(self.ANSWER)
        return R()

    def watch(self, command, on_line, *, timeout, cancelled, silence_s=None):
        from types import SimpleNamespace

        self.commands.append(command)
        line = json.dumps({"state": {"alive": True, "pid": 1}, "workers": self.ANSWER} if " members " in command else self.ANSWER)
        for _ in range(20):
            if on_line(line):
                return SimpleNamespace(exit_code=None, stderr="")
        raise AssertionError(f"never decided on {line}")


def test_the_router_host_sends_exactly_the_calls_the_plan_builds(tmp_path, monkeypatch):
    from itertools import count

    from deploy.config.loader import load_config
    from deploy.fleet import router as router_module

    ticks = count()  # each reading of the clock is the next host-side poll, 0.1 s later
    monkeypatch.setattr(router_module.time, "monotonic", lambda: next(ticks) * 0.1)

    path = tmp_path / "deployctl.yaml"
    path.write_text(BASE + "    group: g\n    router: {host: a}\n")
    config = load_config(path)
    run, host = config.runs[0], config.host("a")
    conn = Recorded()
    router = RouterHost(conn, host, run)
    router._package = RouterPackage("sglang-router", "0.3.2")
    url = "http://10.0.0.2:30000"
    router.drain(url, 10)
    router.end_to_end()
    router.workers()
    router.wait_members({url})
    calls, planned = RouterCalls(run.router, host), RouterCalls(run.router, host, planned=True)
    assert conn.commands == [calls.watch_loads(url).command, calls.end_to_end().command, calls.workers(True).command,
                             calls.watch_members(True).command]
    script = quote(fleet_ops_program())
    assert [c.replace(script, OPS_SCRIPT) for c in conn.commands] == [
        planned.watch_loads(url).command, planned.end_to_end().command, planned.workers(True).command,
        planned.watch_members(True).command]
