"""Issue 38: a drafter swap whose tensors went out and whose outcome was not verified is never
recorded, converged on or headlined as the old deployment.

Before: after the update was sent, an unreadable summary (deep JSON, a ``weight_version`` of another
type, a traceback, a killed sender) or a signal left deployment.json naming the OLD drafter: the
report said "the last good deployment, untouched by this run" and the next ``restart`` "already
running as desired" on a server holding new, unverified weights. Now the step writes the record as
``swapping`` (no fingerprint) before the first tensor leaves, ``swap-failed`` whenever the outcome is
not verified, and puts it back only when the server refused before any tensor was sent. The swap
step runs over tests/recording.py's scripted wire, generated over every kind of send outcome.
"""

from __future__ import annotations

import json

import pytest

from deploy.base.errors import ConnectionFailed, Interrupted
from deploy.config.models import Host, Run
from deploy.engine.serving import decide
from deploy.facts.server import ServerState, same_deployment
from deploy.host.deployment import DesiredDeployment, UNKNOWN_DRAFTER_WORDS, drafter_unknown
from deploy.host.records import DeploymentRecord, LastGood, record_of
from deploy.ssh.transport import ExecCancelled, ExecTimedOut
from deploy.steps import swap_drafter
from deploy.steps.base import StepContext
from deploy.steps.converge import would_converge
from deploy.steps.swap_decision import RunningServer, SwapDecision, swap_decision
from deploy.steps.memory import StepMemory
from tests.recording import RecordingTransport, Reply

HOST = Host(name="kimi-a", address="10.1.230.174", gpus=2, state_dir="/var/lib/deployctl")
RUN = Run(name="r", hosts=["kimi-a"], base_model="/data/models/base", drafter="/data/drafter", drafter_update="swap")
OLD, NEW = "a" * 64, "b" * 64
PID = 4242


def _old_record() -> DeploymentRecord:
    want = DesiredDeployment(run="r", argv=("python3", "-m", "sglang.launch_server", "--speculative-draft-model-path",
                                            "/store/old"), drafter_fingerprint=OLD, drafter_path="/store/old",
                             env_hash="e" * 64, sglang_version="0.5.23", draft_tokens=4, env_file=None)
    return want.record().but(pid=PID, log="/var/lib/deployctl/logs/s.log", launched_at="2026-12-01T00:00:00+00:00")


def _read(record: dict | DeploymentRecord) -> DeploymentRecord:
    """A record as written to the host (JSON), read back as deployctl reads deployment.json."""
    return record if isinstance(record, DeploymentRecord) else record_of(DeploymentRecord, record, "deployment.json")


def _summary(**changes) -> str:
    base = {"ok": False, "stage": "update", "sent": True, "ended": True, "http_status": 400, "message": "x",
            "weight_version": None, "tensors": 3, "seconds": 0.5, "flushed": False, "held_s": 0.4,
            "held": {"begin": 0.1, "update": 0.2, "end": 0.1}}
    return json.dumps(base | changes)


