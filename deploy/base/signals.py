"""SIGTERM and SIGHUP end a run the way Ctrl-C does: steps stop at their next poll, every host's report
says what it left running, history gets its rows, locks are released; the exit code is 128 + the
signal (143 for SIGTERM, 129 for SIGHUP), the shell's convention for "killed by that signal".

Python's default for SIGTERM is to die at once (rc -15: no report, no history row, the host left on
an unverified drafter by a ``kill``, ``timeout`` or a systemd stop without ``KillSignal=SIGINT``).
A second signal while the first is being handled is ignored, so the cleanup (closing the host locks,
appending history) is not cut short; Ctrl-C still interrupts it, and SIGKILL always works. A
signal already ignored when deployctl starts (nohup's SIGHUP) stays ignored.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: the signals handled like SIGINT
SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM/SIGHUP: every ``except KeyboardInterrupt`` handles it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextmanager
def terminate_like_interrupt() -> Iterator[None]:
    """Install the handlers for the duration of one CLI invocation (main thread only: Python
    delivers signals there; elsewhere, e.g. a test calling ``main`` from a thread, nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum, frame):
        if fired:
            return  # already stopping: let the cleanup finish
        fired.append(signum)
        raise Terminated(signum)

    # A signal ignored when deployctl started stays ignored: `nohup deployctl nightly &` (SIGHUP)
    # and a shell's background job are told to ignore it, as POSIX utilities do (Python, too,
    # leaves an inherited SIG_IGN of SIGINT alone).
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
