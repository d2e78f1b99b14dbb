"""Issue 41: the drafter swap against the real SGLang wheels (0.5.21 and 0.5.23), not the stand-in.

tests/bootstrap.sh downloads the two wheels into ``.sglang-wheels/`` (``pip download --no-deps``; never
installed). From each, these tests run ``srt/utils/auth.py`` itself (``decide_request_auth``: the module
imports nothing heavy, by SGLang's design) and read the rest with ``ast``: the routes' auth levels
(``srt/entrypoints/http_server.py``), the request classes' fields (``srt/managers/io_struct.py``), the
tokenizer's asserts, locks and when it records ``weight_version`` (``srt/managers/
tokenizer_control_mixin.py``), the scheduler's "not flushed" answer (``srt/managers/
scheduler_components/weight_updater.py``). A local HTTP server built from those facts answers the
product's sender (``deploy/remote/drafter_swap.py``, its one payload path through the sandbox's
stand-ins of torch and sglang.srt.utils).

Each of these failed on the sender and decision before issue 41: a server with ``--api-key`` answered
401 at /server_info (and with ``--api-key`` alone at begin_weight_update); ``--dp-size 2`` was a swap
(the tokenizer asserts dp_size == 1); "not flushed" was counted as loaded and then failed on
/model_info's weight_version.

Not covered here (it needs torch and SGLang's imports in a python 3.11 environment): the payload through
the real ``MultiprocessingSerializer.deserialize`` in another process, and the real session state
machine (``SchedulerWeightUpdaterManager``) driven with stub workers. The CUDA IPC reductions need a
GPU in any case: tests/device/swap_drafter_gpu.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.facts.drafter_swap import parse_send
from deploy.remote import drafter_swap as sender
from tests.sim_python import sim_python

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / ".sglang-wheels"
VERSIONS = ("0.5.21", "0.5.23")
FILES = {
    "auth": "sglang/srt/utils/auth.py",
    "http": "sglang/srt/entrypoints/http_server.py",
    "io": "sglang/srt/managers/io_struct.py",
    "mixin": "sglang/srt/managers/tokenizer_control_mixin.py",
    "updater": "sglang/srt/managers/scheduler_components/weight_updater.py",
    "manager": "sglang/srt/managers/tokenizer_manager.py",
}
FINGERPRINT = "f" * 64


def _missing(version: str) -> str:
    return f"{WHEELS}/sglang-{version}-*.whl missing: run tests/bootstrap.sh"


@pytest.fixture(scope="module", params=VERSIONS)
def wheel(request, tmp_path_factory):
    version = request.param
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    if not found:
        if os.environ.get("DEPLOYCTL_TEST_REQUIRE_SANDBOX") == "1":
            pytest.fail(_missing(version))
        pytest.skip(_missing(version))
    root = tmp_path_factory.mktemp(f"sglang-{version}")
    with zipfile.ZipFile(found[0]) as zf:
        for name in FILES.values():
            zf.extract(name, root)
    sources = {key: (root / name).read_text() for key, name in FILES.items()}
    spec = importlib.util.spec_from_file_location(f"sglang_{version.replace('.', '_')}_auth", root / FILES["auth"])
    auth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = auth  # its dataclasses look their module up
    spec.loader.exec_module(auth)  # the real decide_request_auth: stdlib only at import
    return SimpleNamespace(version=version, sources=sources, trees={k: ast.parse(v) for k, v in sources.items()},
                           auth=auth)


# ------------------------------------------------------------------------------ facts read from the wheel


def route_levels(tree: ast.Module) -> dict[str, str]:
    """path -> auth level name of every route in http_server.py (NORMAL when it has no @auth_level)."""
    levels: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        paths, level = [], "NORMAL"
        for deco in node.decorator_list:
            if not isinstance(deco, ast.Call):
                continue
            name = ast.unparse(deco.func)
            if name in ("app.get", "app.post", "app.api_route", "app.put") and deco.args and \
                    isinstance(deco.args[0], ast.Constant):
                paths.append(deco.args[0].value)
            if name == "auth_level" and deco.args:
                level = ast.unparse(deco.args[0]).split(".")[-1]
        for path in paths:
            levels[path] = level
    return levels


def request_fields(tree: ast.Module, cls: str) -> dict[str, str]:
    """field -> annotation source of an io_struct request class."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {n.target.id: ast.unparse(n.annotation) for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    raise AssertionError(f"{cls} not in io_struct.py")


def function(tree: ast.Module, name: str) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"{name} not found")


def refused_flush(tree: ast.Module) -> str:
    """What the scheduler does when an update asked to flush and it cannot (requests still there):
    0.5.23 answers the update "Weights were updated, but the cache was not flushed ..." (success false);
    0.5.21 ``assert flush_cache_success`` (an AssertionError in the scheduler's loop)."""
    flush = function(tree, "flush_cache_after_weight_update")
    for node in ast.walk(flush):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "not flushed" in node.value:
            return node.value
    if any(isinstance(n, ast.Assert) for n in ast.walk(flush)):
        return "assert"
    raise AssertionError("weight_updater.py's flush_cache_after_weight_update is neither as 0.5.21 nor as 0.5.23")


