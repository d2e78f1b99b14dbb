"""Round 4 (issue 38): what the drafter swap's sender (deploy/remote/drafter_swap.py send) gets back.

Before: a deep JSON answer from ``/model_info`` or ``/end_weight_update`` was a RecursionError in
the sender (deployctl said "drafter swap failed with exit code 1: ^^^^^^^^^"), a ``weight_version``
of another type a RemoteOutputError (exit 5), a signal a traceback: in each case deployment.json
still named the old drafter while the server held new, unverified weights. Now every answer, at
every call (server_info, begin, update, end, model_info), ends in one JSON summary that deployctl's
strict parser reads, saying whether tensors went out; a signal at each phase likewise.

A local HTTP server (loopback) stands in for SGLang and answers one call with each hostile body.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.facts.drafter_swap import parse_send
from deploy.remote import drafter_swap as sender
from tests.sim_python import sim_env, sim_python

FINGERPRINT = "f" * 64
CALLS = ("server_info", "begin_weight_update", "update_weights_from_tensor", "end_weight_update", "model_info")
#: the calls after which tensors have gone out (the server may hold the new drafter)
SENT_AT = {"server_info": False, "begin_weight_update": False, "update_weights_from_tensor": True,
           "end_weight_update": True, "model_info": True}
DEEP = 100_000


def _deep(n: int, kind: str = "list") -> bytes:
    if kind == "dict":
        return b'{"a":' * n + b"1" + b"}" * n
    return b"[" * n + b"]" * n


def _deep_in(key: str, n: int) -> bytes:
    return b'{"%s": ' % key.encode() + _deep(n) + b"}"


#: name -> (status, body bytes, or a callable writing the raw answer itself)
ANSWERS = {
    "deep-list-100k": (200, _deep(DEEP)),
    "deep-dict-100k": (200, _deep(DEEP, "dict")),
    "deep-65-levels": (200, _deep(65)),
    "deep-900-levels": (200, _deep(900)),
    "deep-success-field": (200, _deep_in("success", DEEP)),
    "deep-message-field": (200, b'{"success": false, "message": ' + _deep(DEEP) + b"}"),
    "deep-message-900": (200, b'{"success": false, "message": ' + _deep(900) + b"}"),
    "deep-weight-version": (200, _deep_in("weight_version", 900)),
    "deep-on-error-status": (400, _deep(DEEP)),
    "not-json-html": (200, b"<html><body>502 Bad Gateway</body></html>"),
    "not-json-text": (200, b"OK"),
    "empty-body": (200, b""),
    "not-utf8": (200, b"\xff\xfe\x00garbage\x80"),
    "nul-bytes": (200, b"\x00" * 64),
    "json-list": (200, b"[1, 2, 3]"),
    "json-string": (200, b'"success"'),
    "json-number": (200, b"42"),
    "json-null": (200, b"null"),
    "json-true": (200, b"true"),
    "success-string": (200, b'{"success": "true", "message": "ok"}'),
    "success-number": (200, b'{"success": 1}'),
    "success-null": (200, b'{"success": null}'),
    "success-false": (200, b'{"success": false, "message": "nope"}'),
    "success-on-500": (500, b'{"success": true}'),
    "message-object": (200, b'{"success": false, "message": {"a": [1, {"b": 2}]}}'),
    "weight-version-int": (200, b'{"success": true, "weight_version": 12345}'),
    "weight-version-list": (200, b'{"success": true, "weight_version": ["' + FINGERPRINT.encode() + b'"]}'),
    "weight-version-dict": (200, b'{"success": true, "weight_version": {"v": "' + FINGERPRINT.encode() + b'"}}'),
    "weight-version-null": (200, b'{"success": true, "weight_version": null}'),
    "weight-version-bool": (200, b'{"success": true, "weight_version": true}'),
    "weight-version-huge": (200, b'{"success": true, "weight_version": "' + b"f" * 100_000 + b'"}'),
    "weight-version-other": (200, b'{"success": true, "weight_version": "default"}'),
    "weight-version-missing": (200, b'{"success": true}'),
    "huge-body-2mib": (200, b'{"success": true, "pad": "' + b"x" * (2 << 20) + b'"}'),
    "huge-body-exactly-limit": (200, b'{"success": true, "pad": "' + b"x" * ((1 << 20) - 28) + b'"}'),
    "nan": (200, b'{"success": NaN, "weight_version": NaN}'),
    "duplicate-keys": (200, b'{"success": false, "success": true, "weight_version": "x", "weight_version": 1}'),
    "status-404": (404, b'{"detail": "Not Found"}'),
    "status-401": (401, b'{"error": "unauthorized"}'),
    "status-503-html": (503, b"<html>unavailable</html>"),
    "not-http": ("raw", b"SSH-2.0-OpenSSH_9.6\r\n"),
    "truncated-body": ("raw", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"success\": tr"),
    "closed-without-answer": ("raw", b""),
    "header-flood": ("raw", b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n{}"),
}


#: the answers that are a success as SGLang writes one (200, a JSON object, "success": true)
SUCCESS_LIKE = {name for name, (status, body) in ANSWERS.items()
                if status == 200 and len(body) <= sender.MAX_ANSWER
                and isinstance(sender.parse_answer(body), dict) and sender.parse_answer(body).get("success") is True}


#: the answers /server_info may give and the session still go on: it is read only to know that the
#: keys work (a 200 with a JSON object), its content no longer chooses a payload format (issue 41)
OBJECT_LIKE = {name for name, (status, body) in ANSWERS.items()
               if status == 200 and len(body) <= sender.MAX_ANSWER and isinstance(sender.parse_answer(body), dict)}


def _good(path: str, weight_version: str) -> tuple[int, bytes]:
    if path == "/server_info":
        return 200, b'{"version": "0.5.23"}'
    if path == "/model_info":
        return 200, json.dumps({"weight_version": weight_version, "model_path": "/m"}).encode()
    return 200, b'{"success": true, "message": "Success"}'


class Stand(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hostile_call: str | None, answer, on_call=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.hostile_call, self.answer, self.on_call = hostile_call, answer, on_call
        self.calls: list[str] = []
        self.auth: list[tuple[str, str | None]] = []

    def handle_error(self, request, client_address):
        pass  # the sender stopped reading a huge answer: the stand's broken pipe is not the test's business

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _serve(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        stand: Stand = self.server  # type: ignore[assignment]
        call = self.path.strip("/")
        stand.calls.append(call)
        stand.auth.append((call, self.headers.get("Authorization")))
        if stand.on_call is not None:
            stand.on_call(call)
        if call == stand.hostile_call:
            status, body = stand.answer
        else:
            status, body = _good(self.path, FINGERPRINT)
        if status == "raw":
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_GET = _serve
    do_POST = _serve


def _drafter(tmp: Path) -> Path:
    model = tmp / "drafter"
    model.mkdir()
    header = json.dumps({"model.layers.0.w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    (model / "config.json").write_text("{}")
    return model


def _args(url: str, tmp: Path) -> SimpleNamespace:
    return SimpleNamespace(url=url, drafter=str(_drafter(tmp)), weight_version=FINGERPRINT, tp=2, base_gpu_id=0,
                           state_dir=str(tmp), timeout=20.0)


@pytest.fixture(autouse=True)
def _stand_in_python():
    """The sender's one payload path imports torch, safetensors.torch and sglang.srt.utils: the
    sandbox's stand-ins (issue 41), as a sandbox host has them on its python path."""
    with sim_python():
        yield


