"""One desired deployment (deploy/host/deployment.py, issue 25): what launch records is what converge,
the fleet's probe, a node group and ``deployctl status`` compare with, the doctor's decisions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from deploy.verbs import status
from deploy.config.models import Host, Run
from deploy.facts import status as facts
from deploy.facts.server import ServerState
from deploy.host.deployment import DesiredDeployment, desired_deployment, recorded_draft_quantization
from deploy.host.records import DeploymentRecord
from deploy.steps import converge, launch
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory

HOST = Host(name="gpu-a", address="10.0.0.1", state_dir="/var/lib/deployctl")
RUN = Run(name="r", hosts=["gpu-a"], base_model="/m/awq", drafter="/d", draft_tokens=16, env={"HF_TOKEN": "x"})
PACKAGE = Path(__file__).resolve().parents[2] / "deploy"


def launched(run: Run = RUN, quantization: str | None = "unquant") -> DeploymentRecord:
    """The deployment.json the launch step writes (its own record builder), with the PID and log."""
    ctx = StepContext(host=HOST, run=run, settings=launch.Settings(step="launch"), conn=None, launch_stamp="s",
                      memory=StepMemory(drafter_path="/var/lib/deployctl/drafters/ab", drafter_fingerprint="ab" * 32,
                                        sglang_version="0.5.23", draft_quantization=quantization))
    return launch.launch_record(ctx, "2026-12-01T00:00:00+00:00").but(pid=4242)


def reading(record: DeploymentRecord) -> facts.HostStatus:
    live = facts.Live(accept_length=3.0, accept_source="m", output_tok_s=None, throughput_source="m",
                      throughput_comparable=False, server_gen_tok_s=None, running=0, queued=0, traffic=False,
                      window_s=2.0, source="metrics")
    return facts.HostStatus(pid=4242, alive=True, health=200, health_error=None, uptime_s=1.0, deployment=record,
                            drafter_fingerprint="ab" * 32, drafter_path=record.drafter_path, draft_tokens=16,
                            sglang_version="0.5.23", live=live, last_good=None, probe=None, notes=[])


def test_status_of_a_quantized_target_deployment_says_configured():
    # issue 25: status rebuilt the argv without the doctor's --speculative-draft-model-quantization
    # decision: every quantized target showed "configured: no: argv" and `configured 0` in Prometheus
    record = launched()
    assert "--speculative-draft-model-quantization" in record.argv and record.draft_quantization == "unquant"
    assert status.configured(RUN, HOST, reading(record)) == (True, [])
    text = status.prom_text(RUN, [status.HostReading(HOST, reading(record), configured=True)], now=1.0)
    assert 'deployctl_status_configured{host="gpu-a",run="r"} 1' in text


def test_a_record_from_before_the_field_reads_the_decision_from_its_argv():
    record = launched().without("draft_quantization")
    assert recorded_draft_quantization(record, RUN) == "unquant"
    assert status.configured(RUN, HOST, reading(record)) == (True, [])
    # the user's own flag in extra_args is not a decision of the doctor's: passed as written
    own = RUN.model_copy(update={"extra_args": ["--speculative-draft-model-quantization", "unquant"]})
    mine = launched(own, None).without("draft_quantization")
    assert recorded_draft_quantization(mine, own) is None and status.configured(own, HOST, reading(mine)) == (True, [])


@pytest.mark.parametrize("change,why", [
    ({"draft_tokens": 10}, "draft tokens 16 (configured 10)"),
    ({"env": {"HF_TOKEN": "y"}}, "environment"),
    ({"base_model": "/m/other"}, "argv"),
    ({"name": "other"}, "deployed by run 'r'"),
])
def test_status_still_names_what_changed(change, why):
    run = RUN.model_copy(update=change)
    assert status.configured(run, HOST, reading(launched()))[1][0] == why


def test_converge_and_the_probe_judge_with_the_launchs_own_record():
    record = launched()
    desired = desired_deployment(RUN, HOST, drafter_path="/var/lib/deployctl/drafters/ab", drafter_fingerprint="ab" * 32,
                                 sglang_version="0.5.23", draft_quantization="unquant")
    assert desired.runs_in(record) and desired.record() == record.without("pid", "log", "launched_at")
    assert converge.would_converge(desired, ServerState(4242, True, 200, None, record)) == (True, "already running as desired")
    # the doctor's decision is part of the argv: dropping it is a change (the probe once forgot it)
    plain = desired_deployment(RUN, HOST, drafter_path="/var/lib/deployctl/drafters/ab", drafter_fingerprint="ab" * 32,
                               sglang_version="0.5.23")
    assert plain.differences(record) == ["argv"]


def test_a_rollback_relaunches_the_last_good_record_exactly():
    good = launched()
    again = DesiredDeployment.of_record(good)
    assert again.record() == good.without("pid", "log", "launched_at")


def test_status_of_a_node_group_compares_rank_0_with_its_multi_node_flags():
    from deploy.fleet.nodes import dist_init_addr, node_run

    b = Host(name="gpu-b", address="10.0.0.2", state_dir="/var/lib/deployctl")
    run = RUN.model_copy(update={"hosts": [], "nodes": ["gpu-a", b.name]})
    rank0 = node_run(run, 0, 2, dist_init_addr(run, HOST))
    record = launched(rank0)
    assert status.configured(run, HOST, reading(record)) == (True, [])
    wrong = launched(node_run(run, 1, 2, dist_init_addr(run, HOST)))
    assert status.configured(run, HOST, reading(wrong)) == (False, ["argv"])


def _callers(name: str) -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if called == name:
                    found.add(str(path.relative_to(PACKAGE)))
    return found


@pytest.mark.parametrize("name", ["sglang_argv", "env_hash"])
def test_what_a_run_launches_is_computed_in_one_place(name):
    # issue 25: launch, the fleet's probe (rebuilding the steps' memory by hand) and status each built it
    assert _callers(name) == {"host/deployment.py"}
