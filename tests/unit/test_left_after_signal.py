"""After a signal the report says exactly what the run left (issue 31): stopped and nothing launched,
or the PID it launched and whether it was verified; no host command needed for that."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from deploy.engine.outcome import after_interruption
from deploy.engine.records import HostReport, StepRecord
from deploy.engine.session import run_steps
from deploy.base.errors import ExitCode, Interrupted
from deploy.steps.base import StepOutcome, StepSettings
from deploy.steps.memory import StepMemory

from tests.fixtures import PLAIN_HOST as HOST, PLAIN_RUN as RUN  # noqa: E402
UP = ("doctor", "ensure-helper", "fix-keys", "converge", "stop-stale", "free-gpus", "wait-gpus-free", "launch",
      "wait-ready", "verify-acceptance", "record-good")
DATA = {"stop-stale": {"processes": [{"pid": 4242, "signal": "TERM", "exited": True}]}, "free-gpus": {"killed": []},
        "launch": {"pid": 5151}}


def steps_until(signal_after: str, cancelled: threading.Event, memory: StepMemory):
    def make(name):
        def run(ctx):
            if name == "launch":
                ctx.memory.pid, ctx.memory.launched = 5151, True
            if name == signal_after:
                cancelled.set()  # SIGINT/SIGTERM arrives while this step finishes
            return StepOutcome("ok", name, dict(DATA.get(name, {})))
        return SimpleNamespace(name=name, module=SimpleNamespace(NAME=name, run=run, CONVERGE_SKIPS=False),
                               settings=StepSettings(step=name))
    return [make(n) for n in UP]


@pytest.mark.parametrize("signal_after, expected", [
    ("converge", "stopped nothing and launched nothing"),
    ("stop-stale", "nothing: this run stopped the server (pid 4242) and launched nothing"),
    ("wait-gpus-free", "nothing: this run stopped the server (pid 4242) and launched nothing"),
    ("launch", "SGLang pid 5151 (launched by this run, not verified in this run: not ready yet)"),
    ("wait-ready", "SGLang pid 5151 (launched by this run, not verified in this run: ready)"),
    ("verify-acceptance", "SGLang pid 5151 (launched by this run, verified in this run)"),
])
def test_a_signal_after_each_step_says_what_the_run_left(signal_after, expected):
    cancelled = threading.Event()
    memory = StepMemory()
    records, error, _ = run_steps(steps_until(signal_after, cancelled, memory), HOST, RUN, None, "s",
                                  lambda *a: None, memory, cancelled)
    assert error is None and records[UP.index(signal_after) + 1].status == "not-run"
    left = after_interruption(HostReport(HOST, steps=records), memory)
    assert left is not None
    assert expected in left[0] and "unknown" not in left[0] and "not read again" in left[0]


@pytest.mark.parametrize("seed", range(40))
def test_the_stopped_server_is_named_first_whatever_its_pids_order(seed):
    """A signal after stop-stale named the first eight PIDs in /proc's order: after the PIDs wrapped around,
    the server's TP ranks (started after it, smaller PIDs) pushed the server's own PID out of the line."""
    import random

    rng = random.Random(seed)
    server = rng.randrange(300, 4_194_304)
    ranks = [rng.randrange(300, 4_194_304) for _ in range(rng.randrange(0, 13))]
    strays = [rng.randrange(300, 4_194_304) for _ in range(rng.randrange(0, 3))]
    pids = sorted(set([server, *ranks, *strays]))  # /proc lists them in numeric order
    data = {"stop-stale": {"processes": [{"pid": p, "signal": "TERM", "exited": True} for p in pids]},
            "converge": {"recorded_pid": server, "converged": False}}
    records = [StepRecord(n, "ok", data=dict(data.get(n, {}))) for n in UP[:UP.index("stop-stale") + 1]]
    left = after_interruption(HostReport(HOST, steps=records), StepMemory())
    assert left is not None
    named = left[0].split("(pid ", 1)[1].split(")", 1)[0]
    assert named.split(", ")[0] == str(server), left[0]
    shown = named.split(" and ")[0].split(", ")
    assert len(shown) == min(8, len(pids)) and set(shown) <= {str(p) for p in pids}, left[0]
    assert (f" and {len(pids) - 8} more" in named) is (len(pids) > 8), left[0]


def test_converged_and_untouched():
    records = [StepRecord(n, "skipped" if n in ("stop-stale", "free-gpus", "launch") else "ok") for n in UP[:8]]
    left = after_interruption(HostReport(HOST, steps=records), StepMemory(converged=True, pid=77))
    assert left is not None and "found running as desired, untouched" in left[0] and left[1].pid == 77


@pytest.mark.parametrize("step", ["stop-stale", "launch"])
def test_cut_inside_a_step_that_changes_the_host_needs_the_hosts_answer(step):
    records = [StepRecord(n, "ok") for n in UP[:UP.index(step)]]
    records.append(StepRecord(step, "failed", detail=str(Interrupted("h: interrupted")),
                              exit_code=int(ExitCode.TERMINATED)))
    # only the host can say: None, and HostSession.close reads the server's state
    assert after_interruption(HostReport(HOST, steps=records), StepMemory()) is None


@pytest.mark.parametrize("code", [ExitCode.INTERRUPTED, ExitCode.TERMINATED, ExitCode.HANGUP])
def test_an_interrupted_verify_says_interrupted_not_failed(code):
    """Issue 39: a signal during verify-acceptance was reported "failed verification in this run: ... interrupted"."""
    from deploy.engine.outcome import failed_verifications

    records = [StepRecord(n, "ok", data=dict(DATA.get(n, {}))) for n in UP[:UP.index("verify-acceptance")]]
    records.append(StepRecord("verify-acceptance", "failed", detail="h: interrupted", exit_code=int(code)))
    memory = StepMemory(pid=5151, launched=True)
    report = HostReport(HOST, steps=records)
    left = after_interruption(report, memory)
    assert left is not None
    assert "failed" not in left[0] and "failed" not in left[1].detail, left
    assert "verification interrupted" in left[0] and left[1].state == "unverified"
    assert failed_verifications(report, memory) == {}
    # a verification that really failed still says so
    records[-1] = StepRecord("verify-acceptance", "failed", detail="h: accept length 1.40 < 1.50", exit_code=8)
    assert failed_verifications(HostReport(HOST, steps=records), memory) == {5151: "h: accept length 1.40 < 1.50"}
