"""A value every host worker of a run asks for and nobody should build twice."""

from __future__ import annotations

import functools
import threading
from typing import Callable, Generic, TypeVar, cast

T = TypeVar("T")


class built_once(Generic[T]):  # noqa: N801  (used as a decorator, named like functools.cache)
    """``build()``'s value, built once per process however many threads ask at once (a build that
    raises is not kept: the next caller builds again).

    The programs sent to hosts are the same text for every host of a run, and building one costs its
    zlib compression (level 9: about 8 ms for the doctor's 150 kB of sources); the built-in prompt set
    is 8 ms of JSON parsing. ``functools.lru_cache`` let every host worker that asked before the
    first build finished build it again: 8 doctor programs for 12 hosts, one per worker
    (``max_parallel``), about 6 ms of `up`'s CPU per extra host (issue 37's fleet-scale benchmark,
    2026-12-06)."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build = build
        self._lock = threading.Lock()
        self._built = False
        self._value: T | None = None
        functools.update_wrapper(self, build)

    def __call__(self) -> T:
        with self._lock:
            if not self._built:
                self._value = self._build()
                self._built = True
            return cast(T, self._value)  # set above (T may itself admit None: _built says whether it is)
