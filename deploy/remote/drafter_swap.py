"""Host-side drafter swap: inspect two drafters, or send one into the running SGLang server.

Runs ON the GPU host (shipped as a helper). Standard library only at import; the real sender
imports torch, safetensors and sglang lazily, under the run's ``sglang_python``.

``inspect --running DIR --new DIR``: what the swap decision compares (deploy/steps/swap_decision.py):
each drafter's config.json, tensor names with dtype and shape, data bytes, and the sha256 of its
draft vocabulary map (``d2t``, ``t2d``); and the GPUs' used/total memory (nvidia-smi). One JSON line.

``send --url URL --drafter DIR --weight-version V --tp N --state-dir DIR``: SGLang's weight-update
session, read from the 0.5.21 and 0.5.23 wheels (srt/entrypoints/http_server.py,
srt/managers/tokenizer_control_mixin.py, srt/managers/scheduler_components/weight_updater.py,
srt/managers/tp_worker.py, srt/utils/auth.py): ``GET /server_info`` (the key works, before any GPU
memory is taken), ``POST /begin_weight_update {"selector": "draft"}``, ``POST
/update_weights_from_tensor`` with one payload per TP rank (rank r deserializes entry r only), the
drafter fingerprint as ``weight_version`` and ``flush_cache: false``, then ``POST /end_weight_update``
(always, once begin succeeded or was cut short by a signal), then ``POST /flush_cache`` (best effort,
``flushed`` in the summary), then ``GET /model_info``'s ``weight_version``. One JSON line: the summary
the step parses strictly.

``flush_cache: false`` on the update, the flush asked for on its own afterwards: with ``flush_cache:
true`` a flush refused because the scheduler still has requests is, in 0.5.23, a failed update whose
weights were loaded but whose ``weight_version`` the tokenizer does not record, and in 0.5.21 an
``assert flush_cache_success`` in the scheduler (weight_updater.py ``flush_cache_after_weight_update``),
which ends the scheduler. ``/flush_cache`` answers 400 instead and changes nothing; the target's KV stays
valid either way (only the draft KV of cached prefixes is the old drafter's until it is evicted).

Keys (``decide_request_auth``, srt/utils/auth.py, the same in 0.5.21 and 0.5.23): /server_info and
/model_info are NORMAL routes (``--api-key`` when the server has one, whatever ``--admin-api-key``
says); the session routes are ADMIN_OPTIONAL (``--admin-api-key`` when set, else ``--api-key``, else
none). Both are read from the host's deployment record (the launch argv), never from a command line.

The stall: each of begin, update and end takes the tokenizer's ``model_update_lock`` writer lock
(tokenizer_control_mixin.py, 0.5.21 - 0.5.23): it waits until every in-flight request has finished
and holds new requests back until it answers. The summary's ``held_s`` is the sum of the three
calls' durations: the time during which new requests could be held, measured by the sender.

Payload: ``MultiprocessingSerializer.serialize([(name, tensor), ...], output_str=True)`` per rank,
with the tensors on GPU ``base_gpu_id + r`` (CUDA IPC handles: this process keeps them alive until
the call returns). This is the only path: whatever torch, safetensors and sglang the host's python
has are the ones it uses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.client import HTTPException

MAX_CONFIG = 1 << 20
MAX_HEADER = 100_000_000
MAX_MAP_BYTES = 64 << 20
MAX_TENSORS = 20_000
MAX_ANSWER = 1 << 20
IGNORED_CONFIG_KEYS = ("_name_or_path", "transformers_version")


MAX_ANSWER_DEPTH = 64
MAX_WEIGHT_VERSION = 256


class Failure(Exception):
    pass


class Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP while sending: end the session, say so in the summary (issue 38)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.name = signal.Signals(signum).name


def _files(model_dir: str) -> list:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, "rb") as f:
            weight_map = json.loads(f.read(MAX_CONFIG * 16)).get("weight_map")
        if not isinstance(weight_map, dict):
            raise Failure(f"{index}: no weight_map")
        names = sorted(set(weight_map.values()))
    else:
        names = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not names:
        raise Failure(f"{model_dir}: no *.safetensors")
    return [os.path.join(model_dir, n) for n in names]


def _header(path: str) -> tuple:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise Failure(f"{path}: too small for a safetensors file")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER:
            raise Failure(f"{path}: header of {n} bytes")
        blob = f.read(n)
    if len(blob) != n:
        raise Failure(f"{path}: truncated header")
    header = json.loads(blob.decode("utf-8"))
    if not isinstance(header, dict):
        raise Failure(f"{path}: header is not a JSON object")
    return header, 8 + n


def _tensor_sha256(path: str, start: int, entry: dict) -> str:
    lo, hi = entry["data_offsets"]
    if not 0 <= hi - lo <= MAX_MAP_BYTES:
        raise Failure(f"{path}: vocabulary map of {hi - lo} bytes")
    with open(path, "rb") as f:
        f.seek(start + lo)
        data = f.read(hi - lo)
    if len(data) != hi - lo:
        raise Failure(f"{path}: truncated tensor data")
    return hashlib.sha256(data).hexdigest()


def drafter_facts(model_dir: str) -> dict:
    """config.json (less the keys that name the producer), tensors, bytes, vocabulary map digests."""
    with open(os.path.join(model_dir, "config.json"), "rb") as f:
        config = json.loads(f.read(MAX_CONFIG))
    if not isinstance(config, dict):
        raise Failure(f"{model_dir}/config.json is not a JSON object")
    for key in IGNORED_CONFIG_KEYS:
        config.pop(key, None)
    tensors: dict = {}
    maps: dict = {"d2t": None, "t2d": None}
    total = 0
    for path in _files(model_dir):
        header, start = _header(path)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if len(tensors) >= MAX_TENSORS:
                raise Failure(f"{model_dir}: more than {MAX_TENSORS} tensors")
            tensors[name] = [entry.get("dtype"), entry.get("shape")]
            lo, hi = entry["data_offsets"]
            total += hi - lo
            if name.rsplit(".", 1)[-1] in maps:
                maps[name.rsplit(".", 1)[-1]] = _tensor_sha256(path, start, entry)
    return {"config": config, "tensors": tensors, "bytes": total,
            "d2t_sha256": maps["d2t"], "t2d_sha256": maps["t2d"]}


def gpu_memory() -> tuple:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi: {exc}"
    if done.returncode != 0:
        return None, f"nvidia-smi exited {done.returncode}: {done.stderr.strip()[:300]}"
    gpus = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return None, f"nvidia-smi printed {line[:200]!r}"
        gpus.append({"index": int(parts[0]), "used_mib": int(parts[1]), "total_mib": int(parts[2])})
    return gpus, None


def inspect(running: str, new: str) -> dict:
    out: dict = {}
    for key, path in (("running", running), ("new", new)):
        try:
            out[key] = drafter_facts(path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, Failure) as exc:
            out[key] = {"error": f"{path}: {exc}"}
    out["gpus"], out["gpu_error"] = gpu_memory()
    return out


# ---------------------------------------------------------------------------------------------
# sending


def _flag(argv: list, flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return str(argv[i + 1])
        if isinstance(arg, str) and arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def server_keys(state_dir: str) -> tuple:
    """(the key for NORMAL routes, the key for ADMIN_OPTIONAL routes), from the running server's launch
    argv in deployment.json: SGLang's ``decide_request_auth`` (srt/utils/auth.py, 0.5.21 - 0.5.23).

    NORMAL (/server_info, /model_info): ``--api-key`` if the server has one, else none (an
    ``--admin-api-key`` is not accepted there). ADMIN_OPTIONAL (the session routes, /flush_cache):
    ``--admin-api-key`` if set (``--api-key`` is then refused), else ``--api-key``, else none."""
    try:
        with open(os.path.join(state_dir, "deployment.json"), "rb") as f:
            argv = json.loads(f.read(MAX_CONFIG)).get("argv") or []
    except (OSError, ValueError, AttributeError, RecursionError):
        return None, None
    if not isinstance(argv, list):
        return None, None
    api, admin = _flag(argv, "--api-key"), _flag(argv, "--admin-api-key")
    return api or None, (admin or api) or None


def _depth(value) -> int:
    """How deep a parsed JSON value nests (iterative: a deep one must not recurse here either)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > MAX_ANSWER_DEPTH:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_answer(raw: bytes, complete: bool = True):
    """An HTTP answer's body: JSON (at most MAX_ANSWER_DEPTH levels) or its text, 500 characters.

    Strict about what it reads: a body cut at MAX_ANSWER bytes, JSON nested deeper than 64 levels
    (a RecursionError in json.loads: the sender died with a traceback, issue 38) or not JSON at all
    is returned as a description (a str), never as a structure the caller could mistake for an answer."""
    if not complete:
        return "an answer of more than %d bytes (not read)" % MAX_ANSWER
    text = raw.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except RecursionError:
        return "a JSON answer nested more than %d levels deep" % MAX_ANSWER_DEPTH
    except ValueError:
        return text[:500]
    if _depth(value) > MAX_ANSWER_DEPTH:
        return "a JSON answer nested more than %d levels deep" % MAX_ANSWER_DEPTH
    return value


