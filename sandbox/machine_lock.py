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


def slot_lock_path(slot: int) -> Path:
    """Slot 0 is the lock every benchmark and the first test worker take; slot k > 0 its own file."""
    return LOCK_PATH if slot == 0 else LOCK_PATH.with_name(f"{LOCK_PATH.stem}-s{slot}{LOCK_PATH.suffix}")


@contextmanager
def machine_lock(wait_s: float, poll_s: float = 0.2, path: Path = LOCK_PATH) -> Iterator[None]:
    """Hold the sandbox lock for the ``with`` body; MachineLockTimeout after ``wait_s`` of waiting."""
    with open(path, "a") as lock:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MachineLockTimeout(
                        f"another session held {path} for {wait_s:.0f} s "
                        "(its sandbox uses the same addresses and users)") from None
                time.sleep(poll_s)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def any_slot_lock(slots: int, wait_s: float, poll_s: float = 0.2) -> Iterator[int]:
    """Hold the first free one of ``slots`` sandbox locks for the ``with`` body and yield its slot.

    Each slot has its own addresses, users and root (tests/conftest.py), so two sessions (two
    xdist workers, or two engineers) each take one; a third waits, bounded, for either."""
    files = [open(slot_lock_path(slot), "a") for slot in range(slots)]
    try:
        deadline = time.monotonic() + wait_s
        while True:
            for slot, lock in enumerate(files):
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield slot
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                return
            if time.monotonic() > deadline:
                raise MachineLockTimeout(
                    f"other sessions held all {slots} sandbox slots ({', '.join(str(slot_lock_path(s)) for s in range(slots))}) "
                    f"for {wait_s:.0f} s")
            time.sleep(poll_s)
    finally:
        for lock in files:
            lock.close()
