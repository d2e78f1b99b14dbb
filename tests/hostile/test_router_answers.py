"""The router host's answers are typed at the boundary (deploy/facts/router.py, issue 37).

What fleet_ops.py prints on the router host (an HTTP request's outcome, the router's state, a
membership line, a stop) and the router's worker list inside it used to travel as dicts read by
string key (``w["url"]``, ``got.get("stopped")``): a field of another type was read as something
else (``"alive": "no"`` is truthy) or failed deep inside a phase with a traceback. Each is now one
strict model parsed where the answer arrives.

Generated, per answer and per field: a value of another type, the field missing (a required one),
an unknown field; each is refused through ``RouterHost`` (the boundary the run uses) with a
RemoteOutputError (exit 5) naming the router host and the field. The valid documents are what
fleet_ops.py itself prints here (so the host writer and the models stay tied).
"""

from __future__ import annotations

import json
import typing
from types import SimpleNamespace

import pytest

from deploy.base.errors import ExitCode, RemoteOutputError
from deploy.config.models import Host, RouterSpec, Run
from deploy.facts.router import (DownRouter, HttpAnswer, MembersLine, RouterState, StopAnswer, Worker,
                                 parse_workers)
from deploy.fleet.router import RouterHost
from deploy.fleet.router_package import RouterPackage
from deploy.host.records import Strict
from deploy.remote import fleet_ops

HOST = "router-host-7"
URL = "http://127.0.0.1:9"  # discard: nothing listens, the request is refused


class Conn:
    """The router host's connection: every one-shot command answers ``answer``; a host-side loop
    prints ``answer`` as its one line."""

    cancelled = None

    def __init__(self, answer: object):
        self.line = json.dumps(answer)

    def check(self, command, timeout=None, what=None):
        return SimpleNamespace(stdout=self.line + "\n", stderr="", exit_code=0)

    run = check

    def watch(self, command, on_line, timeout=None, cancelled=None):
        on_line(self.line)
        return SimpleNamespace(exit_code=None, stderr="")


def router_over(answer: object) -> RouterHost:
    run = Run(name="r", hosts=[HOST], base_model="/m", drafter="/d", router=RouterSpec(host=HOST, startup_timeout_s=1))
    router = RouterHost(Conn(answer), Host(name=HOST, address="10.0.0.7"), run)
    router._package = RouterPackage("smg", "1.13.0")
    return router


def valid_documents(tmp_path) -> dict[str, dict]:
    """Each answer as fleet_ops.py prints it on a host with no router and nothing listening."""
    pidfile = str(tmp_path / "router.pid")
    return {"request": fleet_ops.request("GET", URL + "/health", None, 1),
            "router-state": fleet_ops.router_state(pidfile, URL + "/workers", 1),
            "stop-router": fleet_ops.stop_router(pidfile, 1),
            "poll members": fleet_ops.members(pidfile, URL + "/workers", 1)}


#: each answer: its model and the RouterHost call that reads it
READS = {
    "request": (HttpAnswer, lambda r: r.healthy(URL)),
    "router-state": (RouterState, lambda r: r.state()),
    "stop-router": (StopAnswer, lambda r: r.stop()),
    "poll members": (MembersLine, lambda r: r.wait_members({URL})),
}


def accepts_str(annotation) -> bool:
    return str in (typing.get_args(annotation) or (annotation,))


def wrong_value(annotation) -> object:
    """A value of another type than the field takes: a number where text goes, text elsewhere
    (strict: "12" is not 12, not True, not a list or an object)."""
    return 12 if accepts_str(annotation) else "12"


def bad_shapes(model, document: dict, path: tuple[str, ...] = ()):
    """(id, the document made wrong, the field the error must name) for every field of ``model``."""
    for name, field in model.model_fields.items():
        where = ".".join((*path, name))
        nested = field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, Strict) else None
        yield f"{where}: another type", document | {name: wrong_value(field.annotation)}, name
        if field.is_required():
            yield f"{where}: missing", {k: v for k, v in document.items() if k != name}, name
        if nested is not None:
            for case, changed, named in bad_shapes(nested, document[name], (*path, name)):
                yield case, document | {name: changed}, named
    yield f"{'.'.join(path) or '(the answer)'}: an unknown field", document | {"surprise": 1}, "surprise"


