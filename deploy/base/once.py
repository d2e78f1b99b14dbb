"""A value every host worker of a run asks for and nobody should build twice."""

from __future__ import annotations

import functools
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def built_once(build: Callable[[], T]) -> Callable[[], T]:
    """``build()``'s value, built once per process however many threads ask at once.

    The programs sent to hosts are the same text for every host of a run, and building one costs its
    zlib compression (level 9: about 8 ms for the doctor's 150 kB of sources); the built-in prompt set
    is 8 ms of JSON parsing. ``functools.lru_cache`` alone let every host worker that asked before the
    first build finished build it again: 8 doctor programs for 12 hosts, one per worker
    (``max_parallel``), about 6 ms of `up`'s CPU per extra host (issue 37's fleet-scale benchmark,
    2026-12-06)."""
    lock = threading.Lock()
    cached = functools.lru_cache(maxsize=1)(build)

    @functools.wraps(build)
    def get() -> T:
        with lock:
            return cached()
    return get