def test_the_routes_the_sender_calls_have_the_levels_the_sender_assumes(wheel):
    levels = route_levels(wheel.trees["http"])
    assert levels["/server_info"] == levels["/model_info"] == "NORMAL"
    for path in ("/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update", "/flush_cache"):
        assert levels[path] == "ADMIN_OPTIONAL", (wheel.version, path)


def test_the_stand_in_authenticates_exactly_as_the_wheels_decide_request_auth(wheel):
    with sim_python():
        from sglang.srt.utils import auth as stand_in
    levels = route_levels(wheel.trees["http"])
    keys = (None, "api", "adm")
    for path in ("/server_info", "/model_info", "/generate", "/begin_weight_update", "/update_weights_from_tensor",
                 "/end_weight_update", "/flush_cache", "/health", "/metrics"):
        level = getattr(wheel.auth.AuthLevel, levels.get(path, "NORMAL"))
        for api in (None, "api"):
            for admin in (None, "adm"):
                for key in keys:
                    header = None if key is None else f"Bearer {key}"
                    real = wheel.auth.decide_request_auth(method="POST", path=path, authorization_header=header,
                                                          api_key=api, admin_api_key=admin, auth_level=level).allowed
                    ours = stand_in.decide_request_auth(method="POST", path=path, authorization_header=header,
                                                        api_key=api, admin_api_key=admin)
                    assert ours == real, (wheel.version, path, api, admin, key)


def test_the_tokenizer_asserts_a_single_data_parallel_rank_and_the_decision_refuses_more(wheel):
    update = function(wheel.trees["mixin"], "update_weights_from_tensor")
    asserts = [ast.unparse(n.test) for n in ast.walk(update) if isinstance(n, ast.Assert)]
    assert any("dp_size == 1" in a for a in asserts), asserts
    from tests.unit.test_drafter_swap import ARGV, a_run, argv_of, desired, running, seen
    from deploy.steps.swap_decision import swap_decision

    for flags in (["--dp-size", "2"], ["--data-parallel-size", "2"], ["--dp-size=8"]):
        decision = swap_decision(a_run(), desired(argv=argv_of(desired()) + flags), running(argv=ARGV + flags), seen())
        assert decision.path == "reload" and "dp_size == 1" in decision.reason, (flags, decision)


def test_each_session_call_takes_the_writer_lock_that_every_request_reads(wheel):
    """What docs/drafter-swap.md says of the stall, against the code."""
    session_call = ast.unparse(function(wheel.trees["mixin"], "_weight_update_session_call"))
    assert "self.model_update_lock.writer_lock" in session_call
    for name in ("begin_weight_update", "end_weight_update"):
        assert "_weight_update_session_call" in ast.unparse(function(wheel.trees["mixin"], name))
    assert "self.model_update_lock.writer_lock" in ast.unparse(function(wheel.trees["mixin"], "update_weights_from_tensor"))
    assert "self.model_update_lock.reader_lock" in ast.unparse(function(wheel.trees["manager"], "generate_request"))
    doc = (REPO / "docs" / "drafter-swap.md").read_text()
    assert "`model_update_lock` **writer** lock" in doc and "waits until every in-flight request has finished" in doc


def test_weight_version_moves_only_when_the_update_succeeded(wheel):
    update = function(wheel.trees["mixin"], "update_weights_from_tensor")
    guarded = [n for n in ast.walk(update) if isinstance(n, ast.If) and "success" in ast.unparse(n.test)
               and "_update_weight_version_if_provided" in ast.unparse(n)]
    assert guarded, "the tokenizer records weight_version unconditionally: the sender's reading is wrong"


# ------------------------------------------------------------------------------ the sender against the facts


class Server(ThreadingHTTPServer):
    """Routes, auth levels, request fields and answers as the wheel has them."""

    daemon_threads = True

    def __init__(self, wheel, api_key=None, admin_api_key=None, busy=False):
        super().__init__(("127.0.0.1", 0), Handler)
        #: busy: the scheduler still has requests, so it refuses to flush
        self.wheel, self.api_key, self.admin_api_key, self.busy = wheel, api_key, admin_api_key, busy
        self.levels = route_levels(wheel.trees["http"])
        self.calls: list[tuple[str, int]] = []
        self.bodies: dict[str, dict] = {}
        self.weight_version = "default"
        self.session = False

    def handle_error(self, request, client_address):
        pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


