"""Fleets, pure parts: router/nodes config, the router's and SGLang's answers parsed strictly,
batches, the router argv, the multi-node flags."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config import load_config
from deploy.config.models import Host, Run
from deploy.base.errors import ConfigError, ExitCode, RemoteOutputError
from deploy.fleet.nodes import dist_init_addr, group_fields, matching_group, node_run
from deploy.host.records import DeploymentRecord, LastGood
from deploy.facts.router import Worker
from deploy.fleet.rollout import batches, check_serial, default_serial
from deploy.fleet.router_package import RouterPackage
from deploy.fleet.router import (FLEET_OPS, modern_api, parse_loads, parse_workers, router_argv, start_command,
                                 worker_url)
from deploy.fleet.rollout import router_spared as with_router_spared
from deploy.engine.playbook import load_playbook

from tests.fixtures import fleet_config  # noqa: E402

BASE = fleet_config()


def load(tmp_path, extra: str):
    path = tmp_path / "deployctl.yaml"
    path.write_text(BASE + extra)
    return load_config(path)


def test_router_config_defaults(tmp_path):
    config = load(tmp_path, "    group: g\n    router: {host: a}\n")
    spec = config.runs[0].router
    assert (spec.port, spec.policy, spec.python) == (30080, "cache_aware", "python3")


BAD_ROUTER = [
    ("    group: g\n    router: {host: zz}\n", "unknown host 'zz'"),
    ("    group: g\n    router: {host: a, policy: fastest}\n", "policy"),
    ("    group: g\n    router: {host: a, port: 0}\n", "port"),
    ("    group: g\n    router: {host: a, hosts: [b]}\n", "hosts"),
    ("    group: g\n    router: {host: a, python: '-x'}\n", "starts with '-'"),
] + [
    # every option deployctl sets for the router, written whole, with '=', or abbreviated
    (f"    group: g\n    router: {{host: a, extra_args: ['{arg}']}}\n", "deployctl sets")
    for flag in ("--host", "--port", "--policy", "--worker-urls")
    for arg in (flag, flag + "=x", flag[:-1] if len(flag) > 6 else flag)
] + [
    ("    nodes: [a]\n", "at least 2"),
    ("    nodes: [a, a]\n", "twice"),
    ("    nodes: [a, zz]\n", "unknown host 'zz'"),
    ("    nodes: [a, b]\n    group: g\n", "exactly one of"),
    ("    nodes: [a, b]\n    router: {host: c}\n", "not supported yet"),
    ("    nodes: [a, b]\n    dist_init_port: 70000\n", "dist_init_port"),
]


@pytest.mark.parametrize("extra,fragment", BAD_ROUTER)
def test_bad_fleet_config_is_refused_naming_the_field(tmp_path, extra, fragment):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra)
    assert fragment in str(err.value), str(err.value)
    assert err.value.exit_code == ExitCode.CONFIG


WORKERS_03 = {"workers": [{"id": "019d", "url": "http://10.0.0.1:30000", "is_healthy": True, "load": 0,
                           "model_id": "/m", "priority": 50}], "total": 1}


#: captured from sglang-router 0.3.2 (GET /workers after POST /workers {"url": ...}), addresses changed
CAPTURED_WORKERS = (
    '{"workers":[{"id":"019df326-c7b2-48a1-b115-246a4750851a","url":"http://127.0.0.1:38001","model_id":"/m",'
    '"priority":50,"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"HTTP",'
    '"metadata":{"dp_size":"1","model_path":"/m","tp_size":"8"},"disable_health_check":false},'
    '{"id":"eada6157-f8b4-4316-af40-c4b4f21944ff","url":"http://127.0.0.1:38002","model_id":"/m","priority":50,'
    '"cost":1.0,"worker_type":"regular","is_healthy":true,"load":0,"connection_mode":"HTTP","metadata":'
    '{"tp_size":"8","dp_size":"1","model_path":"/m"},"disable_health_check":false}],"total":2,'
    '"stats":{"prefill_count":0,"decode_count":0,"regular_count":2}}')


def test_parse_workers_captured_from_the_real_router():
    workers = parse_workers(CAPTURED_WORKERS, "a")
    assert [(w.id[:8], w.url, w.is_healthy) for w in workers] == [
        ("019df326", "http://127.0.0.1:38001", True), ("eada6157", "http://127.0.0.1:38002", True)]


def test_parse_workers_both_apis():
    assert parse_workers(json.dumps(WORKERS_03), "a") == [
        Worker(id="019d", url="http://10.0.0.1:30000", is_healthy=True, load=0)]
    assert parse_workers(json.dumps({"urls": ["http://x:1"]}), "a") == [
        Worker(id="http://x:1", url="http://x:1", is_healthy=True)]


@pytest.mark.parametrize("body", [
    "", "null", "[]", "{}", '{"workers": 3}', '{"workers": [{"url": "x"}]}', '{"workers": [{"id": 1}]}',
    '{"urls": 5}', "<html>502 Bad Gateway</html>", "[" * 5000 + "]" * 5000,
])
def test_parse_workers_refuses_anything_else(body):
    with pytest.raises(RemoteOutputError):
        parse_workers(body, "a")


def test_parse_loads_sums_running_and_waiting_over_dp_ranks():
    body = {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1},
                      {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 0}]}
    assert parse_loads(json.dumps(body), "w") == 3
    assert parse_loads(json.dumps({"loads": [{"num_running_reqs": 0}]}), "w") == 0


@pytest.mark.parametrize("body", ["", "{}", '{"loads": []}', '{"loads": [{}]}', '{"loads": [{"num_running_reqs": "x"}]}',
                                  '{"loads": {"num_running_reqs": 0}}', "Not Found"])
def test_parse_loads_refuses_anything_else(body):
    # an answer we cannot read must never count as "drained"
    with pytest.raises(RemoteOutputError):
        parse_loads(body, "w")


@pytest.mark.parametrize("version,modern", [("0.3.2", True), ("0.3.0", True), ("1.0.0", True), ("0.2.4", False),
                                            ("0.1.9", False)])
def test_management_api_by_version(version, modern):
    assert modern_api(version) is modern


def test_management_api_refuses_a_non_version():
    with pytest.raises(RemoteOutputError):
        modern_api("dev")


def hosts(n: int) -> list[Host]:
    return [Host(name=f"h{i}", address=f"10.0.0.{i + 1}") for i in range(n)]


def test_batches_and_default_serial():
    hs = hosts(5)
    assert [[h.name for h in b] for b in batches(hs, 2)] == [["h0", "h1"], ["h2", "h3"], ["h4"]]
    run = Run(name="r", hosts=["h0"], base_model="/m", drafter="/d")
    assert default_serial(run, hs) == 5
    routed = Run.model_validate(run.model_dump() | {"router": {"host": "h0"}})
    assert default_serial(routed, hs) == 1
    check_serial(4, hs, routed, allow_downtime=False)
    with pytest.raises(Exception, match="--allow-downtime"):
        check_serial(5, hs, routed, allow_downtime=False)
    check_serial(5, hs, routed, allow_downtime=True)


def test_router_argv_and_start_command_quote_everything():
    run = Run.model_validate({"name": "r", "hosts": ["h0"], "base_model": "/m", "drafter": "/d",
                              "router": {"host": "h0", "port": 31000, "policy": "round_robin",
                                         "python": "/opt/router venv/bin/python", "extra_args": ["--log-level", "warn"]}})
    h0 = hosts(1)[0]
    argv = router_argv(run.router, h0, [worker_url(run, h0)], RouterPackage("sglang-router", "0.3.2"))
    assert argv[:3] == ["/opt/router venv/bin/python", "-m", "sglang_router.launch_router"]
    assert router_argv(run.router, h0, [], RouterPackage("smg", "1.13.0"))[2] == "smg.launch_router"
    # plan, before the router host said which package it has
    assert router_argv(run.router, h0, [])[2] == "<smg.launch_router|sglang_router.launch_router>"
    assert argv[argv.index("--worker-urls") + 1:] == ["http://10.0.0.1:30000"]
    assert argv[argv.index("--port") + 1] == "31000"
    command = start_command(run.router, h0, ["http://10.0.0.1:30000"], "router-x.log")
    assert "'/opt/router venv/bin/python'" in command and "setsid nohup" in command


def test_stop_stale_spares_the_router_only_when_there_is_one():
    run = Run(name="r", hosts=["h0"], base_model="/m", drafter="/d")
    playbook = load_playbook("restart")
    assert with_router_spared(playbook, run) is playbook
    routed = Run.model_validate(run.model_dump() | {"router": {"host": "h0"}})
    spared = with_router_spared(playbook, routed)
    exclude = next(s for s in spared.steps if s.name == "stop-stale").settings.exclude
    assert "sglang::router" in exclude and "sglang_router" in exclude and "unattended-upgrade" in exclude
    assert "smg::router" in exclude and "smg.launch_router" in exclude


def test_node_flags_are_the_same_but_the_rank():
    run = Run(name="r", nodes=["h0", "h1"], base_model="/m", drafter="/d", port=30000)
    addr = dist_init_addr(run, hosts(1)[0])
    assert addr == "10.0.0.1:30001"
    a, b = node_run(run, 0, 2, addr), node_run(run, 1, 2, addr)
    assert a.extra_args == ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:30001"]
    assert b.extra_args == ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:30001"]


def test_fleet_ops_helper_refuses_bad_usage_and_reads_a_missing_pidfile(tmp_path):
    out = subprocess.run([sys.executable, str(FLEET_OPS), "nonsense"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage" in out.stderr
    out = subprocess.run([sys.executable, str(FLEET_OPS), "stop-router", str(tmp_path / "none.pid")],
                         capture_output=True, text=True)
    doc = json.loads(out.stdout)
    assert doc["stopped"] is False and "no router running" in doc["note"]
    # a PID file naming some other process (this test) is never signalled
    pidfile = tmp_path / "r.pid"
    pidfile.write_text(f"{__import__('os').getpid()}\n")
    out = subprocess.run([sys.executable, str(FLEET_OPS), "stop-router", str(pidfile)], capture_output=True, text=True)
    assert json.loads(out.stdout)["stopped"] is False


def test_fleet_ops_poll_prints_a_line_per_round_until_its_reader_closes_and_refuses_odd_intervals(tmp_path):
    """The host-side loop of deployctl's router waits: a JSON line per round (a refused connection is
    an answer too), ended at once by EOF on its stdin (deployctl shuts its side of the channel and waits
    for the exit) or by its reader going away; an interval outside 0.05-5 s is a usage error."""
    import socket

    with socket.socket() as held:  # a port nobody listens on: every round answers "refused"
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    argv = [sys.executable, str(FLEET_OPS), "poll", "0.05", "members", str(tmp_path / "none.pid"),
            f"http://127.0.0.1:{port}/workers", "--timeout", "2"]
    lines = []
    for end in ("stdin", "stdout"):
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines += [json.loads(proc.stdout.readline()) for _ in range(3)]
            getattr(proc, end).close()      # deployctl decided: EOF on the loop's stdin (or its channel gone)
            assert proc.wait(timeout=20) == 0 and proc.stderr.read() == "", end
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for line in lines:
        assert line["state"] == {"pid": None, "alive": False}
        assert line["workers"]["status"] is None and line["workers"]["error_kind"] == "refused"
    for interval in ("0", "0.01", "6", "nan", "x"):
        out = subprocess.run([sys.executable, str(FLEET_OPS), "poll", interval, "request", "GET", "http://127.0.0.1:1/"],
                             capture_output=True, text=True, timeout=20)
        assert out.returncode == 2 and "usage" in out.stderr and out.stdout == "", interval
    out = subprocess.run([sys.executable, str(FLEET_OPS), "poll", "1", "request", "POST", "http://127.0.0.1:1/"],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 2                                  # a loop only ever reads


def _router_scalar_cases():
    from deploy.config.models import RouterSpec, accepts_bool

    cases = []
    for name, info in RouterSpec.model_fields.items():
        if name == "host" or accepts_bool(info.annotation):
            continue
        cases += [(name, word) for word in ("yes", "off")]
        if "float" in repr(info.annotation):
            cases += [(name, word) for word in (".nan", ".inf")]
    return cases


@pytest.mark.parametrize("field,word", _router_scalar_cases())
def test_router_fields_refuse_yaml_booleans_and_non_finite_numbers(tmp_path, field, word):
    # generated from RouterSpec's own fields: one added later is covered too
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"    group: g\n    router: {{host: a, {field}: {word}}}\n")
    assert "router" in str(err.value) and field in str(err.value), str(err.value)


def group_records(drafter_fp: str = "fp-old", addr: str = "10.0.0.1:30001", names=("h0", "h1")) -> list[dict]:
    """Last good records of one two-node group deployment, as record-good writes them."""
    run = Run(name="r", nodes=list(names), base_model="/m", drafter="/d", port=30000)
    deployments = []
    for rank, name in enumerate(names):
        argv = ["python3", "-m", "sglang.launch_server", "--host", f"10.0.0.{rank + 1}",
                *node_run(run, rank, len(names), addr).extra_args]
        deployments.append({"argv": argv, "drafter_fingerprint": drafter_fp, "drafter_path": f"/store/{drafter_fp}",
                            "env_hash": "e", "sglang_version": "0.5.4", "pid": 100 + rank})
    fields = group_fields([DeploymentRecord.model_validate(d) for d in deployments], list(names), addr)
    return [d | {"node_group": f.model_dump(), "metrics": {"accept_length": 3.0}} for d, f in zip(deployments, fields)]


def read(records: list) -> list[LastGood | None]:
    """The records as the nodes' last-good.json are read (deploy/host/records.py)."""
    return [None if r is None else LastGood.model_validate(r) for r in records]


