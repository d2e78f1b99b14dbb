"""Issue 28: a signal reaches a running remote command within a second, a host that dies mid-command
is exit 4 (not "no JSON summary", exit 5), a frozen host fails the later reads at once, and an
interrupted host's report says what this run left (PID, verified) without another read."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from deploy.ssh import bounded_channel
from deploy.config.models import SSHSettings
from deploy.engine.outcome import after_interruption
from deploy.steps.memory import StepMemory
from deploy.engine.records import HostReport, StepRecord
from deploy.base.errors import ConnectionFailed, Interrupted
from deploy.ssh.transport import HostConnection
from tests.hostile.test_bounded_reads import FakeChannel

from tests.fixtures import LOOPBACK_HOST as HOST  # noqa: E402


class DeadChannel(FakeChannel):
    """The channel paramiko leaves when the SSH session dies mid-command: closed, no exit status (-1)."""

    def __init__(self):
        super().__init__("silence", exit_after=0)
        self.closed = self.eof_received = True
        self.status_event.set()

    def recv_exit_status(self):
        return -1


class FakeSSH:
    def __init__(self, channel, active=True):
        self.channel, self.active = channel, active
        self.client = SimpleNamespace(get_transport=lambda: self)

    def open_session(self, timeout=None):
        return self.channel

    def is_active(self):
        return self.active


def connection(channel, active=True) -> HostConnection:
    conn = HostConnection(HOST, SSHSettings())
    fake = FakeSSH(channel, active)
    channel.get_transport = lambda: fake
    conn._live = lambda: fake  # type: ignore[method-assign]
    return conn


def test_a_signal_stops_a_running_remote_command_within_a_second():
    cancelled = threading.Event()
    started: list[float] = []

    class Running(FakeChannel):
        """bench_serving, running for minutes: the signal comes 0.2 s after the command started (a
        timer started before run() raced it on a loaded machine: a signal that comes before the command
        starts does not stop it, and the test waited out the command's timeout)."""

        def exec_command(self, command):
            super().exec_command(command)
            started.append(time.monotonic())
            threading.Timer(0.2, cancelled.set).start()

    conn = connection(Running("silence"))
    conn.cancelled = cancelled
    with pytest.raises(Interrupted, match="the running remote command was stopped"):
        conn.run("python3 -m sglang.bench_serving", timeout=60)
    assert time.monotonic() - started[0] < 1.0


def test_a_command_started_after_the_signal_still_runs():
    """The report's own reads after Ctrl-C are not cut short by the signal that came before them."""
    cancelled = threading.Event()
    cancelled.set()
    conn = connection(FakeChannel("lines", exit_after=3000))
    conn.cancelled = cancelled
    assert conn.run("cat state", timeout=30).exit_code == 0


def test_exec_bounded_checks_the_event_at_every_poll():
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(bounded_channel.Cancelled):
        bounded_channel.exec_bounded(FakeChannel("silence"), "x", deadline=time.monotonic() + 60, cancelled=cancelled)


def test_a_host_that_dies_mid_command_is_a_connection_failure_exit_4():
    with pytest.raises(ConnectionFailed, match="the host or its sshd went away") as died:
        connection(DeadChannel(), active=False).run("python3 fixer.pyz store ...", timeout=60)
    assert died.value.exit_code == 4


def test_a_command_killed_by_a_signal_on_a_live_session_is_not_a_dead_host():
    # exit-signal instead of exit-status also leaves -1; the SSH session is alive: not exit 4
    assert connection(DeadChannel(), active=True).run("x", timeout=60).exit_code == -1


def test_after_a_frozen_command_the_next_reads_fail_at_once():
    conn = connection(FakeChannel("silence"))
    # the local deadline (run() gives the host-side bound + 10 s) passed: a frozen host, not a slow command
    with pytest.raises(ConnectionError, match="the host stopped answering"):
        conn._exec("server-state", timeout=0.1)
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="not sent: the host stopped answering"):
        conn.run("tail -n 40 log", timeout=30)
    assert time.monotonic() - started < 0.5


# --- what an interrupted host's report says --------------------------------------------------------


def report(*steps, rollback=()):
    return HostReport(HOST, steps=[StepRecord(n, s, detail="accept length 1.40 < 1.5" if s == "failed" else "")
                                   for n, s in steps], rollback=[StepRecord(n, s) for n, s in rollback])


@pytest.mark.parametrize("steps, memory, left, state", [
    ((("launch", "ok"), ("verify-acceptance", "ok"), ("benchmark", "failed")), {"pid": 42, "launched": True},
     "pid 42 (launched by this run, verified in this run)", "serving"),
    ((("launch", "ok"), ("wait-ready", "failed")), {"pid": 42, "launched": True},
     "pid 42 (launched by this run, not verified in this run: not ready yet)", "unverified"),
    ((("converge", "ok"), ("verify-acceptance", "failed")), {"pid": 7, "converged": True},
     "pid 7 (the server this run found running as desired, untouched, failed verification in this run: "
     "accept length 1.40", "unverified"),
    # stop-stale found nothing to stop (no processes in its data): nothing was stopped, nothing launched
    ((("stop-stale", "ok"), ("free-gpus", "failed")), {}, "what it served before: this run stopped nothing and "
     "launched nothing", "unknown"),
])
def test_an_interrupted_host_says_what_this_run_left_without_reading_it_again(steps, memory, left, state):
    left_by_run = after_interruption(report(*steps), StepMemory(**memory))
    assert left_by_run is not None
    text, serving = left_by_run
    assert text.startswith(left.replace("pid ", "SGLang pid ", 1) if left.startswith("pid") else left)
    assert "not read again" in text
    assert serving.state == state and (serving.pid == memory.get("pid"))


def test_a_wait_whose_heartbeat_stops_ends_after_the_connect_timeout_not_at_its_deadline():
    conn = HostConnection(HOST, SSHSettings(connect_timeout_s=1))
    fake = FakeSSH(FakeChannel("silence"))
    conn._live = lambda: fake  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(ConnectionFailed, match="sent nothing for 1 s") as frozen:
        conn.watch("watch-health ...", lambda line: False, timeout=600, cancelled=threading.Event(), silence_s=0.2)
    assert time.monotonic() - started < 2.5 and frozen.value.exit_code == 4
    with pytest.raises(ConnectionFailed, match="not sent: the host stopped answering"):
        conn.run("server-state", timeout=30)  # the reads after it: at once, not 40 s each