#: the send's outcomes after which tensors may have gone out and nothing verified the swap
UNKNOWN = {
    "update-failed": Reply("send --url", stdout=_summary()),
    "update-500": Reply("send --url", stdout=_summary(http_status=500, message="CUDA error")),
    "end-failed": Reply("send --url", stdout=_summary(stage="end", ended=False)),
    "model-info-failed": Reply("send --url", stdout=_summary(stage="model_info", http_status=0, message="timed out")),
    "model-info-deep": Reply("send --url", stdout=_summary(stage="model_info",
                                                           message="a JSON answer nested more than 64 levels deep")),
    "interrupted-in-update": Reply("send --url", stdout=_summary(message="interrupted by SIGTERM at update")),
    "interrupted-at-model-info": Reply("send --url", stdout=_summary(stage="update", ended=True,
                                                                     message="interrupted by SIGHUP at update")),
    "other-weight-version": Reply("send --url", stdout=_summary(ok=True, stage="done", http_status=200,
                                                                weight_version="default")),
    "old-weight-version": Reply("send --url", stdout=_summary(ok=True, stage="done", http_status=200,
                                                              weight_version=OLD)),
    "empty-weight-version": Reply("send --url", stdout=_summary(ok=True, stage="done", http_status=200,
                                                                weight_version="")),
    "no-weight-version": Reply("send --url", stdout=_summary(ok=True, stage="done", http_status=200)),
    # what deployctl cannot read: the outcome is unknown
    "weight-version-int": Reply("send --url", stdout=_summary(ok=True, stage="done", weight_version=12345)),
    "weight-version-list": Reply("send --url", stdout=_summary(ok=True, stage="done", weight_version=[NEW])),
    "deep-json-line": Reply("send --url", stdout="[" * 100_000 + "]" * 100_000 + "\n"),
    "deep-json-70": Reply("send --url", stdout='{"ok": ' + "[" * 70 + "]" * 70 + "}\n"),
    "not-json": Reply("send --url", stdout="Segmentation fault\n"),
    "two-lines": Reply("send --url", stdout=_summary() + "\n" + _summary() + "\n"),
    "empty-output": Reply("send --url", stdout=""),
    "extra-field": Reply("send --url", stdout=json.dumps(json.loads(_summary()) | {"extra": 1})),
    "stage-unknown": Reply("send --url", stdout=_summary(stage="later")),
    "sent-as-string": Reply("send --url", stdout=_summary(sent="true")),
    "traceback-exit-1": Reply("send --url", exit_code=1, stderr="Traceback (most recent call last):\n"
                                                                 "RecursionError: maximum recursion depth exceeded\n"
                                                                 "    ^^^^^^^^^^^\n"),
    "killed-exit-137": Reply("send --url", exit_code=137),
    "oom-exit-9": Reply("send --url", exit_code=-9),
    "summary-then-exit-1": Reply("send --url", exit_code=1, stdout=_summary(ok=True, stage="done",
                                                                            weight_version=NEW)),
    "timed-out": Reply("send --url", raises=ExecTimedOut("600 s")),
}

#: refused before any tensor was sent: the server is as it was, the record put back
NOT_SENT = {
    "server-info": Reply("send --url", stdout=_summary(stage="server_info", sent=False, ended=False, http_status=0)),
    "begin-401": Reply("send --url", stdout=_summary(stage="begin", sent=False, ended=False, http_status=401)),
    "begin-open": Reply("send --url", stdout=_summary(stage="begin", sent=False, ended=False,
                                                      message="a weight-update session is already open")),
    "prepare": Reply("send --url", stdout=_summary(stage="prepare", sent=False, ended=False,
                                                   message="ModuleNotFoundError: No module named 'torch'")),
    "interrupted-in-begin": Reply("send --url", stdout=_summary(stage="begin", sent=False, ended=True,
                                                                message="interrupted by SIGINT at begin")),
}

#: deployctl itself is stopped (Ctrl-C, SIGTERM) or loses the host: nothing more is sent
STOPS = {
    "ctrl-c": (Reply("send --url", raises=ExecCancelled()), Interrupted),
    "connection-lost": (Reply("send --url", raises=ConnectionError("reset")), ConnectionFailed),
    "eof": (Reply("send --url", raises=EOFError()), ConnectionFailed),
}


def _ctx(conn) -> StepContext:
    memory = StepMemory(drafter_path="/store/new", drafter_fingerprint=NEW, sglang_version="0.5.23")
    return StepContext(host=HOST, run=RUN, settings=swap_drafter.Settings(step=swap_drafter.NAME), conn=conn,
                       launch_stamp="20261201T000000Z", memory=memory)


def _records(conn: RecordingTransport) -> list[dict]:
    """The deployment records the step wrote, in order (host_ops.py write-file's input)."""
    written = []
    for command, stdin in zip(conn.commands, conn.stdins):
        if "write-file" not in command:
            continue
        assert stdin is not None and "drafter_fingerprint" not in command  # the record on stdin, never on the line
        written.append(json.loads(stdin))
    return written