def cases():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        documents = valid_documents(Path(tmp))
    for what, (model, _) in READS.items():
        for case, document, field in bad_shapes(model, documents[what]):
            yield pytest.param(what, document, field, id=f"{what} {case}")


@pytest.mark.parametrize("what,document,field", list(cases()))
def test_a_router_answer_of_another_shape_names_the_host_and_the_field(what, document, field):
    model, read = READS[what]
    with pytest.raises(RemoteOutputError) as refused:
        read(router_over(document))
    message = str(refused.value)
    assert message.startswith(f"{HOST}: fleet_ops.py {what} printed unexpected output: "), message
    assert f"{field}:" in message or f".{field}:" in message, message
    assert refused.value.exit_code == ExitCode.REMOTE_OUTPUT


def test_what_fleet_ops_prints_is_read_as_its_model(tmp_path):
    # the valid documents the bad shapes start from are read as they are (the cases above can fail only
    # on what they change)
    documents = valid_documents(tmp_path)
    assert router_over(documents["request"]).healthy(URL) is False
    state = router_over(documents["router-state"]).state()
    assert state == RouterState(pid=None, alive=False, status=None, body="", cmdline="", note=state.note)
    assert router_over(documents["stop-router"]).stop() == StopAnswer(pid=None, stopped=False, signal=None,
                                                                       note=documents["stop-router"]["note"])
    assert MembersLine.model_validate(documents["poll members"]).workers.error_kind == "refused"


WORKER = {"id": "019d", "url": "http://10.0.0.1:30000", "is_healthy": True, "load": 0}


def worker_cases():
    for name, field in Worker.model_fields.items():
        yield pytest.param(WORKER | {name: wrong_value(field.annotation)}, name, id=f"{name}: another type")
        if field.is_required():
            yield pytest.param({k: v for k, v in WORKER.items() if k != name}, name, id=f"{name}: missing")


@pytest.mark.parametrize("worker,field", list(worker_cases()))
def test_a_worker_of_another_shape_in_the_routers_list_names_the_host_and_the_field(worker, field):
    router = router_over({"status": 200, "body": json.dumps({"workers": [WORKER, worker]})})
    with pytest.raises(RemoteOutputError) as refused:
        router.workers()
    message = str(refused.value)
    assert message.startswith(f"{HOST}: the router's worker list is not what sglang-router sends: "), message
    assert f"workers.1.{field}" in message, message


def test_the_routers_own_keys_beside_a_workers_four_are_left_alone():
    # smg and sglang-router list more per worker (model_id, priority, metadata, ...): not deployctl's to refuse
    body = json.dumps({"workers": [WORKER | {"model_id": "/m", "priority": 50, "metadata": {"tp_size": "8"}}],
                       "total": 1})
    assert parse_workers(body, HOST) == [Worker(**WORKER)]
    assert router_over({"status": 200, "body": body}).workers() == [Worker(**WORKER)]


def test_downs_router_json_keeps_its_keys_in_their_order():
    # down --json printed a dict built up phase by phase: the typed record prints the same keys, in order
    removed = DownRouter(host="a").but(stopped=False, removed=["http://b:1"], note="kept")
    assert list(removed.document()) == ["host", "stopped", "removed", "note"]
    stopped = DownRouter(host="a").but(pid=7, stopped=True, signal="TERM", note="")
    assert json.dumps(stopped.document()) == '{"host": "a", "pid": 7, "stopped": true, "signal": "TERM", "note": ""}'
    failed = DownRouter(host="a").but(error="x", exit_code=1)
    assert failed.document() == {"host": "a", "error": "x", "exit_code": 1}