CLASSES = {"/begin_weight_update": "BeginWeightUpdateReqInput", "/end_weight_update": "EndWeightUpdateReqInput",
           "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, status: int, body: dict) -> None:
        server: Server = self.server  # type: ignore[assignment]
        server.calls.append((self.path, status))
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(raw)
        self.close_connection = True

    def _serve(self) -> None:
        server: Server = self.server  # type: ignore[assignment]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        auth = server.wheel.auth
        level = getattr(auth.AuthLevel, server.levels.get(self.path, "NORMAL"))
        if not auth.decide_request_auth(method=self.command, path=self.path,
                                        authorization_header=self.headers.get("Authorization"),
                                        api_key=server.api_key, admin_api_key=server.admin_api_key,
                                        auth_level=level).allowed:
            return self._answer(401, {"error": "Unauthorized"})
        if self.path in CLASSES:
            fields = request_fields(server.wheel.trees["io"], CLASSES[self.path])
            unknown = set(body or {}) - set(fields)
            if unknown:
                return self._answer(422, {"detail": f"not fields of {CLASSES[self.path]}: {sorted(unknown)}"})
            server.bodies[self.path] = body or {}
        if self.path == "/server_info":
            return self._answer(200, {"version": server.wheel.version})
        if self.path == "/model_info":
            return self._answer(200, {"weight_version": server.weight_version, "model_path": "/m"})
        if self.path == "/begin_weight_update":
            server.session = True
            return self._answer(200, {"success": True, "message": "Success"})
        if self.path == "/end_weight_update":
            server.session = False
            return self._answer(200, {"success": True, "message": "Success"})
        if self.path == "/update_weights_from_tensor":
            if body.get("flush_cache", True) and server.busy:  # loaded; the flush refused
                refused = refused_flush(server.wheel.trees["updater"])
                if refused == "assert":  # 0.5.21: the scheduler's loop dies on the AssertionError
                    return self._answer(500, {"error": "AssertionError: Cache flush failed after updating weights"})
                return self._answer(400, {"success": False, "message": refused})  # weight_version not recorded
            server.weight_version = body.get("weight_version") or server.weight_version
            return self._answer(200, {"success": True, "message": "Success"})
        if self.path == "/flush_cache":  # ADMIN_OPTIONAL, no lock: refused (400) while requests run
            return self._answer(400 if server.busy else 200, {})
        return self._answer(404, {"detail": "Not Found"})

    do_GET = _serve
    do_POST = _serve


def _send(server: Server, tmp_path: Path, argv: list[str]):
    (tmp_path / "deployment.json").write_text(json.dumps({"argv": ["python3", "-m", "sglang.launch_server"] + argv}))
    drafter = tmp_path / "drafter"
    drafter.mkdir(exist_ok=True)
    header = json.dumps({"fc.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    (drafter / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    args = SimpleNamespace(url=server.url, drafter=str(drafter), weight_version=FINGERPRINT, tp=2, base_gpu_id=0,
                           state_dir=str(tmp_path), timeout=20.0)
    try:
        with sim_python():
            return parse_send(json.dumps(sender.run_send(args)), "gpu-a")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("keys", [{}, {"api_key": "A"}, {"admin_api_key": "M"}, {"api_key": "A", "admin_api_key": "M"}],
                         ids=["no-keys", "api-key", "admin-key", "both"])
def test_the_sender_passes_the_wheels_auth_on_every_route_it_calls(wheel, tmp_path, keys):
    argv = [word for flag, key in (("--api-key", "api_key"), ("--admin-api-key", "admin_api_key")) if key in keys
            for word in (flag, keys[key])]
    server = Server(wheel, **keys)
    parsed = _send(server, tmp_path, argv)
    assert parsed.ok and parsed.weight_version == FINGERPRINT, (wheel.version, keys, parsed, server.calls)
    assert all(status == 200 for _, status in server.calls), server.calls


def test_the_sender_s_bodies_are_the_wheels_request_classes(wheel, tmp_path):
    server = Server(wheel)
    assert _send(server, tmp_path, []).ok
    selector = request_fields(wheel.trees["io"], "BeginWeightUpdateReqInput")["selector"]
    assert server.bodies["/begin_weight_update"] == {"selector": "draft"} and "'draft'" in selector
    update = server.bodies["/update_weights_from_tensor"]
    fields = request_fields(wheel.trees["io"], "UpdateWeightsFromTensorReqInput")
    assert "Base64Bytes" in fields["serialized_named_tensors"] and "'draft'" in fields["selector"]
    assert len(update["serialized_named_tensors"]) == 2 and all(isinstance(e, str) for e in update["serialized_named_tensors"])
    assert update["selector"] == "draft" and update["flush_cache"] is False and update["weight_version"] == FINGERPRINT
    assert server.bodies["/end_weight_update"] == {}


def test_a_flush_the_scheduler_refuses_never_fails_the_update(wheel, tmp_path):
    """Requests still at the scheduler: an update with flush_cache true fails after loading the weights
    (0.5.23, weight_version not recorded) or kills the scheduler (0.5.21's assert). The sender asks the
    update not to flush and /flush_cache on its own afterwards: 400, nothing changed, reported."""
    refused = refused_flush(wheel.trees["updater"])
    assert refused == "assert" if wheel.version == "0.5.21" else refused.startswith(
        "Weights were updated, but the cache was not flushed")
    server = Server(wheel, busy=True)
    parsed = _send(server, tmp_path, [])
    assert server.bodies["/update_weights_from_tensor"]["flush_cache"] is False
    assert parsed.ok and parsed.weight_version == FINGERPRINT and not parsed.flushed, parsed
    assert ("/flush_cache", 400) in server.calls
