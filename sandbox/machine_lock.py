"""The machine-wide lock around the sandbox (SIMULATION infrastructure, tests and benchmarks only).

The sandbox's addresses (127.0.0.10+), Unix users (dsb-*) and root are fixed, so two test sessions
or benchmarks on one machine would collide; each holds this lock while its sandbox exists, and a
second one waits (bounded) instead.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_PATH = Path("/var/tmp/deployctl-test-sandbox.lock")


class MachineLockTimeout(Exception):
    pass


@contextmanager
def machine_lock(wait_s: float, poll_s: float = 0.2) -> Iterator[None]:
    """Hold the sandbox lock for the ``with`` body; MachineLockTimeout after ``wait_s`` of waiting."""
    with open(LOCK_PATH, "a") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MachineLockTimeout(
                        f"another session held {LOCK_PATH} for {wait_s:.0f} s "
                        "(its sandbox uses the same addresses and users)") from None
                time.sleep(poll_s)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