def _state(record: dict | DeploymentRecord | None) -> ServerState:
    return ServerState(pid=PID, alive=True, status=200, error=None, record=None if record is None else _read(record))


def _swap(reply: Reply):
    # write-file first: a swap-failed record's reason may quote the send command
    conn = RecordingTransport(HOST, [Reply("write-file"), reply])
    ctx = _ctx(conn)
    old = _old_record()
    return conn, ctx, old, (lambda: swap_drafter._swap(ctx, _state(old), SwapDecision("swap", "only the tensors")))


def _never_as_desired(written: dict, old: DeploymentRecord) -> None:
    """Neither the old nor the new deployment is "already running as desired" on this record, it is
    not the last good deployment, a swap is not tried on it, and the report never says untouched."""
    record = _read(written)
    assert drafter_unknown(record) and record.drafter_fingerprint is None
    for want in (DesiredDeployment.of_record(old), DesiredDeployment.of_record(old).with_drafter("/store/new", NEW),
                 DesiredDeployment.of_record(old).with_drafter("/store/old", None)):
        unchanged, why = would_converge(want, _state(record))
        assert not unchanged and UNKNOWN_DRAFTER_WORDS in why, why
    assert not same_deployment(record, old) and not same_deployment(record, record)
    serving = decide(verified_pid=None, state=_state(record), last_good=LastGood.model_validate(old.document()))
    assert "untouched" not in serving.headline() and serving.state == "unverified"
    decision = swap_decision(RUN, DesiredDeployment.of_record(old).with_drafter("/store/new", NEW),
                             RunningServer(record, True, 200, PID))
    assert decision.path == "reload" and "unknown" in decision.reason


@pytest.mark.parametrize("case", sorted(UNKNOWN))
def test_tensors_out_and_not_verified_is_swap_failed_and_a_reload(case):
    conn, ctx, old, run = _swap(UNKNOWN[case])
    outcome = run()
    marked, failed = _records(conn)
    assert [c for c in conn.commands if "send --url" in c] and conn.commands.index(
        next(c for c in conn.commands if "send --url" in c)) > conn.commands.index(
        next(c for c in conn.commands if "write-file" in c))  # the mark went first
    assert marked["drafter_update"]["how"] == "swapping" and marked["drafter_fingerprint"] is None
    assert failed["drafter_update"]["how"] == "swap-failed" and failed["drafter_update"]["to"] == NEW
    assert failed["drafter_update"]["from"] == OLD and failed["drafter_update"]["why"]
    for record in (marked, failed):  # the rest is the running server's record: stop and the PID check still match
        assert {k: v for k, v in record.items() if k not in ("drafter_fingerprint", "drafter_update")} == \
            {k: v for k, v in old.document().items() if k != "drafter_fingerprint"}
        _never_as_desired(record, old)
    assert outcome.status == "skipped" and outcome.data["path"] == "reload" and outcome.data["sent"] is True
    assert "the swap failed verification" in outcome.detail and "Traceback" not in outcome.detail
    assert "^^^" not in outcome.detail
    if case == "traceback-exit-1":
        assert "exited with code 1; its last words: 'RecursionError: maximum recursion depth exceeded'" in outcome.detail
    if case in ("killed-exit-137", "oom-exit-9"):
        assert "killed: SIGKILL" in outcome.detail and "with no output" in outcome.detail
    assert ctx.memory.drafter_update.how == "reloaded" and not ctx.memory.swapped


@pytest.mark.parametrize("case", sorted(NOT_SENT))
def test_refused_before_any_tensor_puts_the_record_back(case):
    conn, ctx, old, run = _swap(NOT_SENT[case])
    outcome = run()
    marked, restored = _records(conn)
    assert marked["drafter_update"]["how"] == "swapping"
    assert restored == old.document() and not drafter_unknown(_read(restored))
    assert outcome.status == "skipped" and outcome.data == {"path": "reload", "sent": False,
                                                            "reason": outcome.data["reason"]}
    assert would_converge(DesiredDeployment.of_record(old), _state(restored))[0]


