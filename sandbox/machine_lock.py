"""The machine-wide locks around the sandbox (SIMULATION infrastructure, tests and benchmarks only).

A sandbox's addresses (127.0.0.10+), Unix users (dsb-*) and root are fixed, so two test sessions
or benchmarks on one machine would collide; each holds a lock while its sandbox exists, and
another one waits (bounded) instead. The tests have four slots, each with its own addresses, users,
root and lock file (tests/conftest.py SLOTS); benchmarks take slot 0's.
"""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

LOCK_PATH = Path("/var/tmp/deployctl-test-sandbox.lock")


class MachineLockTimeout(Exception):
    pass


def slot_lock_path(slot: int) -> Path:
    """Slot 0 is the lock every benchmark and the first test worker take; slot k > 0 its own file."""
    return LOCK_PATH if slot == 0 else LOCK_PATH.with_name(f"{LOCK_PATH.stem}-s{slot}{LOCK_PATH.suffix}")


@contextmanager
def _first_free(paths: Sequence[Path], wait_s: float, poll_s: float, busy: str) -> Iterator[int]:
    """Hold the first of ``paths`` no other process holds, for the ``with`` body; yield its index.
    MachineLockTimeout(``busy``) after ``wait_s`` of finding them all held."""
    files = [open(path, "a") for path in paths]
    try:
        deadline = time.monotonic() + wait_s
        while True:
            for index, lock in enumerate(files):
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield index
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
                return
            if time.monotonic() > deadline:
                raise MachineLockTimeout(busy)
            time.sleep(poll_s)
    finally:
        for lock in files:
            lock.close()


@contextmanager
def machine_lock(wait_s: float, poll_s: float = 0.2) -> Iterator[None]:
    """Hold slot 0's lock for the ``with`` body (the benchmarks' sandbox); MachineLockTimeout after
    ``wait_s`` of waiting."""
    with _first_free([LOCK_PATH], wait_s, poll_s, f"another session held {LOCK_PATH} for {wait_s:.0f} s "
                     "(its sandbox uses the same addresses and users)"):
        yield


@contextmanager
def any_slot_lock(slots: Sequence[int], wait_s: float, poll_s: float = 0.2) -> Iterator[int]:
    """Hold the lock of the first free one of ``slots`` for the ``with`` body and yield that slot.

    Each slot has its own addresses, users and root (tests/conftest.py), so two sessions (two
    xdist workers, or two engineers) each take one; a third waits, bounded, for either."""
    paths = [slot_lock_path(slot) for slot in slots]
    busy = (f"other sessions held every sandbox slot lock ({', '.join(map(str, paths))}) for {wait_s:.0f} s "
            "(their sandboxes use those slots' addresses and users)")
    with _first_free(paths, wait_s, poll_s, busy) as index:
        yield slots[index]