def _serve(stand: Stand):
    thread = threading.Thread(target=stand.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("answer", sorted(ANSWERS))
@pytest.mark.parametrize("call", CALLS)
def test_every_hostile_answer_at_every_call_ends_in_a_summary_deployctl_reads(tmp_path, call, answer, capsys):
    stand = Stand(call, ANSWERS[answer])
    _serve(stand)
    try:
        summary = sender.run_send(_args(stand.url, tmp_path))
    finally:
        stand.shutdown()
        stand.server_close()
    line = json.dumps(summary, sort_keys=True)
    parsed = parse_send(line, "gpu-a")  # deployctl's strict parser: never a RemoteOutputError
    assert "Traceback" not in capsys.readouterr().err
    assert len(parsed.message) <= 500
    assert "RecursionError" not in parsed.message and "the sender failed" not in parsed.message, parsed.message
    # an answer that IS a success (a dict, "success": true, 200) lets that call succeed: begin, update
    # and end then go on to a verified swap; /model_info never verifies with a hostile answer
    success_like = answer in SUCCESS_LIKE
    expect_verified = (call in ("begin_weight_update", "update_weights_from_tensor", "end_weight_update") and success_like
                       or call == "server_info" and answer in OBJECT_LIKE)
    verified = parsed.ok and parsed.weight_version == FINGERPRINT
    assert verified is expect_verified, parsed
    # another weight_version is the one "ok" summary: the step compares it with the fingerprint
    assert parsed.ok is verified or parsed.weight_version not in (None, FINGERPRINT), parsed
    # tensors went out iff the session got as far as the update
    server_info_ok = call == "server_info" and answer in OBJECT_LIKE
    assert parsed.sent is (SENT_AT[call] or (call == "begin_weight_update" and success_like) or server_info_ok), parsed
    # end_weight_update is called (once) whenever begin succeeded
    begun = (call != "server_info" or server_info_ok) and (call != "begin_weight_update" or success_like)
    assert stand.calls.count("end_weight_update") == (1 if begun else 0), stand.calls


@pytest.mark.parametrize("call", ["begin_weight_update", "update_weights_from_tensor", "end_weight_update", "model_info"])
def test_a_good_answer_everywhere_but_one_wrong_weight_version_is_not_verified(tmp_path, call):
    """Control: the same stand with good answers verifies (the matrix above is not vacuous)."""
    stand = Stand(None, None)
    _serve(stand)
    try:
        summary = sender.run_send(_args(stand.url, tmp_path))
    finally:
        stand.shutdown()
        stand.server_close()
    parsed = parse_send(json.dumps(summary), "gpu-a")
    assert parsed.ok and parsed.sent and parsed.ended and parsed.weight_version == FINGERPRINT
    # /flush_cache (best effort, issue 41) between the end and /model_info
    assert stand.calls == [*CALLS[:4], "flush_cache", CALLS[4]]


@pytest.mark.parametrize("depth", [64, 65, 200, 5000, DEEP])
def test_parse_answer_bounds_the_depth_and_never_recurses(depth):
    value = sender.parse_answer(_deep(depth))
    if depth <= sender.MAX_ANSWER_DEPTH:
        assert isinstance(value, list)
    else:
        assert value == f"a JSON answer nested more than {sender.MAX_ANSWER_DEPTH} levels deep"


# -- signals: the sender as its own process, signalled at each phase -----------------------------------


SIGNAL_AT = ["server_info", "begin_weight_update", "update_weights_from_tensor", "end_weight_update", "model_info"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("phase", SIGNAL_AT)
def test_a_signal_at_each_phase_ends_the_session_and_says_whether_tensors_went_out(tmp_path, phase, signum):
    proc_box: dict = {}
    hold = threading.Event()

    def on_call(call):
        if call == phase and not hold.is_set():
            hold.set()
            os.kill(proc_box["proc"].pid, signum)
            if call == "end_weight_update":
                time.sleep(0.3)  # the end holds a signal back until it has its answer: answer it
                return
            # no answer before the sender has ended (its session's end is served by another thread):
            # however late the signal is handled, it is handled inside this call
            deadline = time.monotonic() + 20
            while proc_box["proc"].poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)

    stand = Stand(None, None, on_call)
    _serve(stand)
    args = _args(stand.url, tmp_path)
    try:
        proc = subprocess.Popen([sys.executable, sender.__file__, "send", "--url", args.url, "--drafter", args.drafter,
                                 "--weight-version", FINGERPRINT, "--tp", "2", "--state-dir", str(tmp_path),
                                 "--timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=sim_env())
        proc_box["proc"] = proc
        out, err = proc.communicate(timeout=60)
    finally:
        stand.shutdown()
        stand.server_close()
    assert hold.is_set()
    if signum == signal.SIGKILL:
        # nothing can be said from inside: deployctl reads no summary (the step marks the record
        # swap-failed whenever the send's outcome is unknown, tests/unit/test_swap_failure_records.py)
        assert proc.returncode == -signal.SIGKILL and out == ""
        return
    assert "Traceback" not in err, err
    parsed = parse_send(out, "gpu-a")
    name = signal.Signals(signum).name
    assert proc.returncode == 0
    assert parsed.sent is SENT_AT[phase] and not parsed.ok, parsed
    assert f"interrupted by {name}" in parsed.message, parsed
    # a session that was (or may have been) opened is ended, once; none before begin
    assert stand.calls.count("end_weight_update") == (0 if phase == "server_info" else 1), stand.calls
    assert parsed.ended is (phase in ("update_weights_from_tensor", "end_weight_update", "model_info"))


def test_connection_refused_is_a_summary_too(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    parsed = parse_send(json.dumps(sender.run_send(_args(f"http://127.0.0.1:{port}", tmp_path))), "gpu-a")
    assert parsed.stage == "server_info" and not parsed.sent and parsed.http_status == 0


def test_the_sender_called_in_process_leaves_the_callers_signal_handlers_as_they_were(tmp_path):
    """run_send turns signals into Interrupted while it runs; only the sender's own process (main)
    keeps them ignored afterwards. In-process, a leaked SIG_IGN of SIGTERM made every child the
    caller started later immune to SIGTERM (a router stand-in in another test survived it)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    sender.run_send(_args(f"http://127.0.0.1:{port}", tmp_path))
    assert {s: signal.getsignal(s) for s in before} == before


# -- issue 41: keys, the lock's stall, "not flushed" ---------------------------------------------------


@pytest.mark.parametrize("flags, normal, admin", [
    ([], None, None),
    (["--admin-api-key", "adm"], None, "Bearer adm"),
    (["--api-key", "api"], "Bearer api", "Bearer api"),
    (["--api-key", "api", "--admin-api-key=adm"], "Bearer api", "Bearer adm"),
])
def test_each_route_gets_the_key_sglangs_decide_request_auth_wants(tmp_path, flags, normal, admin):
    """NORMAL routes (/server_info, /model_info): --api-key; ADMIN_OPTIONAL ones (the session): the
    admin key when set, else the API key (srt/utils/auth.py, 0.5.21 = 0.5.23). Before issue 41
    /server_info and /model_info were sent no key and the session the admin key only: a server with
    --api-key answered 401 at /server_info and, without an admin key, at begin_weight_update."""
    (tmp_path / "deployment.json").write_text(json.dumps({"argv": ["python3", "-m", "sglang.launch_server"] + flags}))
    stand = Stand(None, None)
    _serve(stand)
    try:
        parsed = parse_send(json.dumps(sender.run_send(_args(stand.url, tmp_path))), "gpu-a")
    finally:
        stand.shutdown()
        stand.server_close()
    assert parsed.ok
    assert stand.auth == [("server_info", normal), ("begin_weight_update", admin), ("update_weights_from_tensor", admin),
                          ("end_weight_update", admin), ("flush_cache", admin), ("model_info", normal)]


def test_the_summary_says_how_long_each_locked_call_held_requests(tmp_path):
    """Each of begin, update and end takes SGLang's model-update writer lock (tokenizer_control_mixin.py,
    0.5.21 - 0.5.23): the sender's own timing of the three calls is the stall it reports."""
    stand = Stand(None, None, lambda call: time.sleep(0.3) if call == "update_weights_from_tensor" else None)
    _serve(stand)
    try:
        parsed = parse_send(json.dumps(sender.run_send(_args(stand.url, tmp_path))), "gpu-a")
    finally:
        stand.shutdown()
        stand.server_close()
    assert parsed.ok and set(parsed.held) == {"begin", "update", "end"}
    assert parsed.held["update"] >= 0.3 and parsed.held_s == pytest.approx(sum(parsed.held.values()), abs=0.002)
    assert parsed.held_s <= parsed.seconds + 0.01 or parsed.seconds == 0.0


def test_not_flushed_is_a_failed_update_with_the_weights_sent(tmp_path):
    """Real SGLang answers 400 "Weights were updated, but the cache was not flushed ..." and, the call
    having failed, does not record weight_version (tokenizer_control_mixin.py): before issue 41 the
    sender counted the weights as loaded and expected /model_info to name them."""
    not_flushed = (400, json.dumps({"success": False, "message": "Weights were updated, but the cache was not flushed "
                                    "because requests are still running or queued. Retract or finish them, then call "
                                    "/flush_cache."}).encode())
    stand = Stand("update_weights_from_tensor", not_flushed)
    _serve(stand)
    try:
        parsed = parse_send(json.dumps(sender.run_send(_args(stand.url, tmp_path))), "gpu-a")
    finally:
        stand.shutdown()
        stand.server_close()
    assert not parsed.ok and parsed.sent and parsed.ended and parsed.stage == "update" and not parsed.flushed
    assert parsed.message.startswith("Weights were updated, but the cache was not flushed")
    assert "model_info" not in stand.calls and "flush_cache" not in stand.calls


def test_the_update_does_not_flush_and_a_refused_flush_does_not_fail_the_swap(tmp_path):
    """flush_cache false on the update (0.5.21's scheduler asserts a refused flush, 0.5.23 fails the update
    without recording weight_version); /flush_cache afterwards, a 400 reported as flushed: false."""
    bodies: dict = {}
    stand = Stand("flush_cache", (400, b"Cache not flushed."))

    class Recording(Handler):
        def _serve(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            bodies[self.path] = json.loads(raw) if raw else None
            self.headers.replace_header("Content-Length", "0") if length else None
            return Handler._serve(self)

        do_GET = _serve
        do_POST = _serve

    stand.RequestHandlerClass = Recording
    _serve(stand)
    try:
        parsed = parse_send(json.dumps(sender.run_send(_args(stand.url, tmp_path))), "gpu-a")
    finally:
        stand.shutdown()
        stand.server_close()
    assert bodies["/update_weights_from_tensor"]["flush_cache"] is False
    assert parsed.ok and parsed.weight_version == FINGERPRINT and not parsed.flushed