@pytest.mark.parametrize("case", sorted(STOPS))
def test_deployctl_stopped_mid_send_leaves_the_swapping_mark(case):
    reply, error = STOPS[case]
    conn, ctx, old, run = _swap(reply)
    with pytest.raises(error):
        run()
    [marked] = _records(conn)  # nothing more was sent: the mark already says the drafter is unknown
    assert marked["drafter_update"]["how"] == "swapping"
    _never_as_desired(marked, old)


def test_the_plan_lists_the_mark_before_the_send_and_the_put_back_after_it():
    ctx = _ctx(RecordingTransport(HOST, []))
    described = [a.description for a in swap_drafter.plan(ctx)]
    mark = next(i for i, d in enumerate(described) if d.startswith("deployment record: swapping"))
    send = next(i for i, d in enumerate(described) if d.startswith("swap the drafter into the running server"))
    back = next(i for i, d in enumerate(described) if d.startswith("deployment record: put back"))
    assert mark < send < back


@pytest.mark.parametrize("how", ["swapping", "swap-failed"])
@pytest.mark.parametrize("fingerprint", [None, OLD, NEW])
def test_a_record_whose_drafter_is_unknown_never_matches_whatever_its_fingerprint(how, fingerprint):
    """A hand edit or an older deployctl may have left a fingerprint beside the mark: the mark wins."""
    old = _old_record()
    record = old.but(drafter_fingerprint=fingerprint, drafter_update={"how": how})
    for want in (DesiredDeployment.of_record(old), DesiredDeployment.of_record(old.but(drafter_fingerprint=None))):
        assert not would_converge(want, _state(record))[0]
    assert not same_deployment(record, old) and not same_deployment(old, record)


@pytest.mark.parametrize("update", [None, {"how": "swapped"}, {"how": "reloaded"}])
def test_other_records_are_compared_as_before(update):
    old = _old_record()
    record = old.but(drafter_update=update) if update is not None else old
    assert would_converge(DesiredDeployment.of_record(old), _state(record))[0]
    assert same_deployment(record, old)


@pytest.mark.parametrize("update", [{}, {"how": "guessed"}, "swap-failed", ["swap-failed"]])
def test_a_drafter_update_of_another_shape_is_refused_naming_the_file_and_field(update):
    """Issue 37: before the typed record, such a hand edit was compared as if it said nothing."""
    from deploy.base.errors import ExitCode, RemoteOutputError
    from deploy.facts.server import parse_server_state

    answer = {"pid": PID, "alive": True, "status": 200, "error": None,
              "record": _old_record().document() | {"drafter_update": update}}
    with pytest.raises(RemoteOutputError) as refused:
        parse_server_state(json.dumps(answer), "kimi-a")
    assert refused.value.exit_code == ExitCode.REMOTE_OUTPUT
    assert str(refused.value).startswith("kimi-a: deployment.json: not a deployment record: drafter_update")


@pytest.mark.parametrize("reply, sent", [(UNKNOWN["update-failed"], True), (NOT_SENT["begin-401"], False)])
def test_the_reload_after_a_fallback_records_that_it_reloaded_and_why(reply, sent):
    """Issue 41: the launch that follows a swap that fell back writes ``drafter_update: {how: reloaded,
    why, asked: swap, sent}`` into deployment.json (before, the record did not say it reloaded)."""
    from deploy.steps import launch

    conn, ctx, old, run = _swap(reply)
    run()
    record = launch.desired_record(ctx)
    update = record.drafter_update
    assert update is not None and update.how == "reloaded" and update.asked == "swap" and update.sent is sent
    assert update.at and str(update.why).startswith("the swap failed verification" if sent else
                                                     "the server refused the swap at begin")
    assert not drafter_unknown(record) and record.drafter_fingerprint == NEW
    # a rollback relaunches the last good record as it was
    ctx.memory.rollback_record = LastGood.model_validate(old.document())
    assert "drafter_update" not in launch.desired_record(ctx).document()