def test_node_group_records_of_one_group_deployment_match():
    records = group_records()
    found, why = matching_group(read(records), ["h0", "h1"])
    assert found == read(records) and why == ""
    assert records[0]["node_group"]["id"] == records[1]["node_group"]["id"]
    # another drafter is another group deployment
    assert group_records("fp-new")[0]["node_group"]["id"] != records[0]["node_group"]["id"]
    # pid, metrics, times are bookkeeping: the same deployment relaunched is the same group
    relaunched = copy.deepcopy(records)
    for r in relaunched:
        r["pid"] += 50
    assert matching_group(read(relaunched), ["h0", "h1"])[0] == read(relaunched)


def _missing(records):
    records[1] = None


def _single_host(records):
    del records[1]["node_group"]


def _newer_group_on_rank1(records):
    records[1] = group_records("fp-new")[1]


def _other_hosts(records):
    records[:] = group_records(names=("h0", "h2"))


def _swapped_ranks(records):
    records.reverse()


def _argv_rank_tampered(records):
    argv = records[1]["argv"]
    argv[argv.index("--node-rank") + 1] = "0"


def _other_dist_init(records):
    records[1] = group_records(addr="10.0.0.1:40000")[1]


def _forged_id(records):
    records[1]["drafter_fingerprint"] = "fp-new"  # same group id, other bytes


def _three_nodes(records):
    records[:] = group_records(names=("h0", "h1", "h2"))[:2]


MISMATCHES = {f.__name__[1:]: f for f in (_missing, _single_host, _newer_group_on_rank1, _other_hosts, _swapped_ranks,
                                          _argv_rank_tampered, _other_dist_init, _forged_id, _three_nodes)}


@pytest.mark.parametrize("mutation", sorted(MISMATCHES))
def test_node_group_records_that_are_not_one_group_deployment_are_refused(mutation):
    records = group_records()
    MISMATCHES[mutation](records)
    found, why = matching_group(read(records), ["h0", "h1"])
    assert found is None, mutation
    assert why and ("h0" in why or "h1" in why or "group deployment" in why or "dist-init" in why), why
