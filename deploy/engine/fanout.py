"""Run one function per host in a bounded thread pool; one host failing never hides the others."""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from deploy.config.models import Host
from deploy.base import errors
from deploy.base.errors import DeployError, ExitCode

T = TypeVar("T")


@dataclass
class HostOutcome(Generic[T]):
    host: Host
    value: T | None = None
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def for_each_host(hosts: Sequence[Host], work: Callable[[Host], T], max_parallel: int,
                  cancel: threading.Event | None = None) -> list[HostOutcome[T]]:
    """Results in the order of ``hosts``. Unexpected exceptions become errors on that host only.

    On Ctrl-C, ``cancel`` is set so the hosts' steps stop at their next poll (every remote command
    is bounded by its own timeout), then KeyboardInterrupt propagates with the outcomes of the
    hosts that finished in its ``outcomes`` attribute (so the caller can still say what each host
    was left running).
    """

    def guarded(host: Host) -> HostOutcome[T]:
        try:
            return HostOutcome(host, value=work(host))
        except DeployError as exc:
            return HostOutcome(host, error=exc)
        except Exception as exc:  # a bug on one host must not lose the other hosts' results
            if errors.show_tracebacks:
                print(f"{host.name}: internal error, traceback follows:", file=sys.stderr)
                traceback.print_exception(exc, file=sys.stderr)
                hint = ""
            else:
                hint = " (run with --traceback)"
            error = DeployError(f"internal error: {type(exc).__name__}: {exc}{hint}", exit_code=ExitCode.FAILED)
            error.__cause__ = exc
            return HostOutcome(host, error=error)

    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(max_parallel, len(hosts)), thread_name_prefix="host")
    futures = [pool.submit(guarded, host) for host in hosts]
    try:
        return [future.result() for future in futures]
    except KeyboardInterrupt as interrupt:
        if cancel is not None:
            cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
        interrupt.outcomes = [f.result() for f in futures if f.done() and not f.cancelled()]  # type: ignore[attr-defined]
        raise
    finally:
        pool.shutdown(wait=False)


class _Result(Protocol):
    @property
    def error(self) -> DeployError | None: ...


def exit_code(results: Sequence[_Result]) -> ExitCode:
    """The exit code for a multi-host command: 0 if all succeeded, else the first failed host's code
    (hosts in config order, so the code does not depend on which host finished first)."""
    for result in results:
        if result.error is not None:
            return ExitCode(result.error.exit_code)
    return ExitCode.OK
