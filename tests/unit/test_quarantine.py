"""Quarantine (issue 17): a fingerprint that failed on a host is not redeployed by restart/nightly."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from deploy.base.errors import (BenchmarkHarnessFailed, ConnectionFailed, ExitCode, Quarantined, Regression, RemoteCommandFailed,
                           RemoteOutputError, ServerDied, StepTimeout, VerificationFailed)
from deploy.facts import quarantine as facts
from deploy.facts.server import RunSnapshot, ServerState
from deploy.host.records import LastGood
from deploy.engine.playbook import load_playbook
from deploy.steps import quarantine
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory
from deploy.steps.failure_cause import Cause, deployment_stays, failure_cause
from tests.recording import RecordingTransport, Reply

from tests.fixtures import KIMI_HOST as HOST, KIMI_RUN as RUN  # noqa: E402
FP = "ab" * 32
ENTRY = {"failed_at": "2026-11-30T03:15:07+00:00", "verb": "nightly", "run": "r", "exit_code": 11,
         "reason": "wait-ready: server died", "drafter_path": "~/s/drafters/x"}


def record(entries: dict) -> str:
    return json.dumps({"schema": 1, "entries": entries})


def ctx(conn=None, memory=None, **settings) -> StepContext:
    return StepContext(host=HOST, run=RUN, settings=quarantine.Settings(step="quarantine", **settings), conn=conn,
                       launch_stamp="20261129T000000Z", memory=StepMemory() if memory is None else memory)


def snapshot(text: str | None, read: bool = True, good: LastGood | None = None) -> RunSnapshot:
    return RunSnapshot(time.monotonic(), "3.11.7", {}, ServerState(None, False, None, None, None), good,
                       quarantine=text, quarantine_read=read)


def test_a_quarantined_fingerprint_is_refused_naming_it_and_when():
    memory = StepMemory(drafter_fingerprint=FP, snapshot=snapshot(record({FP: ENTRY})))
    conn = RecordingTransport(HOST, [])
    with pytest.raises(Quarantined) as refused:
        quarantine.run(ctx(conn, memory))
    text = str(refused.value)
    assert refused.value.exit_code == ExitCode.QUARANTINED == 13
    assert FP[:16] in text and "2026-11-30T03:15:07" in text and "nothing was stopped" in text
    assert "--retry-failed" in text and "server died" in text
    assert conn.commands == []  # the doctor's command read the record


def test_retry_failed_and_a_changed_checkpoint_deploy():
    memory = StepMemory(drafter_fingerprint=FP, snapshot=snapshot(record({FP: ENTRY})))
    outcome = quarantine.run(ctx(None, memory, retry_failed=True))
    assert outcome.data["retrying"] == FP
    memory = StepMemory(drafter_fingerprint="cd" * 32, snapshot=snapshot(record({FP: ENTRY})))
    assert "not quarantined" in quarantine.run(ctx(None, memory)).detail


def test_without_the_doctors_read_the_step_reads_the_record_itself():
    conn = RecordingTransport(HOST, [Reply("head -c", stdout=record({FP: ENTRY}))])
    with pytest.raises(Quarantined):
        quarantine.run(ctx(conn, StepMemory(drafter_fingerprint=FP)))
    assert conn.commands == [quarantine.read_action(ctx()).command]


@pytest.mark.parametrize("text", [
    "{", "[]", "null", '{"entries": []}', '{"entries": {"x": 1}}', '{"entries": {"x": {}}}',
    '{"entries": {"x": {"failed_at": 3}}}', '{"schema": 1}', "\x1b]0;pwned\x07", "x" * (facts.MAX_BYTES + 10),
    json.dumps({"entries": {"x": {"failed_at": float("nan")}}}),
])
def test_a_record_of_another_shape_is_an_error_naming_the_file_never_nothing_quarantined(text):
    with pytest.raises(RemoteOutputError) as error:
        facts.parse_quarantine(text, "kimi-a", "~/s/quarantine.json")
    assert "~/s/quarantine.json" in str(error.value) and "remove the file" in str(error.value)


@pytest.mark.parametrize("text", [None, "", "\n"])
def test_no_record_quarantines_nothing(text):
    assert facts.parse_quarantine(text, "h", "q").entries == {}


@pytest.mark.parametrize("step,error,converged,good_fp,recorded", [
    ("wait-ready", StepTimeout("never ready"), False, None, True),
    ("wait-ready", ServerDied("exit 1: CUDA out of memory"), False, None, True),
    ("verify-acceptance", VerificationFailed("accept 1.00"), False, "other", True),
    ("regression-gate", Regression("output tok/s 50%"), False, None, True),
    ("benchmark", ServerDied("crashed on the first /generate"), False, None, True),  # the server died: its fault
    # issue 28: a benchmark harness failure is never the checkpoint's
    ("benchmark", BenchmarkHarnessFailed("bench_serving failed (exit 1): FileNotFoundError"), False, None, False),
    ("benchmark", BenchmarkHarnessFailed("only 12 of 16 requests", exit_code=ExitCode.REMOTE_OUTPUT), False, None,
     False),
    ("benchmark", StepTimeout("bench_serving timed out"), False, None, False),
    ("regression-gate", RemoteOutputError("last-good.json: not JSON"), False, None, False),
    ("launch", RemoteCommandFailed("mkdir: Permission denied"), False, None, False),  # the host's
    ("verify-acceptance", ConnectionFailed("connection reset"), False, None, False),
    ("wait-gpus-free", StepTimeout("GPUs busy"), False, None, False),   # the host's fault, not the drafter's
    ("doctor", VerificationFailed("x"), False, None, False),
    ("verify-acceptance", VerificationFailed("x"), True, None, False),  # the running server, not a new deploy
    ("verify-acceptance", VerificationFailed("x"), False, FP, False),   # the last good one: keep deployable
])
def test_which_failures_quarantine_the_fingerprint(step, error, converged, good_fp, recorded):
    memory = StepMemory(drafter_fingerprint=FP, converged=converged, drafter_path="/s/d", launched=not converged,
                        snapshot=snapshot(None, good=LastGood(argv=["x"], drafter_fingerprint=good_fp) if good_fp else None))
    found = quarantine.failure_entry("nightly", "r", step, error, memory, "T")
    assert (found is not None) == recorded
    assert failure_cause(step, error).checkpoints_fault == (recorded or converged or good_fp == FP)
    if found:
        assert found[0] == FP and found[1].exit_code == int(error.exit_code) and str(found[1].reason).startswith(step)
        assert f"({failure_cause(step, error).value})" in str(found[1].reason)


def test_nothing_launched_in_this_run_is_never_quarantined():
    memory = StepMemory(drafter_fingerprint=FP, drafter_path="/s/d", snapshot=snapshot(None))
    assert quarantine.failure_entry("nightly", "r", "wait-ready", StepTimeout("x"), memory, "T") is None


class _Record:
    def __init__(self, name, status):
        self.name, self.status = name, status


@pytest.mark.parametrize("cause,verified,stays", [
    (Cause.HARNESS, True, True), (Cause.HOST, True, True), (Cause.HARNESS, False, False),
    (Cause.REGRESSION, True, False), (Cause.CRASHED, True, False), (Cause.INTERRUPTED, True, False)])
def test_a_failure_that_is_not_the_checkpoints_keeps_a_verified_deployment(cause, verified, stays):
    records = [_Record("verify-acceptance", "ok" if verified else "failed")]
    assert deployment_stays(cause, records) is stays


def _helper(tmp_path, *args):
    return subprocess.run([sys.executable, "-c", facts.update_program(), facts.MARK, str(tmp_path / "q.json"), *args],
                          capture_output=True, text=True, timeout=30)


def test_the_host_helper_adds_and_removes_atomically_and_bounds_the_record(tmp_path):
    for i in range(70):
        proc = _helper(tmp_path, "add", f"fp{i:02d}", json.dumps(dict(ENTRY, failed_at=f"2026-12-01T00:00:{i:02d}")))
        assert proc.returncode == 0 and facts.parse_update(proc.stdout, "h") == min(i + 1, 64)
    entries = facts.parse_quarantine((tmp_path / "q.json").read_text(), "h", "q").entries
    assert len(entries) == 64 and "fp69" in entries and "fp00" not in entries  # the newest kept
    assert facts.parse_update(_helper(tmp_path, "remove", "fp69").stdout, "h") == 63
    assert not list(tmp_path.glob("*.tmp"))


def test_a_corrupt_record_is_replaced_by_the_new_failure(tmp_path):
    (tmp_path / "q.json").write_text("{not json")
    assert _helper(tmp_path, "add", FP, json.dumps(ENTRY)).returncode == 0
    assert set(facts.parse_quarantine((tmp_path / "q.json").read_text(), "h", "q").entries) == {FP}


@pytest.mark.parametrize("args", [[], ["add", FP], ["remove"], ["drop", FP], ["add", FP, "{}", "x"]])
def test_the_host_helper_refuses_bad_usage(tmp_path, args):
    assert _helper(tmp_path, *args).returncode == 2
    assert not (tmp_path / "q.json").exists()


@pytest.mark.parametrize("name,has", [("restart", True), ("nightly", True), ("up", False), ("bench", False)])
def test_restart_and_nightly_check_the_quarantine_before_the_stop(name, has):
    steps = [s.name for s in load_playbook(name).steps]
    assert ("quarantine" in steps) == has
    if has:
        assert steps.index("converge") < steps.index("quarantine") < steps.index("stop-stale")


@pytest.mark.parametrize("step,error,cause", [
    # issue 39: a checkpoint with wrong tensor names was recorded "failure_cause: host"
    ("fix-keys", VerificationFailed("SGLang would not load the drafter /d fully: SGLang 0.5.21 would drop 2 tensor(s)"),
     Cause.INVALID),
    ("fix-keys", RemoteCommandFailed("not safetensors", exit_code=ExitCode.CHECKPOINT), Cause.INVALID),
    ("doctor", RemoteCommandFailed("no config.json", exit_code=ExitCode.CHECKPOINT), Cause.INVALID),
    # ... and so was every exit-13 refusal of a quarantined checkpoint
    ("quarantine", Quarantined("kimi-a: fingerprint abab... quarantined"), Cause.QUARANTINED),
    # the host's faults stay the host's
    ("fix-keys", RemoteCommandFailed("cannot copy: No space left", exit_code=ExitCode.IO), Cause.HOST),
    ("doctor", VerificationFailed("gpu-memory: GPU 3 held"), Cause.HOST),
])
def test_the_checkpoints_own_refusals_name_the_checkpoint_not_the_host(step, error, cause):
    found = failure_cause(step, error)
    assert found is cause
    assert found.checkpoints_fault == (cause is not Cause.HOST)
    assert found.describe().startswith("the checkpoint's") == (cause is not Cause.HOST)
    # refused before any launch: never (re)quarantined for it
    memory = StepMemory(drafter_fingerprint=FP, drafter_path="/s/d", launched=True, snapshot=snapshot(None))
    assert quarantine.failure_entry("nightly", "r", step, error, memory, "T") is None
