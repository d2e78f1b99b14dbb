"""SIMULATED weight-update session (deployctl sandbox TEST DOUBLE), modelled on SGLang 0.5.21 - 0.5.23.

Read from the 0.5.23 wheel: ``srt/entrypoints/http_server.py`` (routes ``/begin_weight_update``,
``/update_weights_from_tensor``, ``/end_weight_update``, all ``@auth_level(AuthLevel.ADMIN_OPTIONAL)``),
``srt/managers/scheduler_components/weight_updater.py`` (``SchedulerWeightUpdaterManager``: the session,
its messages, ``_parse_runner_selector``, weight_version recorded before the cache flush),
``srt/managers/tp_worker.py`` (``deserialize_own_rank``: rank r reads entry r only),
``srt/utils/auth.py`` (``decide_request_auth``). The 0.5.20 wheel has no session routes (404 here).

Faithful:
- A session per server: begin (``selector`` target|draft|all, default all), updates, end. An update
  outside a session and a second begin fail with SGLang's messages (HTTP 400, ``success: false``).
- ``serialized_named_tensors`` holds one payload per TP rank; each rank decodes its own entry (base64).
- ``weight_version`` is recorded on success, before the cache flush; ``flush_cache`` (default true)
  refused because requests are running fails the call with SGLang's message although the weights
  were updated (the caller must then treat the server as changed).
- Auth (ADMIN_OPTIONAL): with ``--admin-api-key`` the request needs ``Authorization: Bearer KEY``
  (401 ``{"error": "Unauthorized"}`` otherwise); without one, anyone may call.
- A draft update goes through the stand-in's loader rules (``draft_weights_effect`` in
  launch_server.py, the same as at launch): a tensor the loader would drop is dropped.

Not faithful (no GPU, no torch):
- The payload is not SGLang's (``MultiprocessingSerializer``: a ForkingPickler pickle whose CUDA
  tensors are IPC handles). Each entry is base64 of JSON in the stand-in format ``FORMAT``:
  ``{"format", "rank", "headers": {file: safetensors header}, "markers": {name: text}}`` -- what the
  stand-in's acceptance model reads from a drafter directory at launch. deployctl's host-side sender
  produces it only when the server says it is the stand-in (``/server_info`` ``simulated: true``).
  A payload that is not this format, or an entry whose ``rank`` is not the reader's, fails the call.
- Only ``selector: draft`` loads anything; target or all answer 400 (the stand-in has no target weights).
- The time a load takes is ``SGLANG_SIM_SWAP_SECONDS`` (default 0.5 s), whatever the drafter's size.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import threading
import time

FORMAT = "deployctl-sim-drafter/1"
WEIGHT_UPDATE_PATHS = ("/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update")
SESSION_SINCE = (0, 5, 21)
SELECTORS = ("target", "draft", "all")
OUTSIDE_SESSION = ("update_weights_from_tensor must run between begin_weight_update() and end_weight_update()")
ALREADY_OPEN = "a weight-update session is already open; call end_weight_update() first"
NOT_OPEN = "no weight-update session is open; call begin_weight_update() first"
NOT_FLUSHED = ("Weights were updated, but the cache was not flushed because requests are still running or "
               "queued. Retract or finish them, then call /flush_cache.")


def _version(text: str) -> tuple[int, ...]:
    digits = []
    for part in text.split(".")[:3]:
        num = "".join(ch for ch in part if ch.isdigit())
        digits.append(int(num) if num else 0)
    return tuple(digits + [0] * (3 - len(digits)))


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


class WeightUpdater:
    """The scheduler's weight-update manager, one per server (replicated per rank in SGLang)."""

    def __init__(self, engine, version: str) -> None:
        self.engine = engine
        self.has_session = _version(version) >= SESSION_SINCE
        self.session: str | None = None
        self.lock = threading.Lock()

    def serves(self, path: str) -> bool:
        # 0.5.20 and older have no session routes; /update_weights_from_tensor without a selector
        # existed there, but deployctl never calls it (it cannot target the draft alone)
        return self.has_session

    def _authorised(self, header: str | None) -> bool:
        key = self.engine.args.admin_api_key
        if not key:
            return True
        parts = (header or "").split(" ", 1)
        return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == key

    def handle(self, path: str, body: dict | None, authorization: str | None) -> tuple[int, dict]:
        if not self._authorised(authorization):
            return 401, {"error": "Unauthorized"}
        if body is None:
            return 400, {"detail": [{"type": "json_invalid", "msg": "JSON decode error"}]}
        with self.lock:  # the scheduler handles one request at a time
            if path == "/begin_weight_update":
                return self._begin(body)
            if path == "/end_weight_update":
                return self._end()
            return self._update(body)

    @staticmethod
    def _answer(success: bool, message: str) -> tuple[int, dict]:
        return (200 if success else 400), {"success": success, "message": message}

    def _begin(self, body: dict) -> tuple[int, dict]:
        selector = body.get("selector", "all")
        if selector not in SELECTORS:
            return 400, {"detail": [{"type": "literal_error", "loc": ["body", "selector"],
                                     "msg": "Input should be 'target', 'draft' or 'all'"}]}
        if self.session is not None:
            return self._answer(False, ALREADY_OPEN)
        self.session = selector
        return self._answer(True, "Success")

    def _end(self) -> tuple[int, dict]:
        if self.session is None:
            return self._answer(False, NOT_OPEN)
        self.session = None
        return self._answer(True, "Success")

    def _update(self, body: dict) -> tuple[int, dict]:
        entries = body.get("serialized_named_tensors")
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            return 400, {"detail": [{"type": "list_type", "loc": ["body", "serialized_named_tensors"],
                                     "msg": "Input should be a valid list of base64 strings"}]}
        selector = body.get("selector", "all")
        if selector not in SELECTORS:
            return 400, {"detail": [{"type": "literal_error", "loc": ["body", "selector"],
                                     "msg": "Input should be 'target', 'draft' or 'all'"}]}
        if self.session is None:
            return self._answer(False, OUTSIDE_SESSION)
        if selector != "draft":
            return self._answer(False, f"SIMULATION: selector {selector!r} is not modelled (the stand-in "
                                       "has no target weights); only 'draft'")
        tp = self.engine.args.tp_size
        payloads = []
        for rank in range(tp):  # deserialize_own_rank: each rank reads entry [tp_rank] only
            if rank >= len(entries):
                return self._answer(False, f"TP{rank}: list index out of range (serialized_named_tensors has "
                                           f"{len(entries)} entries for tp_size {tp})")
            payload, error = _decode(entries[rank], rank)
            if error:
                return self._answer(False, f"TP{rank}: {error}")
            payloads.append(payload)
        first = payloads[0]
        if any(p["headers"] != first["headers"] for p in payloads[1:]):
            return self._answer(False, "SIMULATION: the ranks received different drafters")
        delay = max(0.0, float(os.environ.get("SGLANG_SIM_SWAP_SECONDS", "0.5")))
        time.sleep(delay)
        names, digest = [], hashlib.sha256()
        for fname in sorted(first["headers"]):
            header = first["headers"][fname]
            digest.update(json.dumps(header, sort_keys=True).encode())
            names.extend(k for k in header if k != "__metadata__")
        self.engine.swap_draft(names, digest.hexdigest(), first["markers"])
        version = body.get("weight_version")
        if version is not None:
            self.engine.weight_version = str(version)
        _log(f"Update weights from tensor (selector=draft): {len(names)} tensors, weight_version={version}")
        if body.get("flush_cache", True) and not self.engine.flush():
            return self._answer(False, NOT_FLUSHED)
        return self._answer(True, "Success")


def _decode(entry: str, rank: int) -> tuple[dict, str | None]:
    try:
        raw = base64.b64decode(entry, validate=True)
        payload = json.loads(raw)
    except (binascii.Error, ValueError) as exc:
        return {}, f"cannot deserialize this rank's payload ({type(exc).__name__}); SIMULATION: the stand-in " \
                   f"reads only its own format {FORMAT!r}, not SGLang's MultiprocessingSerializer"
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return {}, f"SIMULATION: payload is not in the stand-in format {FORMAT!r}"
    if payload.get("rank") != rank:
        return {}, f"payload for rank {payload.get('rank')!r} read by TP{rank} (each rank reads its own entry)"
    headers, markers = payload.get("headers"), payload.get("markers", {})
    if not isinstance(headers, dict) or not headers or not all(isinstance(h, dict) for h in headers.values()):
        return {}, "SIMULATION: payload has no safetensors headers"
    if not isinstance(markers, dict) or not all(isinstance(v, str) for v in markers.values()):
        return {}, "SIMULATION: payload markers must map names to text"
    return {"headers": headers, "markers": markers}, None
