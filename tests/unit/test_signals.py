"""SIGTERM and SIGHUP end a run like Ctrl-C (issue 17): the exit code says which signal; reports are marked."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from deploy.base.errors import ExitCode, Interrupted, VerificationFailed
from deploy.engine.records import HostReport, StepRecord
from deploy.engine.run import mark_interrupted
from tests.fixtures import default_signals

PROGRAM = """
import os, signal, sys, time
from deploy.base.signals import Terminated, terminate_like_interrupt
code = 3
with terminate_like_interrupt():
    try:
        os.kill(os.getpid(), signal.{name})
        time.sleep(5)
    except KeyboardInterrupt as exc:  # what every Ctrl-C handler of deployctl catches
        assert isinstance(exc, Terminated)
        os.kill(os.getpid(), signal.{name})  # a second signal does not cut the cleanup short
        time.sleep(0.2)
        print("cleaned up", flush=True)
        code = exc.exit_code
sys.exit(code)
"""


@pytest.mark.parametrize("name,code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_the_signal_becomes_a_keyboard_interrupt_with_its_exit_code(name, code):
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(name=name)], capture_output=True, text=True, timeout=30,
                          preexec_fn=default_signals)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.strip() == "cleaned up"


IGNORED = """
import os, signal, sys, time
from deploy.base.signals import terminate_like_interrupt
signal.signal(signal.{name}, signal.SIG_IGN)  # as nohup (SIGHUP) or a parent's SIG_IGN left it
with terminate_like_interrupt():
    assert signal.getsignal(signal.{name}) is signal.SIG_IGN
    os.kill(os.getpid(), signal.{name})
    time.sleep(0.2)
    print("ran on", flush=True)
sys.exit(3)
"""


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP"])
def test_a_signal_ignored_at_start_stays_ignored(name):
    """`nohup deployctl nightly &`: closing the terminal must not end the run (its SIGHUP is ignored)."""
    proc = subprocess.run([sys.executable, "-c", IGNORED.format(name=name)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == "ran on"


def test_handlers_are_restored_after_the_invocation():
    from deploy.base.signals import terminate_like_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with terminate_like_interrupt():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


from tests.fixtures import LOOPBACK_HOST as HOST  # noqa: E402


@pytest.mark.parametrize("code", [ExitCode.TERMINATED, ExitCode.HANGUP, ExitCode.INTERRUPTED])
def test_interrupted_hosts_carry_the_signals_code_and_finished_ones_keep_theirs(code):
    cut = HostReport(HOST, steps=[StepRecord("doctor", "ok"), StepRecord("launch", "not-run")])
    mid = HostReport(HOST, steps=[StepRecord("wait-ready", "failed")], error=Interrupted("h: interrupted"))
    done = HostReport(HOST, steps=[StepRecord("doctor", "ok")])
    failed = HostReport(HOST, steps=[StepRecord("doctor", "failed"), StepRecord("launch", "not-run")],
                        error=VerificationFailed("doctor"))
    mark_interrupted([cut, mid, done, failed], code, "SIGTERM")
    assert cut.error is not None and cut.error.exit_code == code and cut.outcome == "interrupted"
    assert mid.error is not None and mid.error.exit_code == code and mid.outcome == "interrupted"
    assert done.error is None and done.outcome == "ok"
    assert failed.error is not None and failed.error.exit_code == ExitCode.VERIFY
