"""SIMULATED weight-update session (deployctl sandbox TEST DOUBLE), modelled on SGLang 0.5.21 - 0.5.23.

Read from the 0.5.21 and 0.5.23 wheels: ``srt/entrypoints/http_server.py`` (routes ``/begin_weight_update``,
``/update_weights_from_tensor``, ``/end_weight_update``, all ``@auth_level(AuthLevel.ADMIN_OPTIONAL)``),
``srt/managers/tokenizer_control_mixin.py`` (each call takes ``model_update_lock.writer_lock``; the
tokenizer records ``weight_version``, which ``/model_info`` reports, only when the call succeeded),
``srt/managers/scheduler_components/weight_updater.py`` (``SchedulerWeightUpdaterManager``: the session,
its messages, ``_parse_runner_selector``), ``srt/managers/tp_worker.py`` (``deserialize_own_rank``: rank r
reads entry r only, through ``MultiprocessingSerializer.deserialize``), ``srt/utils/auth.py``
(``decide_request_auth``), ``srt/utils/aio_rwlock.py`` (``RWLock``: writer-preferring). The 0.5.20
wheel has no session routes (404 here).

Faithful:
- A session per server: begin (``selector`` target|draft|all, default all), updates, end. An update
  outside a session and a second begin fail with SGLang's messages (HTTP 400, ``success: false``).
- The model-update lock: every begin, update and end waits until no request is in flight and holds
  new requests back (writer-preferring) until it has answered; ``/generate`` and the OpenAI routes
  hold the reader side for their whole answer, as ``TokenizerManager.generate_request`` does.
- ``serialized_named_tensors`` holds one payload per TP rank; rank r deserializes entry r only, with
  the stand-in's ``sglang.srt.utils.MultiprocessingSerializer`` (base64 of a ForkingPickler dump, as
  SGLang's): a list of ``(name, tensor)``.
- ``flush_cache`` (default true) refused because requests are running fails the call with SGLang's
  message although the weights were loaded; ``weight_version`` moves in ``/model_info`` only when the
  call succeeded (the tokenizer's ``_update_weight_version_if_provided`` runs on success only).
- Auth: ``decide_request_auth`` (srt/utils/auth.py here).
- A draft update goes through the stand-in's loader rules (``draft_weights_effect`` in
  launch_server.py, the same as at launch): a tensor the loader would drop is dropped.

Not faithful (no GPU, no torch):
- The tensors are the stand-in torch's (sandbox/sim_sglang/torch): a safetensors header entry and the
  file it came from, on a simulated device; the server reads the headers and SIMULATION markers from
  that file's directory (as a real rank maps the sender's GPU memory by its CUDA IPC handle).
- Only ``selector: draft`` loads anything; target or all answer 400 (the stand-in has no target weights).
- The time a load takes is ``SGLANG_SIM_SWAP_SECONDS`` (default 0.5 s), whatever the drafter's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time

WEIGHT_UPDATE_PATHS = ("/begin_weight_update", "/update_weights_from_tensor", "/end_weight_update")
SESSION_SINCE = (0, 5, 21)
SELECTORS = ("target", "draft", "all")
OUTSIDE_SESSION = ("update_weights_from_tensor must run between begin_weight_update() and end_weight_update()")
ALREADY_OPEN = "a weight-update session is already open; call end_weight_update() first"
NOT_OPEN = "no weight-update session is open; call begin_weight_update() first"
NOT_FLUSHED = ("Weights were updated, but the cache was not flushed because requests are still running or "
               "queued. Retract or finish them, then call /flush_cache.")
MARKERS = ("crash-during-load", "crash-on-generate", "accept-nothing", "decode-speed")


def _version(text: str) -> tuple[int, ...]:
    digits = []
    for part in text.split(".")[:3]:
        num = "".join(ch for ch in part if ch.isdigit())
        digits.append(int(num) if num else 0)
    return tuple(digits + [0] * (3 - len(digits)))


def _log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


class ModelUpdateLock:
    """SGLang's ``TokenizerManager.model_update_lock`` (``srt/utils/aio_rwlock.py`` RWLock, 0.5.21 -
    0.5.23), with threads: a request holds the reader side for its whole answer; a weight-update call
    waits for every reader to finish, and while it waits or runs no new reader gets in."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    def acquire_reader(self) -> None:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1

    def release_reader(self) -> None:
        with self._cond:
            self._readers -= 1
            self._cond.notify_all()

    def acquire_writer(self) -> None:
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
                self._writer = True
            finally:
                self._waiting_writers -= 1

    def release_writer(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


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

    def handle(self, path: str, body: dict | None) -> tuple[int, dict]:
        """One call, auth already decided (launch_server.py, srt/utils/auth.py)."""
        if body is None:
            return 400, {"detail": [{"type": "json_invalid", "msg": "JSON decode error"}]}
        gate = self.engine.model_update_lock
        gate.acquire_writer()  # tokenizer_control_mixin.py: async with self.model_update_lock.writer_lock
        try:
            with self.lock:  # the scheduler handles one request at a time
                if path == "/begin_weight_update":
                    return self._begin(body)
                if path == "/end_weight_update":
                    return self._end()
                return self._update(body)
        finally:
            gate.release_writer()

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
        base = self.engine.args.base_gpu_id
        loaded = []
        for rank in range(tp):  # deserialize_own_rank: each rank reads entry [tp_rank] only
            if rank >= len(entries):
                return self._answer(False, f"TP{rank}: list index out of range (serialized_named_tensors has "
                                           f"{len(entries)} entries for tp_size {tp})")
            named, error = _deserialize(entries[rank], base + rank)
            if error:
                return self._answer(False, f"TP{rank}: {error}")
            loaded.append(named)
        if any(sorted(n for n, _ in named) != sorted(n for n, _ in loaded[0]) for named in loaded[1:]):
            return self._answer(False, "SIMULATION: the ranks received different drafters")
        headers, markers, error = _read_sources(loaded[0])
        if error:
            return self._answer(False, f"TP0: {error}")
        delay = max(0.0, float(os.environ.get("SGLANG_SIM_SWAP_SECONDS", "0.5")))
        time.sleep(delay)
        names, digest = [], hashlib.sha256()
        for fname in sorted(headers):
            header = headers[fname]
            digest.update(json.dumps(header, sort_keys=True).encode())
            names.extend(k for k in header if k != "__metadata__")
        self.engine.swap_draft(names, digest.hexdigest(), markers)
        version = body.get("weight_version")
        _log(f"Update weights from tensor (selector=draft): {len(names)} tensors, weight_version={version}")
        if body.get("flush_cache", True) and not self.engine.flush():
            # weight_updater.flush_cache_after_weight_update: the weights were loaded, the call fails,
            # and the tokenizer does not record weight_version (tokenizer_control_mixin.py, success only)
            return self._answer(False, NOT_FLUSHED)
        if version is not None:
            self.engine.weight_version = str(version)
        message = "Success" + (f" Weight version updated to {version}." if version is not None else "")
        return self._answer(True, message)


def _deserialize(entry: str, gpu: int) -> tuple[list, str | None]:
    """One rank's entry through the stand-in's MultiprocessingSerializer: a list of (name, tensor)
    whose tensors are on this rank's GPU (``base_gpu_id + rank``, where the sender put its copy)."""
    import torch  # noqa: PLC0415 - the stand-in torch on the host's pylib
    from sglang.srt.utils import MultiprocessingSerializer  # noqa: PLC0415

    try:
        named = MultiprocessingSerializer.deserialize(entry)
    except Exception as exc:  # noqa: BLE001 - SGLang's scheduler answers the error text as well
        return [], f"cannot deserialize this rank's payload: {type(exc).__name__}: {str(exc)[:200]}"
    if not isinstance(named, list) or not named or not all(
            isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], torch.Tensor) for item in named):
        return [], "the payload is not a list of (name, tensor)"
    for name, tensor in named:
        where = tensor.device
        if getattr(where, "type", None) != "cuda" or where.index != gpu:
            return [], f"{name} is on {where!r}, not on this rank's GPU {gpu} (SIMULATION: CUDA IPC opens a handle " \
                       "of the sender's copy on the rank's own device)"
    return named, None


def _read_sources(named: list) -> tuple[dict, dict, str | None]:
    """The safetensors headers of the files the tensors came from and the SIMULATION markers next to
    them: what the stand-in's acceptance model reads from a drafter directory at launch."""
    headers: dict = {}
    markers: dict = {}
    for source in sorted({tensor.source for _, tensor in named}):
        try:
            with open(source, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                headers[os.path.basename(source)] = json.loads(f.read(n))
        except (OSError, ValueError, struct.error) as exc:
            return {}, {}, f"SIMULATION: cannot map the sender's tensors ({source}: {exc})"
        folder = os.path.dirname(source)
        for marker in MARKERS:
            path = os.path.join(folder, f"SIMULATION-{marker}")
            if os.path.isfile(path):
                with open(path) as f:
                    markers[marker] = f.read(4096).strip()
    return headers, markers, None
