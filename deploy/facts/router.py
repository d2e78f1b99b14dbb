"""The router host's answers, typed: what ``deploy/remote/fleet_ops.py`` prints there (one JSON line
per call) and the router's worker list inside it, each one strict model parsed at the boundary.

| answer | model | fleet_ops.py | read by |
|---|---|---|---|
| an HTTP request's outcome | ``HttpAnswer`` | ``request``, ``poll ... request`` | add, remove, health, drain, end-to-end (fleet/router.py) |
| one worker of the router's list | ``Worker`` | (GET /workers, /list_workers body) | the phases (fleet/rolling.py, fleet/canary.py), ``status`` |
| the router's PID file, process, list | ``RouterState`` | ``router-state`` | router_watch.py, the doctor, ``status`` |
| one line of the membership loop | ``MembersLine`` (+ ``RouterProcess``) | ``poll ... members`` | ``MembershipWait`` |
| stopping the router | ``StopAnswer`` | ``stop-router`` | ``down`` (its ``DownRouter``) |
| the request through the router | ``EndToEnd`` | (POST /generate body) | the run's report |

fleet_ops.py is deployctl's own program (stdlib, sent inline): its envelope is parsed strictly (no
coercion, no unknown key), and anything else is a RemoteOutputError naming the router host, the
call and the field. The router's worker list is SGLang's (smg, sglang-router): only the four fields
deployctl reads are taken from each worker, each of its type, and the rest of the router's keys
(``model_id``, ``priority``, ...) are left alone.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import TypeAdapter, ValidationError

from deploy.base.errors import RemoteOutputError
from deploy.base.limits import parse_json
from deploy.host.records import Strict, shape_problem

A = TypeVar("A", bound=Strict)


class HttpAnswer(Strict):
    """``fleet_ops.py request``: an HTTP status (None: no answer), the body (cut at 1 MiB), why not."""

    status: int | None
    body: str
    error: str | None = None
    #: refused | timeout | other (fleet_ops.py _kind), with ``error``
    error_kind: Literal["refused", "timeout", "other"] | None = None

    def why(self, limit: int = 200) -> str:
        """The answer in a message: the error, else the body's start."""
        return self.error or self.body[:limit]


class Worker(Strict):
    """One worker as the router lists it (GET /workers on smg and sglang-router 0.3.x; the legacy
    /list_workers has only URLs: each is its own id, healthy)."""

    id: str
    url: str
    is_healthy: bool
    load: int | float | None = None


class RouterState(Strict):
    """``fleet_ops.py router-state``: the router's PID file and process, and its worker list's answer
    (``workers``: parsed when it answered 200; None otherwise)."""

    pid: int | None
    alive: bool
    status: int | None = None
    body: str = ""
    #: the running router's command line (which package runs it), cut at 300 characters
    cmdline: str = ""
    #: why the PID file's process is not the router, or is not ours
    note: str = ""
    workers: list[Worker] | None = None


class RouterProcess(Strict):
    """The router's process in a membership line (the PID file's PID, whether it runs)."""

    pid: int | None
    alive: bool


class MembersLine(Strict):
    """One line of ``fleet_ops.py poll SECONDS members``: the process and the worker list's GET."""

    state: RouterProcess
    workers: HttpAnswer


class StopAnswer(Strict):
    """``fleet_ops.py stop-router``: the PID it found, whether it stopped and by which signal, or why not."""

    pid: int | None
    stopped: bool
    signal: Literal["TERM", "KILL"] | None
    note: str


class EndToEnd(Strict):
    """The request through the router answered: its text's start (the run's report keeps it)."""

    text: str


class DownRouter(Strict):
    """What ``down`` did to a run's router (``DownResult.router``, printed under ``router`` by ``--json``):
    the downed replicas taken out (``down --host``) or the router stopped (the whole run), or the error."""

    host: str
    pid: int | None = None
    stopped: bool | None = None
    signal: Literal["TERM", "KILL"] | None = None
    removed: list[str] | None = None
    note: str | None = None
    error: str | None = None
    exit_code: int | None = None

    def document(self) -> dict[str, Any]:
        """The JSON ``down --json`` has always printed: ``host``, then the phase's keys in its order
        (the removal's ``stopped, removed, note``; the stop's ``pid, stopped, signal, note``), then the error."""
        given = super().document()
        order: tuple[str, ...]
        if self.removed is not None:
            order = ("host", "stopped", "removed", "note")
        else:
            order = ("host", "pid", "stopped", "signal", "note")
        return {k: given[k] for k in (*order, "error", "exit_code") if k in given}


#: a worker list, each worker strictly (an error names its index: ``workers.1.is_healthy``)
WORKERS = TypeAdapter(list[Worker])


def answer_of(model: type[A], document: Any, source: str, what: str) -> A:
    """``document`` (one parsed line of fleet_ops.py ``what``) as ``model``, or a RemoteOutputError naming
    ``source`` (the router host), the call and the first field that is not as expected."""
    try:
        if not isinstance(document, dict):
            raise RemoteOutputError(f"{source}: fleet_ops.py {what} printed unexpected output: (the document): "
                                    f"a JSON object expected, got {type(document).__name__}")
        return model.model_validate(document)
    except ValidationError as exc:
        raise RemoteOutputError(f"{source}: fleet_ops.py {what} printed unexpected output: {shape_problem(exc)}: "
                                f"{json.dumps(document)[:300]}") from None


def parse_workers(body: str, source: str) -> list[Worker]:
    """GET /workers (0.3.x, smg) -> its workers; legacy /list_workers ``{"urls": [...]}`` -> each URL,
    healthy (that API lists no health)."""
    try:
        document = parse_json(body)
        if not isinstance(document, dict):
            raise ValueError("not an object")
        if "workers" in document:
            entries = document["workers"]
            if not isinstance(entries, list) or not all(isinstance(w, dict) for w in entries):
                raise ValueError("workers is not a list of objects")
            workers = WORKERS.validate_python([{k: w[k] for k in ("id", "url", "is_healthy", "load") if k in w}
                                               for w in entries])
        else:
            urls = document["urls"]
            if not isinstance(urls, list):
                raise ValueError("urls is not a list")
            workers = [Worker(id=u, url=u, is_healthy=True) for u in urls]
    except ValidationError as exc:
        raise RemoteOutputError(f"{source}: the router's worker list is not what sglang-router sends: "
                                f"workers.{shape_problem(exc)}: {body[:300]!r}") from None
    except (ValueError, KeyError, TypeError, RecursionError):
        raise RemoteOutputError(f"{source}: the router's worker list is not what sglang-router sends: {body[:300]!r}") from None
    return workers


def parse_loads(body: str, source: str) -> int:
    """SGLang GET /v1/loads -> requests running or waiting over every DP rank."""
    try:
        loads = parse_json(body)["loads"]
        if not isinstance(loads, list) or not loads:
            raise ValueError("no loads")
        return sum(int(entry["num_running_reqs"]) + int(entry.get("num_waiting_reqs", 0)) for entry in loads)
    except (ValueError, KeyError, TypeError, RecursionError):
        raise RemoteOutputError(f"{source}: /v1/loads answered {body[:300]!r}; expected SGLang's "
                                '{"loads": [{"num_running_reqs": N, ...}]}') from None


def parse_router_state(document: Any, source: str) -> RouterState:
    """``fleet_ops.py router-state`` -> RouterState, its worker list parsed when the router answered 200."""
    state = answer_of(RouterState, document, source, "router-state")
    if state.workers is None and state.alive and state.status == 200:
        return state.but(workers=[w.model_dump(exclude_unset=True) for w in parse_workers(state.body, source)])
    return state