def http(url: str, body, key: str | None, timeout: float) -> tuple:
    """(status, JSON answer or text); status 0 when nothing (readable) came back."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                status, raw = answer.status, answer.read(MAX_ANSWER + 1)
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read(MAX_ANSWER + 1)
    except (OSError, ValueError, HTTPException) as exc:
        # refused, reset, timed out, not HTTP at all (BadStatusLine), a body cut short (IncompleteRead)
        return 0, f"{type(exc).__name__}: {exc}"[:500]
    if not isinstance(status, int):
        return 0, "no HTTP status"
    return status, parse_answer(raw[:MAX_ANSWER], len(raw) <= MAX_ANSWER)


def _message(answer) -> str:
    if isinstance(answer, dict):
        text = answer.get("message") or answer.get("error") or answer.get("detail") or answer
        return str(text)[:500]
    return str(answer)[:500]


def _succeeded(status: int, answer) -> bool:
    return status == 200 and isinstance(answer, dict) and answer.get("success") is True


def sglang_payloads(model_dir: str, tp: int, base_gpu_id: int) -> tuple:
    """SGLang's own serializer, one payload per TP rank with that rank's copy on its GPU.

    The only payload path. Not yet run on real GPUs: tests/device/swap_drafter_gpu.py runs it on a
    machine that has them. As read from 0.5.23: ``MultiprocessingSerializer.serialize`` is a
    ForkingPickler dump with SGLang's torch reductions (``monkey_patch_torch_reductions``), base64
    with ``output_str=True``; CUDA tensors travel as IPC handles, so the returned ``keep`` must stay
    referenced until the HTTP call has returned."""
    import torch  # noqa: PLC0415 - only on a GPU host, under sglang_python
    from safetensors.torch import load_file  # noqa: PLC0415
    from sglang.srt.utils import MultiprocessingSerializer  # noqa: PLC0415
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions  # noqa: PLC0415

    monkey_patch_torch_reductions()
    cpu: dict = {}
    for path in _files(model_dir):
        cpu.update(load_file(path))
    keep, entries = [], []
    for rank in range(tp):
        device = torch.device("cuda", base_gpu_id + rank)
        named = [(name, tensor.to(device)) for name, tensor in cpu.items()]
        torch.cuda.synchronize(device)  # the copy is complete before another process opens the IPC handle
        keep.append(named)
        entries.append(MultiprocessingSerializer.serialize(named, output_str=True))
    return entries, len(cpu), keep


def new_summary() -> dict:
    return {"ok": False, "stage": "prepare", "sent": False, "ended": False, "http_status": None, "message": "",
            "weight_version": None, "tensors": 0, "seconds": 0.0, "flushed": False, "held_s": 0.0, "held": {}}


def _timed(summary: dict, call: str, url: str, body, key: str | None, timeout: float) -> tuple:
    """One session call (begin, update, end), its duration added to ``held``: SGLang takes the
    model-update writer lock for it, so new requests may be held back that long."""
    started = time.monotonic()
    try:
        return http(url, body, key, timeout)
    finally:
        seconds = time.monotonic() - started
        summary["held"][call] = round(summary["held"].get(call, 0.0) + seconds, 3)
        summary["held_s"] = round(sum(summary["held"].values()), 3)


def send(url: str, model_dir: str, weight_version: str, tp: int, base_gpu_id: int, state_dir: str,
         timeout: float, summary: dict | None = None) -> dict:
    """One weight-update session; ``summary`` (the caller's, so that a signal or a crash still
    reports how far it got: ``sent`` is set before the first tensor leaves) is filled in."""
    started = time.monotonic()
    deadline = started + timeout
    summary = new_summary() if summary is None else summary

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    normal_key, admin_key = server_keys(state_dir)
    # the keys work (a 401 here is a refusal before any GPU memory is taken or any tensor sent)
    status, info = http(f"{url}/server_info", None, normal_key, min(30.0, left()))
    if status != 200 or not isinstance(info, dict):
        summary.update(stage="server_info", http_status=status, message=_message(info))
        return summary
    keep = None
    try:
        entries, count, keep = sglang_payloads(model_dir, tp, base_gpu_id)
    except Exception as exc:  # noqa: BLE001 - any failure to build the payload: nothing was sent
        summary.update(message=f"{type(exc).__name__}: {exc}"[:500])
        return summary
    summary["tensors"] = count
    summary["stage"] = "begin"
    try:
        status, answer = _timed(summary, "begin", f"{url}/begin_weight_update", {"selector": "draft"}, admin_key,
                                min(60.0, left()))
    except Interrupted:
        # the server may have opened the session: end it (a refused begin's session is another's: left alone)
        _end_session(summary, url, admin_key, min(60.0, left()))
        _SIGNALS.update(defer=False, pending=None)
        raise
    if not _succeeded(status, answer):
        summary.update(http_status=status, message=_message(answer))
        return summary
    updated = False
    try:
        summary["stage"] = "update"
        summary["sent"] = True
        # flush_cache false: see the module's docstring (0.5.21 asserts the flush in the scheduler)
        status, answer = _timed(summary, "update", f"{url}/update_weights_from_tensor",
                                {"serialized_named_tensors": entries, "selector": "draft",
                                 "weight_version": weight_version, "flush_cache": False}, admin_key, left())
        summary.update(http_status=status, message=_message(answer))
        # a failed update is a failed swap, "Weights were updated, but the cache was not flushed" included
        # (a server asked to flush by someone else): the tokenizer records weight_version only on success
        # (tokenizer_control_mixin.py, 0.5.21 - 0.5.23), so /model_info would not name the new drafter
        updated = _succeeded(status, answer)
    finally:
        keep = None  # noqa: F841 - the server has copied the tensors (or failed): release them
        end_status, end_answer = _end_session(summary, url, admin_key, min(60.0, left()))
        summary["ended"] = _succeeded(end_status, end_answer)
        _raise_deferred()  # a signal during the end: reported now, the session ended
    if not updated:
        return summary
    if not summary["ended"]:
        summary.update(stage="end", http_status=end_status, message=_message(end_answer))
        return summary
    # the old drafter's draft KV of cached prefixes: dropped when the scheduler is idle (400 otherwise,
    # nothing changed); ADMIN_OPTIONAL like the session routes
    flush_status, _ = http(f"{url}/flush_cache", {}, admin_key, min(30.0, left()))
    summary["flushed"] = flush_status == 200
    summary["stage"] = "model_info"
    status, model = http(f"{url}/model_info", None, normal_key, min(30.0, left()))
    if status != 200 or not isinstance(model, dict):
        summary.update(http_status=status, message=_message(model))
        return summary
    version = model.get("weight_version")
    if not isinstance(version, str) or len(version) > MAX_WEIGHT_VERSION:
        summary.update(http_status=status, message="/model_info's weight_version is not a string of at most %d "
                       "characters: %s" % (MAX_WEIGHT_VERSION, str(version)[:200]))
        return summary
    summary["weight_version"] = version
    summary.update(ok=True, stage="done", http_status=200, message="Success")
    return summary


#: while the session is being ended a signal is held back (the end must not be cut short) and
#: raised once it has ended
_SIGNALS = {"defer": False, "pending": None}


def _interrupt(signum, frame) -> None:
    if _SIGNALS["defer"]:
        _SIGNALS["pending"] = _SIGNALS["pending"] or signum
        return
    raise Interrupted(signum)


def _end_session(summary: dict, url: str, key: str | None, timeout: float) -> tuple:
    """POST /end_weight_update with signals held back until ``_raise_deferred`` (after the caller
    has noted the answer)."""
    _SIGNALS["defer"] = True
    return _timed(summary, "end", f"{url}/end_weight_update", {}, key, timeout)


def _raise_deferred() -> None:
    pending = _SIGNALS["pending"]
    _SIGNALS.update(defer=False, pending=None)
    if pending is not None:
        raise Interrupted(pending)


def _ignore_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except (ValueError, OSError):
            pass  # not the main thread (a test calling send): nothing was installed


def run_send(args, as_process: bool = False) -> dict:
    """send, with SIGTERM/SIGINT/SIGHUP turned into Interrupted and any crash into the summary:
    the one JSON line always says whether tensors went out (deployctl then marks the record).

    ``as_process`` (``main``): the signals stay ignored afterwards, so nothing cuts the summary's
    write; called in-process (the tests), the caller's handlers come back, so a SIG_IGN never leaks
    into the caller and the children it starts (a leaked SIGTERM SIG_IGN made later tests' child
    processes unkillable by SIGTERM)."""
    summary = new_summary()
    _SIGNALS.update(defer=False, pending=None)
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, _interrupt)
        except (ValueError, OSError):
            pass  # not the main thread: nothing is installed, nothing to restore
    try:
        send(args.url.rstrip("/"), args.drafter, args.weight_version, args.tp, args.base_gpu_id,
             args.state_dir, args.timeout, summary)
    except Interrupted as exc:
        summary.update(ok=False, message="interrupted by %s at %s" % (exc.name, summary["stage"]))
    except Exception as exc:  # noqa: BLE001 - reported in the summary, never a traceback
        summary.update(ok=False, message="the sender failed at %s: %s: %s" % (summary["stage"], type(exc).__name__,
                                                                              str(exc)[:300]))
    finally:
        if as_process:
            _ignore_signals()
        else:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="drafter_swap.py")
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("inspect")
    p.add_argument("--running", required=True)
    p.add_argument("--new", required=True)
    p = sub.add_parser("send")
    p.add_argument("--url", required=True)
    p.add_argument("--drafter", required=True)
    p.add_argument("--weight-version", required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.verb == "inspect":
        out = inspect(args.running, args.new)
    else:
        out = run_send(args, as_process=True)
        out["seconds"] = round(time.monotonic() - started, 3)
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
