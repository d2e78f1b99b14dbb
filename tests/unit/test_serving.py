"""What a host serves, decided once (deploy/engine/serving.py), and the refusals that used to claim it (issue 17)."""

from __future__ import annotations

import time

import pytest

from deploy.doctor.checks import Check
from deploy.facts.server import RunSnapshot, ServerState
from deploy.engine.serving import decide
from deploy.host.records import DeploymentRecord, LastGood
from deploy.steps.doctor import checkpoint_invalid, left_as_it_was

GOOD = LastGood(argv=["python3", "-m", "sglang.launch_server"], drafter_fingerprint="f1", env_hash="e",
                sglang_version="0.5.11")
OTHER = GOOD.but(drafter_fingerprint="f2")


def restored(pid: int) -> DeploymentRecord:
    return DeploymentRecord(argv=["python3", "-m", "sglang.launch_server"], pid=pid)


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

from deploy.engine.outcome import serving_of, verified_pid  # noqa: E402
from deploy.engine.records import HostReport, RunOptions, StepRecord  # noqa: E402
from deploy.steps.memory import StepMemory  # noqa: E402

from tests.fixtures import LOOPBACK_HOST as HOST  # noqa: E402


def test_a_host_whose_steps_never_ran_is_not_run_never_ok():
    report = HostReport(HOST, steps=[StepRecord("doctor", "not-run"), StepRecord("launch", "not-run")])
    assert report.outcome == "not-run" and report.ok is False and report.to_dict()["ok"] is False
    assert HostReport(HOST, steps=[StepRecord("doctor", "ok")]).ok is True


def test_verified_pid_is_the_runs_own_or_the_rollbacks():
    verified = HostReport(HOST, steps=[StepRecord("verify-acceptance", "ok")])
    assert verified_pid(verified, StepMemory(pid=7)) == 7
    unverified = HostReport(HOST, steps=[StepRecord("verify-acceptance", "failed")])
    assert verified_pid(unverified, StepMemory(pid=7)) is None
    assert verified_pid(unverified, StepMemory(pid=7, restored=restored(9))) == 9


def test_the_report_json_and_history_carry_the_same_answer():
    from deploy.local import history

    report = HostReport(HOST, steps=[StepRecord("stop-stale", "ok"), StepRecord("wait-ready", "failed")])
    report.serving = serving_of(report, StepMemory(pid=42), RunOptions(command="up"),
                                state(status=503, record=OTHER))
    assert report.to_dict()["serving"]["state"] == "unverified"
    [row] = history.records_for("up", "r", [report])
    assert row["serving"] == "unverified"


# --- issue 28: every path that ends after a failed verification headlines only what THIS run verified ---

LOW = "kimi-a: accept length 1.40 < 1.5 (minimum)"


def _steps(*pairs):
    return [StepRecord(name, status, detail=LOW if name == "verify-acceptance" and status == "failed" else "")
            for name, status in pairs]


CONVERGED = _steps(("converge", "ok"), ("stop-stale", "skipped"), ("launch", "skipped"), ("verify-acceptance", "failed"))
LAUNCHED = _steps(("converge", "ok"), ("stop-stale", "ok"), ("launch", "ok"), ("verify-acceptance", "failed"))
RB_VERIFY_FAILED = _steps(("stop-stale", "ok"), ("launch", "ok"), ("wait-ready", "ok"), ("verify-acceptance", "failed"))
RB_NOT_READY = _steps(("stop-stale", "ok"), ("launch", "ok"), ("wait-ready", "failed"))
RB_OK = _steps(("stop-stale", "ok"), ("launch", "ok"), ("wait-ready", "ok"), ("verify-acceptance", "ok"))


@pytest.mark.parametrize("steps, rollback, memory, server, expected, fragment", [
    # the case: unchanged checkpoint, acceptance 1.40 on the host, no rollback: never "untouched"
    (CONVERGED, [], {"pid": 42, "converged": True}, state(record=GOOD), ("unverified", 42),
     "failed verification in this run: kimi-a: accept length 1.40"),
    # a new deployment that failed verification, left running (--no-rollback)
    (LAUNCHED, [], {"pid": 42, "launched": True}, state(record=OTHER), ("unverified", 42), "failed verification"),
    # the rollback relaunched the last good deployment (pid 43) and its verification failed too
    (LAUNCHED, RB_VERIFY_FAILED, {"pid": 42, "launched": True, "rollback_pid": 43}, state(pid=43, record=GOOD),
     ("unverified", 43), "failed verification in this run"),
    (CONVERGED, RB_VERIFY_FAILED, {"pid": 42, "converged": True, "rollback_pid": 43}, state(pid=43, record=GOOD),
     ("unverified", 43), "failed verification in this run"),
    # the rollback relaunched it and it never became ready: launched by this run, not verified
    (LAUNCHED, RB_NOT_READY, {"pid": 42, "launched": True, "rollback_pid": 43}, state(pid=43, status=503, record=GOOD),
     ("unverified", 43), "launched by this run, not verified"),
    # restored and verified by the rollback: serving, verified in this run
    (LAUNCHED, RB_OK, {"pid": 42, "launched": True, "rollback_pid": 43, "restored": restored(43)},
     state(pid=43, record=GOOD), ("serving", 43), "verified in this run"),
    (CONVERGED, RB_OK, {"pid": 42, "converged": True, "rollback_pid": 43, "restored": restored(43)},
     state(pid=43, record=GOOD), ("serving", 43), "verified in this run"),
    # the server's state could not be read after the failure
    (CONVERGED, [], {"pid": 42, "converged": True}, None, ("unknown", None), "reading the server's state failed"),
    # nothing runs any more
    (LAUNCHED, RB_NOT_READY, {"pid": 42, "launched": True, "rollback_pid": 43}, state(alive=False), ("nothing", None),
     ""),
])
def test_a_failed_verification_is_never_headlined_as_a_verified_deployment(steps, rollback, memory, server, expected,
                                                                            fragment):
    from deploy.local import history

    snapshot = RunSnapshot(time.monotonic(), "3.11", {}, state(record=GOOD), GOOD)
    report = HostReport(HOST, steps=list(steps), rollback=list(rollback))
    report.serving = serving_of(report, StepMemory(**memory, snapshot=snapshot), RunOptions(command="nightly"), server,
                                None if server is not None else "timed out")
    assert (report.serving.state, report.serving.pid) == expected and fragment in report.serving.detail
    assert "untouched" not in report.serving.headline()
    # one decision: the text headline, the JSON and the history row say the same
    assert report.to_dict()["serving"]["state"] == expected[0]
    [row] = history.records_for("nightly", "r", [report])
    assert row["serving"] == expected[0]
    if expected[0] != "serving":
        assert "IS SERVING a verified" not in report.serving.headline()
