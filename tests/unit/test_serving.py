"""What a host serves, decided once (deploy/serving.py), and the refusals that used to claim it (issue 17)."""

from __future__ import annotations

import time

import pytest

from deploy.doctor.checks import Check
from deploy.facts.server import RunSnapshot, ServerState
from deploy.serving import decide
from deploy.steps.doctor import checkpoint_invalid, left_as_it_was

GOOD = {"argv": ["python3", "-m", "sglang.launch_server"], "drafter_fingerprint": "f1", "env_hash": "e",
        "sglang_version": "0.5.11"}
OTHER = dict(GOOD, drafter_fingerprint="f2")


def state(alive=True, pid=42, status=200, record=None, error=None):
    return ServerState(pid if alive else None, alive, status, error, record)


@pytest.mark.parametrize("kw,expected", [
    ({"verified_pid": 42}, ("serving", 42)),
    ({"verified_pid": None, "down": True}, ("nothing", None)),
    ({"verified_pid": None}, ("unknown", None)),
    ({"verified_pid": None, "reached": False, "why_unreached": "refused"}, ("unknown", None)),
    ({"verified_pid": None, "state_error": "timed out"}, ("unknown", None)),
    ({"verified_pid": None, "state": state(alive=False)}, ("nothing", None)),
    # a network freeze: the new server is still loading (503), nothing verified it
    ({"verified_pid": None, "state": state(status=503, record=OTHER), "stopped": True}, ("unverified", 42)),
    ({"verified_pid": None, "state": state(status=None, error="refused", record=OTHER), "stopped": True},
     ("unverified", 42)),
    ({"verified_pid": 42, "state": state()}, ("serving", 42)),
    ({"verified_pid": 42, "state": state(status=503)}, ("unverified", 42)),
    ({"verified_pid": 7, "state": state(record=OTHER), "stopped": True}, ("unverified", 42)),
    # refused before the stop: the old server, untouched, is the last good deployment
    ({"verified_pid": None, "state": state(record=GOOD), "last_good": GOOD}, ("serving", 42)),
    ({"verified_pid": None, "state": state(record=OTHER), "last_good": GOOD}, ("unverified", 42)),
    ({"verified_pid": None, "state": state(record=GOOD), "last_good": GOOD, "stopped": True}, ("unverified", 42)),
])
def test_one_decision_states_only_what_is_known(kw, expected):
    serving = decide(**kw)
    assert (serving.state, serving.pid) == expected
    headline = serving.headline()
    assert {"serving": "IS SERVING a verified", "unverified": "SERVES NO VERIFIED DEPLOYMENT",
            "nothing": "THE HOST IS SERVING NOTHING", "unknown": "UNKNOWN"}[serving.state] in headline
    assert serving.to_dict()["state"] == serving.state


def snap(server: ServerState) -> RunSnapshot:
    return RunSnapshot(time.monotonic(), "3.11", {}, server, None)


@pytest.mark.parametrize("server,fragment", [
    (state(), "keeps serving (pid 42)"), (state(alive=False), "no SGLang server of deployctl's was running"),
    (state(status=503), "(pid 42, /health 503 on the run's port) is left running, untouched"), (state(status=None), "/health no answer"),
])
def test_a_refusal_says_what_it_leaves_running(server, fragment):
    assert fragment in left_as_it_was(snap(server))
    assert "keeps serving" not in left_as_it_was(None)


@pytest.mark.parametrize("failed,invalid", [
    ([Check("drafter-weights", "fail", "cannot read the drafter's safetensors headers: model.safetensors: truncated")], True),
    ([Check("drafter", "fail", "~/d/config.json: missing")], True),
    ([Check("drafter", "fail", "x"), Check("drafter-weights", "fail", "cannot read the drafter's safetensors headers")], True),
    ([Check("drafter-weights", "fail", "dropped: model.midlayer.x")], False),
    ([Check("drafter-weights", "fail", "cannot read the drafter's safetensors headers"), Check("gpu-memory", "fail", "x")],
     False),
    ([], False),
])
def test_a_checkpoint_still_being_written_is_exit_6_not_8(failed, invalid):
    assert checkpoint_invalid(failed) is invalid


# --- the engine's use of it ------------------------------------------------------------------------

from deploy.config.models import Host  # noqa: E402
from deploy.engine.outcome import serving_of, verified_pid  # noqa: E402
from deploy.engine.records import HostReport, RunOptions, StepRecord  # noqa: E402
from deploy.steps.memory import StepMemory  # noqa: E402

HOST = Host(name="h", address="127.0.0.1", state_dir="/var/lib/x")


def test_a_host_whose_steps_never_ran_is_not_run_never_ok():
    report = HostReport(HOST, steps=[StepRecord("doctor", "not-run"), StepRecord("launch", "not-run")])
    assert report.outcome == "not-run" and report.ok is False and report.to_dict()["ok"] is False
    assert HostReport(HOST, steps=[StepRecord("doctor", "ok")]).ok is True


def test_verified_pid_is_the_runs_own_or_the_rollbacks():
    verified = HostReport(HOST, steps=[StepRecord("verify-acceptance", "ok")])
    assert verified_pid(verified, StepMemory(pid=7)) == 7
    unverified = HostReport(HOST, steps=[StepRecord("verify-acceptance", "failed")])
    assert verified_pid(unverified, StepMemory(pid=7)) is None
    assert verified_pid(unverified, StepMemory(pid=7, restored={"pid": 9})) == 9


def test_the_report_json_and_history_carry_the_same_answer():
    from deploy import history

    report = HostReport(HOST, steps=[StepRecord("stop-stale", "ok"), StepRecord("wait-ready", "failed")])
    report.serving = serving_of(report, StepMemory(pid=42), RunOptions(command="up"),
                                state(status=503, record=OTHER))
    assert report.to_dict()["serving"]["state"] == "unverified"
    [row] = history.records_for("up", "r", [report])
    assert row["serving"] == "unverified"
