#!/usr/bin/env python3
"""Make an EAGLE-3 drafter loadable by SGLang: rename its weight keys and config, in place.

Why: SGLang's ``LlamaForCausalLMEagle3.load_weights`` drops every tensor whose name it does not
know without a word. A drafter trained with vLLM's speculators library names its decoder layer
``layers.0.*``; SGLang 0.5.6-0.5.11 only know ``midlayer.*``, so the layer stays randomly
initialised and acceptance collapses to ``accept len: 1.00``. speculators also writes the aux
hidden-state layer ids at the top level of config.json, where the Llama draft path never reads
them (SGLang then captures its default layers).

What it does, for a drafter directory (``model.safetensors``, or shards with
``model.safetensors.index.json``) or one ``.safetensors`` file:

* renames key prefixes in the safetensors header (default ``layers.0.`` -> ``midlayer.``;
  ``--rename OLD=NEW`` replaces the default). A drafter with several decoder layers keeps its
  ``layers.N.*`` names (SGLang 0.5.12+ loads them) and gets ``layers.N.input_layernorm.weight``
  -> ``layers.N.hidden_norm.weight`` for N > 0; SGLang 0.5.11 and older cannot serve it at all.
* rewrites only the header. Same-length renames (``layers.0.`` and ``midlayer.`` are both 9 bytes)
  or a header that got shorter are written in place with one ``pwrite`` (padded with spaces to the
  old length); tensor bytes are never read or moved. Only a longer header makes a new file next
  to the old one (chunked ``copy_file_range``), fsynced and atomically renamed over it.
* converts a speculators config.json to the flat SGLang form (``LlamaForCausalLMEagle3``,
  ``eagle_config.eagle_aux_hidden_state_layer_ids``), see ``--hidden-states-from``.
* keeps the original header bytes, config.json and index in a sidecar
  (``.deployctl-fix-backup.json`` beside the weights) written and fsynced before the first byte
  changes; ``--restore`` puts them back byte for byte.
* simulates SGLang's name resolution for the chosen SGLang generation and lists, by name, every
  tensor that would be dropped and every parameter that would stay uninitialised.

Guarantees. Nothing is written before every header, config.json and index has been read and
validated. Killed at any instant (SIGKILL), every file stays loadable as its complete old or
complete new version: a header rewritten in place is one pwrite (see _write_header_in_place for
the exact limit), a longer header and every JSON file go through a temporary file and an atomic
rename. The next run finishes the job; ``--restore`` undoes it. Power loss: the sidecar is fsynced
before any other file changes, so ``--restore`` can always bring the original back. Running again
on a converted drafter opens nothing for writing. POSIX only (pread/pwrite, flock).

Usage::

    python3 fix_eagle3_keys.py [--check] [--json] [--rename OLD=NEW ...]
        [--hidden-states-from {keep,vllm,sglang}]
        [--sglang-generation {legacy,modern} | --sglang-version X.Y.Z]
        [--full-backup] PATH
    python3 fix_eagle3_keys.py --restore [--json] PATH
    python3 fix_eagle3_keys.py --fingerprint PATH          (always one JSON document)

Exit codes (the same as deployctl's ``deploy.errors.ExitCode``): 0 done or already converted and
verified; 1 ``--check``: a change is needed; 2 usage; 6 invalid checkpoint (nothing written);
8 verification failed (a tensor would be dropped, a parameter stays uninitialised, aux capture not
configured; the conversion itself did happen and the summary says so); 10 writing failed
(read-only, no space); 130 interrupted.

``--json`` prints exactly one JSON document on stdout::

    {"status": "converted" | "already_converted" | "needs_conversion" | "restored",
     "path": str, "exit_code": int, "dry_run": bool,
     "files": [{"file": str, "mode": "in_place" | "rewritten" | "copied" | "unchanged",
                "renamed": int}],
     "renames": [[old, new], ...],
     "config": {"converted": bool, "kind": "speculators" | "sglang" | "other" | "missing",
                "aux_layer_ids": [int, ...] | null, "ids_mode": "keep" | "vllm" | "sglang"},
     "layers": int, "legacy_servable": bool,
     "verification": {"generation": "legacy" | "modern", "sglang_versions": str, "ok": bool,
                      "dropped": [str], "missing": [str], "problems": [str], "notes": [str],
                      "layers": int, "aux_layer_ids": [int, ...] | null},
     "fingerprint": str (hex sha256), "log": [str]}

``--check`` adds ``verification_after_conversion`` (the verification of the planned result).
``--restore``: ``{"status": "restored", "path", "exit_code", "files": [{"file", "mode"}],
"config": {"restored": bool}, "fingerprint", "log"}``. ``--fingerprint`` (always JSON):
``{"status": "fingerprint", "path", "fingerprint", "exit_code"}``. On error:
``{"status": "error", "code": int, "error": str}`` with that exit code.

Hostile input. Every JSON read here has a size limit checked before reading (config.json 16 MiB,
the index 64 MiB, the sidecar 256 MiB, a safetensors header safetensors' own 100 MB) and a depth
limit; NaN and Infinity are refused; an index naming a tensor that no shard has is an incomplete
checkpoint (exit 6). A shard that is a link out of the checkpoint directory (the Hugging Face
cache's ``snapshots/<rev>/x -> ../../blobs/<sha>``) or has several hard links is never written
through: it is replaced by a converted copy (mode ``copied``, space checked first) and
``--restore`` puts the link back.

Standalone: Python 3.8+ standard library only; uploaded to GPU hosts and run as a script, and
imported by ``deployctl fix-keys``. Library API: ``convert``, ``restore``, ``verify``,
``fingerprint``, ``read_header``, ``main`` and ``FixError``.

Test hooks (environment variables, for the fault-injection tests only):

* ``DEPLOYCTL_FIX_KILL_AT=STAGE[:N]`` -- the process sends itself SIGKILL at the N-th (default 1st)
  time it reaches STAGE. Stages, in order: ``mid_full_backup``, ``after_backup_tmp_write``,
  ``after_backup_rename``; per in-place file ``before_header_write``, ``after_header_write``; per
  rewritten file ``before_copy``, ``mid_copy``, ``before_replace``, ``after_replace``;
  ``after_weights_before_config``, ``after_index_tmp``, ``before_index_replace``,
  ``after_index_replace``, ``after_config_tmp``, ``before_config_replace``,
  ``after_config_replace``, ``before_verify``. ``--restore``: ``restore_before_header_write``,
  ``restore_after_header_write``, ``restore_mid_copy``, ``restore_after_config``,
  ``restore_before_sidecar_remove``. ``mid_copy``, ``restore_mid_copy`` and ``mid_full_backup``
  are reached after every chunk copied, so ``mid_copy:5`` kills after the fifth chunk.
* ``DEPLOYCTL_FIX_COPY_CHUNK=BYTES`` -- chunk size of the data copy (default 8 MiB), so tests can
  reach ``mid_copy`` with small files.
"""

from __future__ import annotations

import argparse
import base64
import errno
import hashlib
import json
import os
import re
import signal
import stat
import struct
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

EXIT_OK = 0
EXIT_CHANGE_NEEDED = 1
EXIT_USAGE = 2
EXIT_CHECKPOINT = 6
EXIT_VERIFY = 8
EXIT_IO = 10
EXIT_INTERRUPTED = 130

#: safetensors refuses headers above 100 MB (safetensors/src/tensor.rs MAX_HEADER_SIZE).
MAX_HEADER_LEN = 100000000
#: size limits of the JSON files beside the weights, checked before reading: a drafter's
#: config.json is ~2 KB; the index of a 1T-parameter model ~2 MB; the sidecar holds the headers.
MAX_CONFIG_BYTES = 16 << 20
MAX_INDEX_BYTES = 64 << 20
MAX_SIDECAR_BYTES = 256 << 20
#: nesting depth of any JSON read here (a safetensors header is 3 deep, config.json ~4).
MAX_JSON_DEPTH = 64
CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SIDECAR_NAME = ".deployctl-fix-backup.json"
SIDECAR_FORMAT = "deployctl-fix-backup"
TMP_SUFFIX = ".tmp-fix"
DEFAULT_RENAMES = (("layers.0.", "midlayer."),)
IDS_MODES = ("keep", "vllm", "sglang")
SPECULATORS_ARCHS = ("Eagle3DraftModel", "Eagle3Speculator")
SGLANG_ARCH = "LlamaForCausalLMEagle3"
GENERATIONS = {"legacy": "0.5.6-0.5.11", "modern": "0.5.12+"}
OLDEST_SUPPORTED = (0, 5, 6)
FIRST_MODERN = (0, 5, 12)
DEFAULT_COPY_CHUNK = 8 << 20

#: bits per element, every dtype safetensors 0.8 accepts.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}

#: LlamaConfig defaults SGLang falls back to when config.json leaves a field out.
LLAMA_DEFAULTS = {"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 32000}

#: SGLang 0.5.12+ (PR #24663) renames these substrings before resolving a name.
MODERN_LEGACY_MAP = (
    ("midlayer", "layers.0"),
    ("aux_norm_low", "fc_norm.0"),
    ("aux_norm_mid", "fc_norm.1"),
    ("aux_norm_high", "fc_norm.2"),
)
#: (fused parameter, checkpoint name part, shard id), as in load_weights' stacked_params_mapping.
STACKED_PARAMS = (
    (".qkv_proj", ".q_proj", "q"),
    (".qkv_proj", ".k_proj", "k"),
    (".qkv_proj", ".v_proj", "v"),
    (".gate_up_proj", ".gate_proj", "gate"),
    (".gate_up_proj", ".up_proj", "up"),
)
LAYER_PARAMS = (
    "hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.qkv_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_up_proj.weight", "mlp.down_proj.weight",
)

_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")
_LATER_INPUT_NORM = re.compile(r"^layers\.(\d+)\.input_layernorm\.weight$")
_MODERN_UNUSED_NORM = re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$")


class FixError(Exception):
    """A user or environment error: ``code`` is the exit code, ``message`` names the file."""

    def __init__(self, code: int, message: str) -> None:
        super(FixError, self).__init__(message)
        self.code = int(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------------------------
# test hooks

_stage_hits: Dict[str, int] = {}


def _stage(name: str) -> None:
    """Fault-injection point: see DEPLOYCTL_FIX_KILL_AT in the module docstring."""
    spec = os.environ.get("DEPLOYCTL_FIX_KILL_AT")
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want != name:
        return
    _stage_hits[name] = _stage_hits.get(name, 0) + 1
    if _stage_hits[name] == int(nth or "1"):
        os.kill(os.getpid(), signal.SIGKILL)


def _copy_chunk() -> int:
    value = os.environ.get("DEPLOYCTL_FIX_COPY_CHUNK")
    if value and value.isdigit() and int(value) > 0:
        return int(value)
    return DEFAULT_COPY_CHUNK


# --------------------------------------------------------------------------------------------
# low-level I/O

def _io_error(action: str, path: str, exc: OSError, tail: str = "") -> FixError:
    code = exc.errno
    if code in (errno.EACCES, errno.EPERM):
        why = "permission denied (read-only file or directory)"
    elif code == errno.EROFS:
        why = "read-only file system"
    elif code == errno.ENOSPC:
        why = "no space left on device"
    elif code == getattr(errno, "EDQUOT", -1):
        why = "disk quota exceeded"
    else:
        why = exc.strerror or str(exc)
    return FixError(EXIT_IO, "cannot %s %s: %s%s" % (action, path, why, tail))


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _close_quiet(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def _fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (some filesystems refuse fsync on a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tmp_path(path: str) -> str:
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + TMP_SUFFIX)


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    parts = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 24), offset)
        if not chunk:
            break
        parts.append(chunk)
        length -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _copy_range(src_fd: int, dst_fd: int, src_off: int, length: int, dst_off: int,
                after_chunk: Optional[Callable[[], None]] = None) -> None:
    """Copy ``length`` bytes in bounded chunks; the kernel does it when it can (no user copy)."""
    chunk = _copy_chunk()
    use_cfr = hasattr(os, "copy_file_range")
    while length > 0:
        n = 0
        want = min(chunk, length)
        if use_cfr:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, src_off, dst_off)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                     errno.EBADF, errno.EPERM):
                    raise
                use_cfr = False
                continue
        else:
            data = os.pread(src_fd, want, src_off)
            if data:
                _write_all(dst_fd, data, dst_off)
            n = len(data)
        if n <= 0:
            raise OSError(errno.EIO, "source ended %d bytes early" % length)
        src_off += n
        dst_off += n
        length -= n
        if after_chunk is not None:
            after_chunk()


def _atomic_write(path: str, data: bytes, stage_tmp: str = "", stage_before: str = "",
                  stage_after: str = "") -> None:
    """tmp file in the same directory, fsync, os.replace, fsync the directory."""
    tmp = _tmp_path(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    fd = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_all(fd, data, 0)
        if stage_tmp:
            _stage(stage_tmp)
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = None
        if stage_before:
            _stage(stage_before)
        os.replace(tmp, path)
    except OSError as exc:
        _close_quiet(fd)
        _unlink_quiet(tmp)
        raise _io_error("write", path, exc, "; %s is unchanged" % os.path.basename(path))
    _fsync_dir(os.path.dirname(path) or ".")
    if stage_after:
        _stage(stage_after)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _page_size() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return 4096


# --------------------------------------------------------------------------------------------
# the safetensors header

class Header(object):
    """A validated safetensors header. ``raw`` is the 8-byte length prefix plus the N header bytes."""

    def __init__(self, display: str, path: str, size: int, raw: bytes, entries: Dict[str, Any],
                 mtime_ns: int) -> None:
        self.display = display
        self.path = path
        self.size = size
        self.raw = raw
        self.entries = entries
        self.mtime_ns = mtime_ns

    @property
    def header_len(self) -> int:
        return len(self.raw) - 8

    @property
    def data_offset(self) -> int:
        return len(self.raw)

    @property
    def data_len(self) -> int:
        return self.size - len(self.raw)

    @property
    def tensor_names(self) -> List[str]:
        return [k for k in self.entries if k != "__metadata__"]

    def shapes(self) -> Dict[str, List[int]]:
        return dict((k, list(v["shape"])) for k, v in self.entries.items() if k != "__metadata__")


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise _NonFinite(text)
    return value


class _NonFinite(ValueError):
    pass


def _json_depth(document: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _parse_json(text: str, display: str, pairs_hook: Any = None) -> Any:
    """json.loads with the limits every JSON input gets: FixError 6 naming ``display``.

    NaN and Infinity are refused (Python writes them back as NaN, which is not JSON; SGLang's
    transformers config loader and safetensors' serde both reject them), a nesting deeper than
    MAX_JSON_DEPTH is refused (the C decoder raises RecursionError a few thousand levels down,
    and code walking the value would too).
    """
    try:
        document = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=_refuse_constant,
                              parse_float=_finite_float)
    except _NonFinite as exc:
        raise FixError(EXIT_CHECKPOINT, "%s: the number %s is not finite; JSON has no NaN or "
                       "Infinity (write a finite value)" % (display, exc.args[0]))
    except RecursionError:
        raise FixError(EXIT_CHECKPOINT, "%s: JSON nested more than %d levels deep; refused"
                       % (display, MAX_JSON_DEPTH))
    if _json_depth(document) > MAX_JSON_DEPTH:
        raise FixError(EXIT_CHECKPOINT, "%s: JSON nested more than %d levels deep; refused"
                       % (display, MAX_JSON_DEPTH))
    return document


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` (FixError 6 naming the file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise FixError(EXIT_CHECKPOINT, "cannot read %s: %s" % (path, exc.strerror or exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FixError(EXIT_CHECKPOINT, "%s is not a regular file" % path)
        if st.st_size > limit:
            raise FixError(EXIT_CHECKPOINT, "%s is %d bytes, over the %d-byte limit for %s; refused"
                           % (path, st.st_size, limit, what))
        data = _pread_exact(fd, limit + 1, 0)
    except OSError as exc:
        raise FixError(EXIT_CHECKPOINT, "cannot read %s: %s" % (path, exc.strerror or exc))
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FixError(EXIT_CHECKPOINT, "%s grew past the %d-byte limit for %s while read; refused"
                       % (path, limit, what))
    return data


def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_region(path: str) -> Tuple[Optional[bytes], int]:
    """The prefix and header bytes as they are, unvalidated (None when the length is absurd)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        prefix = _pread_exact(fd, 8, 0)
        if len(prefix) < 8:
            return None, size
        n = struct.unpack("<Q", prefix)[0]
        if n > MAX_HEADER_LEN or 8 + n > size:
            return None, size
        return prefix + _pread_exact(fd, n, 8), size
    finally:
        os.close(fd)


def read_header(path: str, display: Optional[str] = None) -> Header:
    """Read and validate a safetensors header the way the safetensors library does (FixError 6)."""
    display = display or path
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FixError(EXIT_CHECKPOINT, "%s does not exist" % display)
    except OSError as exc:
        raise FixError(EXIT_CHECKPOINT, "cannot read %s: %s" % (display, exc.strerror or exc))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FixError(EXIT_CHECKPOINT, "%s is not a regular file" % display)
        size = st.st_size
        if size < 8:
            raise FixError(EXIT_CHECKPOINT, "%s is not a safetensors file: it has %d bytes, fewer "
                           "than the 8-byte header-length prefix" % (display, size))
        prefix = _pread_exact(fd, 8, 0)
        n = struct.unpack("<Q", prefix)[0]
        if n > MAX_HEADER_LEN:
            raise FixError(EXIT_CHECKPOINT, "%s is not a safetensors file: its first 8 bytes give a "
                           "header length of %d bytes, over safetensors' 100 MB limit (a pickle, "
                           "zip or text file?)" % (display, n))
        if 8 + n > size:
            raise FixError(EXIT_CHECKPOINT, "%s is not a safetensors file or is truncated: its "
                           "first 8 bytes give a header length of %d bytes but only %d bytes follow"
                           % (display, n, size - 8))
        raw = prefix + _pread_exact(fd, n, 8)
    finally:
        os.close(fd)
    entries = _parse_header(display, raw, size)
    return Header(display, path, size, raw, entries, st.st_mtime_ns)


def _parse_header(display: str, raw: bytes, size: int) -> Dict[str, Any]:
    try:
        text = raw[8:].decode("utf-8")
    except UnicodeDecodeError:
        raise FixError(EXIT_CHECKPOINT, "%s is not a safetensors file: its header is not UTF-8 "
                       "JSON" % display)
    try:
        entries = _parse_json(text, display + " header", _no_duplicates)
    except _DuplicateKey as exc:
        raise FixError(EXIT_CHECKPOINT, "%s: the header has the key %r twice (safetensors forbids "
                       "duplicate keys)" % (display, exc.args[0]))
    except ValueError as exc:
        raise FixError(EXIT_CHECKPOINT, "%s is not a safetensors file: its header is not JSON "
                       "(%s)" % (display, exc))
    if not isinstance(entries, dict):
        raise FixError(EXIT_CHECKPOINT, "%s is not a safetensors file: its header is JSON but not "
                       "an object" % display)
    meta = entries.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(
            isinstance(v, str) for v in meta.values())):
        raise FixError(EXIT_CHECKPOINT, "%s: __metadata__ must map strings to strings" % display)
    spans = []
    for name, info in entries.items():
        if name == "__metadata__":
            continue
        where = "%s: tensor %r" % (display, name)
        if not isinstance(info, dict):
            raise FixError(EXIT_CHECKPOINT, "%s: expected an object with dtype, shape and "
                           "data_offsets" % where)
        for field in ("dtype", "shape", "data_offsets"):
            if field not in info:
                raise FixError(EXIT_CHECKPOINT, "%s has no %s" % (where, field))
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_BITS:
            raise FixError(EXIT_CHECKPOINT, "%s has unknown dtype %r (expected one of %s)"
                           % (where, dtype, ", ".join(sorted(DTYPE_BITS))))
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise FixError(EXIT_CHECKPOINT, "%s: shape must be a list of non-negative integers, "
                           "got %r" % (where, shape))
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_uint(o) for o in offsets) or offsets[0] > offsets[1]):
            raise FixError(EXIT_CHECKPOINT, "%s: data_offsets must be [begin, end] with "
                           "0 <= begin <= end, got %r" % (where, offsets))
        elements = 1
        for dim in shape:
            elements *= dim
        bits = elements * DTYPE_BITS[dtype]
        if bits % 8:
            raise FixError(EXIT_CHECKPOINT, "%s: %d %s elements do not fill whole bytes"
                           % (where, elements, dtype))
        if offsets[1] - offsets[0] != bits // 8:
            raise FixError(EXIT_CHECKPOINT, "%s: data_offsets %r span %d bytes but shape %r of "
                           "%s needs %d" % (where, offsets, offsets[1] - offsets[0], shape, dtype,
                                            bits // 8))
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin > position:
            raise FixError(EXIT_CHECKPOINT, "%s: hole in the data buffer: bytes %d-%d belong to no "
                           "tensor (before %r)" % (display, position, begin, name))
        if begin < position:
            raise FixError(EXIT_CHECKPOINT, "%s: tensor %r overlaps the tensor before it (starts at "
                           "%d, previous ends at %d)" % (display, name, begin, position))
        position = end
    data_len = size - len(raw)
    if data_len < position:
        raise FixError(EXIT_CHECKPOINT, "%s is truncated: its tensors need %d data bytes but the "
                       "file has %d" % (display, position, data_len))
    if data_len > position:
        raise FixError(EXIT_CHECKPOINT, "%s: the data buffer has %d bytes but the tensors end at "
                       "%d (trailing bytes)" % (display, data_len, position))
    return entries


def _render_header(entries: Dict[str, Any]) -> bytes:
    """Compact JSON like safetensors' own writer; key order as given."""
    try:
        return json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(entries, separators=(",", ":")).encode("ascii")


def _header_region(entries: Dict[str, Any], old_len: int) -> Tuple[bytes, bool]:
    """(8-byte prefix + header, in_place). In place when it fits in the old length (space-padded)."""
    body = _render_header(entries)
    if len(body) <= old_len:
        return struct.pack("<Q", old_len) + body + b" " * (old_len - len(body)), True
    padded = len(body) + (-len(body)) % 8     # data stays 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", padded) + body + b" " * (padded - len(body)), False


# --------------------------------------------------------------------------------------------
# the checkpoint on disk

def _check_file_name(name: str, where: str) -> None:
    """A shard name from the index is a plain file name: '../x' or 'sub/x' would read and write
    files outside the checkpoint directory."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise FixError(EXIT_CHECKPOINT, "%s names the weights file %r, which is not a file name in "
                       "its directory (expected a name such as model-00001-of-00002.safetensors)"
                       % (where, name))


class _WeightsFile(object):
    def __init__(self, directory: str, name: str) -> None:
        _check_file_name(name, directory)
        self.name = name
        self.path = os.path.join(directory, name)
        #: the link's text when the file is a symbolic link (restored by --restore)
        self.link = os.readlink(self.path) if os.path.islink(self.path) else None
        #: why writing through this file would change bytes outside the checkpoint ('' if not)
        self.shared = ""
        real_dir = os.path.realpath(directory)
        if self.link is not None and os.path.dirname(self.real) != real_dir:
            # The Hugging Face cache: snapshots/<rev>/x.safetensors -> ../../blobs/<sha>, a blob
            # other snapshots share. Writing through the link would change them all.
            self.shared = "a link to %s, outside the checkpoint directory" % self.real
        else:
            try:
                links = os.stat(self.path).st_nlink
            except OSError:
                links = 1
            if links > 1:
                self.shared = "a file with %d hard links (its bytes are shared)" % links

    @property
    def real(self) -> str:
        """The file the bytes are in, resolved now (a conversion may replace a link by a copy)."""
        return os.path.realpath(self.path)


class _Checkpoint(object):
    def __init__(self, path: str) -> None:
        self.input = os.path.abspath(path)
        if os.path.isdir(self.input):
            self.dir = self.input
            self.single_file = False
        elif os.path.isfile(self.input):
            self.dir = os.path.dirname(self.input)
            self.single_file = True
        elif os.path.lexists(self.input):
            raise FixError(EXIT_CHECKPOINT, "%s is neither a directory nor a regular file" % path)
        else:
            raise FixError(EXIT_CHECKPOINT, "%s does not exist" % path)
        self.config_path = os.path.join(self.dir, CONFIG_NAME)
        self.sidecar_path = os.path.join(self.dir, SIDECAR_NAME)
        index_path = os.path.join(self.dir, INDEX_NAME)
        self.index_path: Optional[str] = None
        self.index_raw: Optional[bytes] = None
        self.index: Optional[Dict[str, Any]] = None
        if os.path.isfile(index_path):
            self.index_raw, self.index = _read_index(index_path)
        if self.single_file:
            name = os.path.basename(self.input)
            self.weights = [_WeightsFile(self.dir, name)]
            if self.index is None or name not in self.index["weight_map"].values():
                self.index_path, self.index_raw, self.index = None, None, None
            else:
                self.index_path = index_path
            return
        if self.index is not None:
            self.index_path = index_path
            names = sorted(set(self.index["weight_map"].values()))
            for name in names:
                _check_file_name(name, index_path)
            for name in names:
                if not os.path.isfile(os.path.join(self.dir, name)):
                    raise FixError(EXIT_CHECKPOINT, "%s lists %s but %s has no such file"
                                   % (index_path, name, self.dir))
            if not names:
                raise FixError(EXIT_CHECKPOINT, "%s has an empty weight_map" % index_path)
        elif os.path.isfile(os.path.join(self.dir, "model.safetensors")):
            names = ["model.safetensors"]
        else:
            names = sorted(n for n in os.listdir(self.dir)
                           if n.endswith(".safetensors") and not n.startswith(".")
                           and os.path.isfile(os.path.join(self.dir, n)))
            if not names:
                raise FixError(EXIT_CHECKPOINT, "%s has no .safetensors file (expected "
                               "model.safetensors, or shards with %s)" % (self.dir, INDEX_NAME))
            if len(names) > 1:
                raise FixError(EXIT_CHECKPOINT, "%s has %d .safetensors files (%s) but no %s; pass "
                               "one file" % (self.dir, len(names), ", ".join(names[:5]), INDEX_NAME))
        self.weights = [_WeightsFile(self.dir, n) for n in names]


def _read_json_object(path: str, limit: int = MAX_CONFIG_BYTES, what: str = CONFIG_NAME
                      ) -> Tuple[bytes, Dict[str, Any]]:
    raw = _read_bounded(path, limit, what)
    try:
        document = _parse_json(raw.decode("utf-8"), path)
    except FixError:
        raise
    except ValueError as exc:       # UnicodeDecodeError and JSONDecodeError
        raise FixError(EXIT_CHECKPOINT, "%s is not valid JSON (%s)" % (path, exc))
    if not isinstance(document, dict):
        raise FixError(EXIT_CHECKPOINT, "%s is not a JSON object" % path)
    return raw, document


def _read_index(path: str) -> Tuple[bytes, Dict[str, Any]]:
    raw, index = _read_json_object(path, MAX_INDEX_BYTES, INDEX_NAME)
    if not isinstance(index.get("weight_map"), dict) or not all(
            isinstance(v, str) for v in index["weight_map"].values()):
        raise FixError(EXIT_CHECKPOINT, "%s has no weight_map object mapping tensor names to "
                       "file names" % path)
    return raw, index


def _read_config(path: str) -> Tuple[Optional[bytes], Optional[Dict[str, Any]]]:
    if not os.path.isfile(path):
        return None, None
    return _read_json_object(path)


def _dump_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# --------------------------------------------------------------------------------------------
# renames

def _parse_rules(renames: Any) -> Tuple[List[Tuple[str, str]], bool]:
    """(rules, custom). ``renames``: None (default), ["OLD=NEW", ...], [(old, new), ...] or a dict."""
    if renames is None:
        return list(DEFAULT_RENAMES), False
    pairs: List[Tuple[str, str]] = []
    items = list(renames.items()) if isinstance(renames, dict) else list(renames)
    for item in items:
        if isinstance(item, str):
            if "=" not in item:
                raise FixError(EXIT_USAGE, "--rename %r: expected OLD=NEW (a key prefix and its "
                               "replacement)" % item)
            old, new = item.split("=", 1)
        else:
            old, new = item
        if not old:
            raise FixError(EXIT_USAGE, "--rename %s=%s: the old prefix is empty" % (old, new))
        if old == new:
            raise FixError(EXIT_USAGE, "--rename %s=%s renames nothing" % (old, new))
        if new.startswith(old):
            raise FixError(EXIT_USAGE, "--rename %s=%s: the new prefix starts with the old one, so "
                           "every run would rename again" % (old, new))
        pairs.append((old, new))
    if not pairs:
        raise FixError(EXIT_USAGE, "no rename given")
    return pairs, True


def _plan_renames(headers: List[Header], rules: List[Tuple[str, str]], custom: bool
                  ) -> Tuple[Dict[str, str], int, List[str]]:
    """(old -> new for every key to rename, decoder layers seen, log lines)."""
    names = [n for h in headers for n in h.tensor_names]
    present = set(names)
    layer_ids = set()
    for name in names:
        match = _LAYER_KEY.match(name)
        if match:
            layer_ids.add(int(match.group(1)))
    multi = any(i > 0 for i in layer_ids)
    log: List[str] = []
    if multi:
        layers = max(layer_ids) + 1
        log.append("%d decoder layers: keeping the layers.N.* names (SGLang 0.5.12+ loads them); "
                   "SGLang 0.5.11 and older cannot serve a drafter with more than one layer "
                   "(\"EAGLE3 currently only supports 1 layer\")" % layers)
    elif layer_ids or any(n.startswith("midlayer.") for n in names):
        layers = 1
    else:
        layers = 0
    mapping: Dict[str, str] = {}
    for name in names:
        new = name
        match = _LATER_INPUT_NORM.match(name) if multi else None
        # SGLang 0.5.12+ uses hidden_norm as the pre-attention norm of layers N > 0; speculators
        # saves that norm as input_layernorm, which would load into an unused parameter.
        if match and int(match.group(1)) > 0:
            target = "layers.%s.hidden_norm.weight" % match.group(1)
            if target not in present:
                new = target
        if custom or not multi:
            for old, repl in rules:
                if new.startswith(old):
                    new = repl + new[len(old):]
                    break
        if new != name:
            if not new:
                raise FixError(EXIT_USAGE, "renaming %r would leave an empty key" % name)
            mapping[name] = new
    owner: Dict[str, str] = {}
    for header in headers:
        for name in header.tensor_names:
            final = mapping.get(name, name)
            if final in owner:
                raise FixError(EXIT_CHECKPOINT, "%s: renaming %r -> %r would create a duplicate key "
                               "(%r is already in %s)" % (header.display, name, final, final,
                                                          owner[final]))
            owner[final] = header.display
    return mapping, layers, log


def _plan_weight_map(weight_map: Dict[str, str], plans: List["_FilePlan"],
                     mapping: Dict[str, str], rules: List[Tuple[str, str]]
                     ) -> Tuple[Dict[str, str], List[str]]:
    """The index's weight_map as the shards will be: built from their final keys, in the old order.

    Built from the shards, not from this run's renames alone: a run killed between two shards
    leaves the first shard converted and the index old; the next run must still fix its keys.
    """
    managed = set(p.weights.name for p in plans)
    owner: Dict[str, str] = {}
    for plan in plans:
        for name in plan.header.tensor_names:
            owner[mapping.get(name, name)] = plan.weights.name
    new_map: Dict[str, str] = {}
    stale = []
    for key, file_name in weight_map.items():
        if file_name not in managed:
            new_map[key] = file_name            # another shard, not part of this run
            continue
        candidates = [mapping.get(key, key)]
        candidates += [repl + key[len(old):] for old, repl in rules if key.startswith(old)]
        for candidate in candidates:
            if owner.get(candidate) == file_name and candidate not in new_map:
                new_map[candidate] = file_name
                break
        else:
            stale.append((key, file_name))
    if stale:
        # The index promises a tensor no shard has: the checkpoint is incomplete (a shard from
        # another revision, an interrupted download). Rewriting the index without it would hide
        # that; SGLang would then run with that parameter uninitialised.
        shown = ", ".join("%r (in %s)" % item for item in stale[:5])
        raise FixError(EXIT_CHECKPOINT, "%s lists %d tensor(s) that no shard contains: %s%s; the "
                       "checkpoint is incomplete; nothing was written"
                       % (INDEX_NAME, len(stale), shown, " ..." if len(stale) > 5 else ""))
    missing = [name for name in owner if name not in new_map]
    for name in missing:
        new_map[name] = owner[name]
    log = []
    if missing:
        log.append("%s: weight_map rebuilt from the shards (%d entr%s added)"
                   % (INDEX_NAME, len(missing), "y" if len(missing) == 1 else "ies"))
    return new_map, log


def _renamed_entries(entries: Dict[str, Any], mapping: Dict[str, str]) -> Dict[str, Any]:
    return dict((mapping.get(k, k) if k != "__metadata__" else k, v) for k, v in entries.items())


# --------------------------------------------------------------------------------------------
# config.json

def _config_kind(config: Optional[Dict[str, Any]]) -> str:
    if config is None:
        return "missing"
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    if config.get("speculators_model_type") == "eagle3" or any(a in SPECULATORS_ARCHS for a in archs):
        return "speculators"
    if SGLANG_ARCH in archs:
        return "sglang"
    return "other"


def _layer_ids(value: Any, where: str) -> Optional[List[int]]:
    if value is None:
        return None
    if not isinstance(value, list) or not all(_is_uint(i) for i in value):
        raise FixError(EXIT_CHECKPOINT, "%s: eagle_aux_hidden_state_layer_ids must be a list of "
                       "non-negative integers, got %r" % (where, value))
    return list(value)


def _sglang_ids(config: Dict[str, Any]) -> Optional[List[int]]:
    eagle = config.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        return eagle.get("eagle_aux_hidden_state_layer_ids")
    return None


def _convert_config(config: Dict[str, Any], ids_mode: str, shapes: Dict[str, List[int]],
                    where: str) -> Tuple[Dict[str, Any], List[str], Optional[List[int]]]:
    """speculators config -> the flat form LlamaForCausalLMEagle3 reads."""
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise FixError(EXIT_CHECKPOINT, "%s: a speculators eagle3 config needs a "
                       "transformer_layer_config object with the Llama fields" % where)
    archs = config.get("architectures") or ["speculators_model_type eagle3"]
    log = ["%s: speculators format (%s) -> SGLang format (%s)"
           % (where, ", ".join(str(a) for a in (archs if isinstance(archs, list) else [archs])),
              SGLANG_ARCH)]
    new: Dict[str, Any] = {"architectures": [SGLANG_ARCH], "model_type": "llama"}
    moved = []
    for key, value in layer.items():
        if key in ("architectures", "model_type"):
            continue
        new[key] = value
        moved.append(key)
    log.append("%s: Llama fields moved from transformer_layer_config to the top level: %s"
               % (where, ", ".join(moved) or "(none)"))
    if layer.get("model_type") not in (None, "llama"):
        log.append("%s: warning: transformer_layer_config.model_type is %r; fields it left at that "
                   "model's defaults now take Llama's defaults" % (where, layer.get("model_type")))
    if config.get("draft_vocab_size") is not None:
        new["draft_vocab_size"] = config["draft_vocab_size"]
    elif "lm_head.weight" in shapes and shapes["lm_head.weight"]:
        new["draft_vocab_size"] = shapes["lm_head.weight"][0]
        log.append("%s: draft_vocab_size %d taken from lm_head.weight" % (where,
                                                                         new["draft_vocab_size"]))
    if config.get("target_hidden_size") is not None:
        # SGLang tests hasattr(config, "target_hidden_size"): a null would be used as the width.
        new["target_hidden_size"] = config["target_hidden_size"]
    ids = _layer_ids(config.get("eagle_aux_hidden_state_layer_ids"), where)
    if ids is None:
        ids = _layer_ids(_sglang_ids(config), where)
    final_ids = ids
    if ids is None:
        new["eagle_config"] = {"use_aux_hidden_state": True}
        log.append("%s: no eagle_aux_hidden_state_layer_ids: SGLang will use its default "
                   "[2, N//2, N-3] (N = target layers), which is also vLLM's default" % where)
    else:
        if ids_mode == "vllm":
            bad = [i for i in ids if i - 1 < 0]
            if bad:
                raise FixError(EXIT_CHECKPOINT, "%s: eagle_aux_hidden_state_layer_ids %r: id %d would "
                               "become %d with --hidden-states-from vllm (SGLang cannot capture the "
                               "stream entering layer 0); check the ids" % (where, ids, bad[0],
                                                                           bad[0] - 1))
            final_ids = [i - 1 for i in ids]
            log.append("%s: eagle_aux_hidden_state_layer_ids %r -> %r (--hidden-states-from vllm: "
                       "vLLM captured the stream entering layer id; SGLang's Llama-family targets "
                       "capture the output of layer id, so id - 1 selects the same streams)"
                       % (where, ids, final_ids))
        elif ids_mode == "sglang":
            log.append("%s: eagle_aux_hidden_state_layer_ids %r kept (--hidden-states-from sglang: "
                       "already in SGLang's meaning)" % (where, ids))
        else:
            log.append("%s: eagle_aux_hidden_state_layer_ids %r kept as-is (--hidden-states-from "
                       "keep)" % (where, ids))
            log.append("%s: note: if vLLM/speculators extracted the training hidden states, SGLang's "
                       "Llama-family targets capture one layer later with these ids; convert with "
                       "--hidden-states-from vllm instead" % where)
        new["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": final_ids,
                               "use_aux_hidden_state": True}
    dropped = []
    for key, value in config.items():
        if key in ("architectures", "model_type", "transformer_layer_config", "draft_vocab_size",
                   "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "eagle_config"):
            continue
        if key in ("speculators_model_type", "auto_map"):
            dropped.append(key)
            continue
        if key in new:
            continue
        new[key] = value
    if dropped:
        log.append("%s: dropped %s (speculators-only; the original is in the backup)"
                   % (where, ", ".join(dropped)))
    return new, log, final_ids


# --------------------------------------------------------------------------------------------
# what SGLang would load

def _resolve_generation(generation: Optional[str]) -> str:
    if generation is None:
        return "legacy"
    if generation in GENERATIONS:
        return generation
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(generation))
    if not match:
        raise FixError(EXIT_USAGE, "SGLang generation %r: expected legacy, modern or a version like "
                       "0.5.9" % (generation,))
    version = tuple(int(p or 0) for p in match.groups())
    if version < OLDEST_SUPPORTED:
        raise FixError(EXIT_USAGE, "SGLang %s is not supported: the EAGLE-3 loader was checked from "
                       "0.5.6 on" % generation)
    return "modern" if version >= FIRST_MODERN else "legacy"


def _effective_config(config: Dict[str, Any]) -> Dict[str, Any]:
    """What SGLang's LlamaConfig would see; for a speculators config, the nested fields as a hint."""
    if _config_kind(config) != "speculators":
        return config
    merged = dict(config.get("transformer_layer_config") or {})
    merged.update((k, v) for k, v in config.items() if k != "transformer_layer_config")
    return merged


def _simulate_load(shapes: Dict[str, List[int]], config: Optional[Dict[str, Any]],
                   generation: str) -> Dict[str, Any]:
    """Replay LlamaForCausalLMEagle3.load_weights' name resolution and report every gap by name."""
    versions = GENERATIONS[generation]
    result: Dict[str, Any] = {"generation": generation, "sglang_versions": versions, "ok": False,
                              "dropped": [], "missing": [], "problems": [], "notes": []}
    problems: List[str] = result["problems"]
    notes: List[str] = result["notes"]
    if config is None:
        problems.append("config.json is missing: SGLang cannot build the draft model")
        return result
    kind = _config_kind(config)
    if kind == "speculators":
        problems.append("config.json is in speculators format (architectures %r): SGLang has no "
                        "such class and reads the Llama fields and eagle_config at the top level; "
                        "convert it" % (config.get("architectures"),))
    elif kind == "other":
        problems.append("config.json architectures is %r; SGLang's EAGLE-3 Llama draft class is "
                        "%s" % (config.get("architectures"), SGLANG_ARCH))
    eff = _effective_config(config)
    defaults_used = [k for k in LLAMA_DEFAULTS if eff.get(k) is None]
    if defaults_used:
        notes.append("config.json has no %s; SGLang uses LlamaConfig's default (%s)"
                     % (", ".join(defaults_used),
                        ", ".join("%s=%s" % (k, LLAMA_DEFAULTS[k]) for k in defaults_used)))
    try:
        n_layers = int(eff.get("num_hidden_layers") or LLAMA_DEFAULTS["num_hidden_layers"])
        hidden = int(eff.get("hidden_size") or LLAMA_DEFAULTS["hidden_size"])
    except (TypeError, ValueError):
        problems.append("config.json: num_hidden_layers and hidden_size must be integers")
        return result
    result["layers"] = n_layers
    n_layers = max(0, min(n_layers, 4096))
    eagle = eff.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    top_ids = eff.get("eagle_aux_hidden_state_layer_ids")
    ids_valid = isinstance(ids, list) and bool(ids) and all(_is_uint(i) for i in ids)
    result["aux_layer_ids"] = ids
    num_aux = 3
    if generation == "modern":
        explicit = eff.get("num_aux_hidden_states")
        if _is_uint(explicit) and explicit:
            num_aux = explicit
        elif ids_valid:
            num_aux = len(ids or ())
    tie = bool(eff.get("tie_word_embeddings", False))

    params: List[str] = []
    if generation == "legacy":
        if n_layers != 1:
            problems.append("num_hidden_layers is %d: SGLang %s raise \"EAGLE3 currently only "
                            "supports 1 layer\" and cannot serve this drafter; use SGLang 0.5.12+ "
                            "(--sglang-generation modern)" % (n_layers, versions))
        params += ["model.midlayer." + p for p in LAYER_PARAMS]
    else:
        for i in range(n_layers):
            params += ["model.layers.%d.%s" % (i, p) for p in LAYER_PARAMS]
        if eff.get("fc_norm") or eff.get("use_aux_norm"):
            params += ["model.fc_norm.%d.weight" % k for k in range(num_aux)]
        if eff.get("norm_before_fc"):
            params.append("model.input_norm.weight")
    params += ["model.fc.weight", "model.norm.weight", "model.embed_tokens.weight"]
    if not tie:
        params.append("lm_head.weight")
    param_set = set(params)
    received: Dict[str, set] = dict((p, set()) for p in params)
    source: Dict[str, str] = {}

    for original in shapes:
        name = original
        if generation == "modern":
            for legacy, new in MODERN_LEGACY_MAP:
                if legacy in name:
                    name = name.replace(legacy, new)
        if "d2t" in name:
            continue        # becomes the draft->target hot-token map
        if "t2d" in name:
            continue        # skipped by SGLang on purpose
        target = None
        shard = "full"
        for fused, part, shard_id in STACKED_PARAMS:
            if part in name:
                name = name.replace(part, fused)
                shard = shard_id
                break
        target = name if name in param_set else "model." + name
        if target not in param_set:
            result["dropped"].append(original)
            continue
        if shard in received[target] or "full" in received[target]:
            problems.append("%s and %s both load into %s (the later one wins)"
                            % (source.get(target, "?"), original, target))
        received[target].add(shard)
        source[target] = original
        unused = _MODERN_UNUSED_NORM.match(target)
        if generation == "modern" and unused and int(unused.group(1)) > 0:
            problems.append("%s loads into %s, which SGLang 0.5.12+ never uses (layer %s's "
                            "pre-attention norm is hidden_norm)" % (original, target,
                                                                    unused.group(1)))

    for param in params:
        got = received[param]
        if param.endswith(".qkv_proj.weight"):
            need = {"q", "k", "v"}
        elif param.endswith(".gate_up_proj.weight"):
            need = {"gate", "up"}
        else:
            need = {"full"}
        if "full" in got or need <= got:
            continue
        if got:
            result["missing"].append(param)
            problems.append("%s receives only the %s part(s); %s missing"
                            % (param, ", ".join(sorted(got)), ", ".join(sorted(need - got))))
            continue
        unused = _MODERN_UNUSED_NORM.match(param)
        if param == "model.embed_tokens.weight":
            notes.append("model.embed_tokens.weight is not in the checkpoint: SGLang takes the "
                         "embeddings from the target model")
        elif generation == "modern" and unused and int(unused.group(1)) > 0:
            continue        # allocated but never used for layers N > 0
        elif param == "lm_head.weight" and eff.get("draft_vocab_size") is None:
            notes.append("lm_head.weight is not in the checkpoint and draft_vocab_size is unset: "
                         "SGLang loads the LM head from the target")
        else:
            result["missing"].append(param)

    # Aux hidden states: the target captures the layers named by the DRAFT config's eagle_config.
    # Without them the draft sees one hidden state, skips fc (7168 == 7168) and accepts nothing.
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False:
        problems.append("eagle_config.use_aux_hidden_state is false: the target sends one hidden "
                        "state and fc is skipped")
    if ids is None and top_ids is not None:
        problems.append("eagle_aux_hidden_state_layer_ids %r is only at the top level of "
                        "config.json: the top-level key is not read by the Llama draft path, so "
                        "SGLang would capture its default layers; it belongs in eagle_config"
                        % (top_ids,))
    elif ids is None:
        notes.append("no eagle_config.eagle_aux_hidden_state_layer_ids: the target captures "
                     "SGLang's default layers [2, N//2, N-3]")
    elif not ids_valid:
        problems.append("eagle_config.eagle_aux_hidden_state_layer_ids must be a non-empty list of "
                        "non-negative integers, got %r" % (ids,))
    elif generation == "legacy" and len(ids) != 3:
        problems.append("eagle_config lists %d aux layer ids but SGLang %s hard-code fc's input to "
                        "3 hidden states" % (len(ids), versions))
    target_hidden = eff.get("target_hidden_size", hidden)
    if "target_hidden_size" in eff and eff.get("target_hidden_size") is None:
        problems.append("target_hidden_size is null: SGLang tests hasattr() and would build fc "
                        "with a width of None; remove the key")
        target_hidden = hidden
    fc_name = source.get("model.fc.weight")
    if fc_name is not None and _is_uint(target_hidden):
        shape = shapes[fc_name]
        want = [hidden, num_aux * target_hidden]
        if shape != want:
            problems.append("%s has shape %r but SGLang %s builds fc as %r (%d aux hidden states "
                            "of width %d)" % (fc_name, shape, versions, want, num_aux,
                                              target_hidden))
        elif ids_valid and len(ids or ()) != int(num_aux):
            problems.append("%s takes %d aux hidden states but eagle_config lists %d ids"
                            % (fc_name, num_aux, len(ids or ())))
    if result["dropped"]:
        problems.insert(0, "SGLang %s would drop %d tensor(s) without a word: %s"
                        % (versions, len(result["dropped"]), ", ".join(result["dropped"])))
    if result["missing"]:
        problems.insert(0, "parameter(s) that no tensor loads into (they stay randomly "
                        "initialised): %s" % ", ".join(result["missing"]))
    fatal = [p for p in problems if "only supports 1 layer" in p or "speculators format" in p]
    problems[:] = fatal + [p for p in problems if p not in fatal]     # the root cause first
    result["ok"] = not (result["dropped"] or result["missing"] or problems)
    return result


def _merged_shapes(headers: List[Header]) -> Dict[str, List[int]]:
    shapes: Dict[str, List[int]] = {}
    where: Dict[str, str] = {}
    for header in headers:
        for name, shape in header.shapes().items():
            if name in shapes:
                raise FixError(EXIT_CHECKPOINT, "tensor %r is in both %s and %s"
                               % (name, where[name], header.display))
            shapes[name] = shape
            where[name] = header.display
    return shapes


def simulate_fixed(files: Dict[str, Dict[str, List[int]]], config: Optional[Dict[str, Any]],
                   generation: str, hidden_states_from: str = "keep"
                   ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Dict[str, List[int]]]:
    """What SGLang would load once this fixer ran with its default renames: no file is touched.

    ``files`` maps each safetensors file to its tensor shapes (as read from the headers on the
    host). Returns (verification, the config as the fixer would write it, the final shapes).
    deployctl doctor judges a drafter with this before anything on the host is changed.
    """
    generation = _resolve_generation(generation)
    headers = [Header(name, name, 0, b"", dict((k, {"shape": v}) for k, v in tensors.items()), 0)
               for name, tensors in sorted(files.items())]
    mapping, _, _ = _plan_renames(headers, list(DEFAULT_RENAMES), False)
    shapes = dict((mapping.get(k, k), v) for k, v in _merged_shapes(headers).items())
    if config is not None and _config_kind(config) == "speculators":
        config, _, _ = _convert_config(config, hidden_states_from, shapes, CONFIG_NAME)
    return _simulate_load(shapes, config, generation), config, shapes


def verify(path: str, generation: str = "legacy") -> Dict[str, Any]:
    """What SGLang of ``generation`` (legacy, modern or a version) would load from the drafter."""
    generation = _resolve_generation(generation)
    ckpt = _Checkpoint(path)
    headers = [read_header(w.real, w.path) for w in ckpt.weights]
    _, config = _read_config(ckpt.config_path)
    return _simulate_load(_merged_shapes(headers), config, generation)


# --------------------------------------------------------------------------------------------
# fingerprint

def fingerprint(path: str) -> str:
    """sha256 (hex) over each weights file's name, size, mtime_ns and header bytes, and the JSONs."""
    ckpt = _Checkpoint(path)
    digest = hashlib.sha256(b"deployctl-drafter-fingerprint/1\n")
    for weights in sorted(ckpt.weights, key=lambda w: w.name):
        st = os.stat(weights.real)
        region, _ = _read_region(weights.real)
        if region is None:
            with open(weights.real, "rb") as handle:
                region = handle.read(8)
        digest.update(("%s\0%d\0%d\0%d\0" % (weights.name, st.st_size, st.st_mtime_ns,
                                             len(region))).encode("utf-8"))
        digest.update(region)
    for extra in (ckpt.config_path, ckpt.index_path):
        if extra and os.path.isfile(extra):
            with open(extra, "rb") as handle:
                data = handle.read()
            digest.update(("%s\0%d\0" % (os.path.basename(extra), len(data))).encode("utf-8"))
            digest.update(data)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# the backup sidecar

def _load_sidecar(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.lexists(path):
        return None
    raw = _read_bounded(path, MAX_SIDECAR_BYTES, "the backup sidecar")
    try:
        sidecar = _parse_json(raw.decode("utf-8"), path)
    except FixError as exc:
        exc.message += "; move it away if it is not from deployctl"
        exc.args = (exc.message,)
        raise
    except ValueError as exc:
        raise FixError(EXIT_CHECKPOINT, "backup sidecar %s is unreadable (%s); move it away if it "
                       "is not from deployctl" % (path, exc))
    if not isinstance(sidecar, dict) or sidecar.get("format") != SIDECAR_FORMAT or not isinstance(
            sidecar.get("files"), dict):
        raise FixError(EXIT_CHECKPOINT, "%s is not a deployctl backup sidecar; move it away" % path)
    problem = _sidecar_problem(sidecar)
    if problem:
        raise FixError(EXIT_CHECKPOINT, "backup sidecar %s is damaged: %s; nothing was changed (move "
                       "it away only if the drafter holds its original bytes)" % (path, problem))
    return sidecar


def _is_record(value: Any, with_mode: bool = False) -> bool:
    if not isinstance(value, dict) or not _is_uint(value.get("size")):
        return False
    if not (isinstance(value.get("sha256"), str) and isinstance(value.get("b64"), str)):
        return False
    try:
        data = base64.b64decode(value["b64"].encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        return False
    if _sha256(data) != value["sha256"]:
        return False
    return not with_mode or value.get("mode") in ("in_place", "rewritten", "copied")


def _sidecar_problem(sidecar: Dict[str, Any]) -> str:
    """What is wrong with a sidecar's structure ('' when it is usable): every b64 decodes to its
    sha256, every entry has what --restore and the next run read."""
    for name, entry in sidecar["files"].items():
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            return "file name %r is not a file in the checkpoint directory" % (name,)
        if not isinstance(entry, dict):
            return "entry %r is not an object" % name
        if not _is_record(entry.get("original")) or not _is_record(entry.get("source")):
            return "entry %r has no valid original/source header record" % name
        if not _is_record(entry.get("target"), with_mode=True):
            return "entry %r has no valid target header record" % name
        if "link" in entry and not isinstance(entry["link"], str):
            return "entry %r: link is not a string" % name
        known = entry.get("known_sha256", [])
        if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
            return "entry %r: known_sha256 is not a list of strings" % name
    for key in ("config", "index"):
        entry = sidecar.get(key)
        if entry is None:
            continue
        if not isinstance(entry, dict) or not _is_record(entry.get("original")):
            return "%s entry has no valid original record" % key
        if "link" in entry and not isinstance(entry["link"], str):
            return "%s entry: link is not a string" % key
        known = entry.get("known_sha256", [])
        if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
            return "%s entry: known_sha256 is not a list of strings" % key
    return ""


def _record(raw: bytes, size: int) -> Dict[str, Any]:
    return {"size": size, "header_len": len(raw) - 8, "sha256": _sha256(raw), "b64": _b64(raw)}


def _known(entry: Dict[str, Any]) -> List[str]:
    known = list(entry.get("known_sha256") or [])
    for key in ("original", "source", "target"):
        if isinstance(entry.get(key), dict) and entry[key].get("sha256"):
            known.append(entry[key]["sha256"])
    return known


def _torn_between(current: bytes, source: bytes, target: bytes) -> bool:
    """True when ``current`` is, page by page, either ``source`` or ``target`` (an interrupted write).

    A header write is one pwrite, but Linux copies it into the page cache page by page and checks
    for a fatal signal between pages; a kill can therefore cut a header that spans several pages.
    """
    if not (len(current) == len(source) == len(target)) or current in (source, target):
        return False
    page = _page_size()
    for start in range(0, len(current), page):
        piece = current[start:start + page]
        if piece != source[start:start + page] and piece != target[start:start + page]:
            return False
    return True


def _new_sidecar(ckpt: _Checkpoint) -> Dict[str, Any]:
    return {"format": SIDECAR_FORMAT, "version": 1, "tool": "fix_eagle3_keys.py",
            "checkpoint": ckpt.dir, "files": {}}


def _json_entry(existing: Optional[Dict[str, Any]], old_raw: bytes, new_raw: bytes
                ) -> Tuple[Dict[str, Any], bool]:
    """(sidecar entry for a JSON file about to change, whether an older entry was replaced)."""
    old_sha = _sha256(old_raw)
    if existing and old_sha in _known(existing):
        entry = dict(existing)
        entry["known_sha256"] = sorted(set(_known(existing) + [_sha256(new_raw)]))
        entry["target_sha256"] = _sha256(new_raw)
        return entry, False
    entry = {"original": {"size": len(old_raw), "sha256": old_sha, "b64": _b64(old_raw)},
             "target_sha256": _sha256(new_raw), "known_sha256": [old_sha, _sha256(new_raw)]}
    return entry, existing is not None


# --------------------------------------------------------------------------------------------
# convert

class _FilePlan(object):
    def __init__(self, weights: _WeightsFile, header: Header, mapping: Dict[str, str]) -> None:
        self.weights = weights
        self.header = header
        self.renamed = [(k, mapping[k]) for k in header.tensor_names if k in mapping]
        self.new_raw = header.raw
        self.mode = "unchanged"
        if self.renamed:
            self.new_raw, in_place = _header_region(_renamed_entries(header.entries, mapping),
                                                    header.header_len)
            self.mode = "in_place" if in_place else "rewritten"
            if weights.shared:
                self.mode = "copied"        # never write through a shared file: a converted copy
        self.new_size = header.size - len(header.raw) + len(self.new_raw)
        self.fd: Optional[int] = None
        #: set as soon as a byte of the file may have changed (the backup is needed from then on)
        self.touched = False


def _heal_torn(ckpt: _Checkpoint, sidecar: Dict[str, Any], dry_run: bool, log: List[str]) -> None:
    for weights in ckpt.weights:
        entry = sidecar["files"].get(weights.name)
        if not isinstance(entry, dict) or entry.get("target", {}).get("mode") != "in_place":
            continue
        try:
            region, size = _read_region(weights.real)
        except OSError:
            continue
        source, target = _unb64(entry["source"]["b64"]), _unb64(entry["target"]["b64"])
        current = region
        if current is None or len(current) != len(target):
            try:
                with open(weights.real, "rb") as handle:
                    current = handle.read(len(target))
            except OSError:
                continue
        if _sha256(current) in _known(entry) or not _torn_between(current, source, target):
            continue
        if dry_run:
            raise FixError(EXIT_CHECKPOINT, "%s: an interrupted header rewrite left the header half "
                           "old, half new; run without --check to complete it, or --restore"
                           % weights.path)
        fd = None
        try:
            fd = os.open(weights.real, os.O_RDWR)
            os.pwrite(fd, target[8:], 8)
            os.fsync(fd)
        except OSError as exc:
            raise _io_error("repair", weights.path, exc)
        finally:
            _close_quiet(fd)
        log.append("%s: completed a header rewrite that an earlier run left half done" % weights.name)


def convert(path: str, *, renames: Any = None, hidden_states_from: str = "keep",
            generation: str = "legacy", full_backup: bool = False, dry_run: bool = False
            ) -> Dict[str, Any]:
    """Convert the drafter at ``path`` for SGLang; returns the summary (the ``--json`` document).

    Raises FixError for invalid input (6), bad arguments (2) and write failures (10). A failed
    verification does not raise: the summary's ``verification.ok`` is False, ``exit_code`` 8.
    """
    gen = _resolve_generation(generation)
    if hidden_states_from not in IDS_MODES:
        raise FixError(EXIT_USAGE, "hidden_states_from must be one of %s, got %r"
                       % (", ".join(IDS_MODES), hidden_states_from))
    rules, custom = _parse_rules(renames)
    ckpt = _Checkpoint(path)
    lock = None if dry_run else _lock_dir(ckpt.dir)
    try:
        return _convert(ckpt, rules, custom, hidden_states_from, gen, full_backup, dry_run)
    finally:
        _close_quiet(lock)


def _lock_dir(directory: str) -> Optional[int]:
    """One fixer at a time per drafter directory (flock; released when the process dies)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise FixError(EXIT_IO, "another fix-keys run is working on %s (its lock is held)"
                           % directory)
        return None
    return fd


def _convert(ckpt: _Checkpoint, rules: List[Tuple[str, str]], custom: bool, ids_mode: str,
             generation: str, full_backup: bool, dry_run: bool) -> Dict[str, Any]:
    log: List[str] = []
    sidecar = _load_sidecar(ckpt.sidecar_path)
    if sidecar is not None:
        _heal_torn(ckpt, sidecar, dry_run, log)

    # Read and validate everything before a single byte is written.
    headers = [read_header(w.real, w.path) for w in ckpt.weights]
    shapes_before = _merged_shapes(headers)
    mapping, layers, layer_log = _plan_renames(headers, rules, custom)
    log.extend(layer_log)
    plans = [_FilePlan(w, h, mapping) for w, h in zip(ckpt.weights, headers)]
    shapes_after = dict((mapping.get(k, k), v) for k, v in shapes_before.items())

    config_raw, config = _read_config(ckpt.config_path)
    kind = _config_kind(config)
    new_config: Optional[Dict[str, Any]] = None
    aux_ids: Optional[List[int]] = None
    config_log: List[str] = []
    if kind == "speculators" and config is not None:
        new_config, config_log, aux_ids = _convert_config(config, ids_mode, shapes_after,
                                                          CONFIG_NAME)
    elif kind == "sglang" and config is not None:
        aux_ids = _sglang_ids(config)
        if ids_mode != "keep":
            config_log.append("%s is already in SGLang format: --hidden-states-from %s not "
                              "applied (ids %r left as they are)" % (CONFIG_NAME, ids_mode, aux_ids))
    elif kind == "missing":
        config_log.append("no %s beside the weights: SGLang needs one" % CONFIG_NAME)
    else:
        config_log.append("%s: architectures %r is neither speculators nor SGLang EAGLE-3; left "
                          "alone" % (CONFIG_NAME, config.get("architectures") if config else None))
    new_config_raw = _dump_json(new_config) if new_config is not None else None

    new_index_raw: Optional[bytes] = None
    if ckpt.index is not None and ckpt.index_raw is not None:
        new_map, index_log = _plan_weight_map(ckpt.index["weight_map"], plans, mapping, rules)
        log.extend(index_log)
        if list(new_map.items()) != list(ckpt.index["weight_map"].items()):
            new_index = dict(ckpt.index)
            new_index["weight_map"] = new_map
            new_index_raw = _dump_json(new_index)

    for plan in plans:
        for old, new in plan.renamed:
            log.append("%s -> %s" % (old, new))
    for plan in plans:
        if plan.mode == "in_place":
            log.append("%s: %d key(s) renamed; header rewritten in place (%d bytes, tensor data "
                       "untouched)" % (plan.weights.name, len(plan.renamed), plan.header.header_len))
        elif plan.mode == "rewritten":
            log.append("%s: %d key(s) renamed; the header grew from %d to %d bytes, so the file is "
                       "rewritten next to the original and renamed over it"
                       % (plan.weights.name, len(plan.renamed), plan.header.header_len,
                          len(plan.new_raw) - 8))
        if plan.mode == "copied":
            log.append("%s is %s: replaced by a converted copy (%d bytes); %s is unchanged%s"
                       % (plan.weights.name, plan.weights.shared, plan.new_size, plan.weights.real,
                          "; --restore puts the link back" if plan.weights.link else ""))
        elif plan.weights.real != os.path.abspath(plan.weights.path) and plan.mode != "unchanged":
            log.append("%s is a link to %s; that file is the one changed"
                       % (plan.weights.name, plan.weights.real))
    log.extend(config_log)

    changing = [p for p in plans if p.mode != "unchanged"]
    changed = bool(changing or new_config_raw is not None or new_index_raw is not None)

    summary: Dict[str, Any] = {
        "path": ckpt.input,
        "dry_run": bool(dry_run),
        "files": [{"file": p.weights.name, "mode": p.mode, "renamed": len(p.renamed)}
                  for p in plans],
        "renames": [[old, new] for p in plans for old, new in p.renamed],
        "config": {"converted": new_config is not None, "kind": kind, "aux_layer_ids": aux_ids,
                   "ids_mode": ids_mode},
        "layers": layers,
        "legacy_servable": layers <= 1,
    }

    if not changed:
        leftovers = [n for n in os.listdir(ckpt.dir) if n.endswith(TMP_SUFFIX)]
        if leftovers:
            log.append("note: temporary file(s) from an interrupted run: %s" % ", ".join(leftovers))
        log.append("already converted: no key to rename and %s needs no change; nothing written"
                   % CONFIG_NAME)
        verification = _simulate_load(shapes_before, config, generation)
        summary.update(status="already_converted", verification=verification,
                       fingerprint=fingerprint(ckpt.input), log=log,
                       exit_code=EXIT_OK if verification["ok"] else EXIT_VERIFY)
        return _ordered(summary)

    if dry_run:
        log.append("check only: nothing written")
        planned_config = new_config if new_config is not None else config
        summary.update(status="needs_conversion",
                       verification=_simulate_load(shapes_before, config, generation),
                       verification_after_conversion=_simulate_load(shapes_after, planned_config,
                                                                    generation),
                       fingerprint=fingerprint(ckpt.input), log=log, exit_code=EXIT_CHANGE_NEEDED)
        return _ordered(summary)

    sidecar_written = json_touched = False
    try:
        _preflight(ckpt, changing, new_config_raw is not None, new_index_raw is not None,
                   full_backup)
        if full_backup:
            _full_backup(ckpt, changing, new_config_raw is not None, new_index_raw is not None, log)
        _write_sidecar(ckpt, sidecar, plans, config_raw, new_config_raw, new_index_raw, log)
        sidecar_written = True
        # Rewritten files first: they are the ones that can run out of space, and then nothing
        # else has changed yet.
        for plan in sorted(changing, key=lambda p: p.mode == "in_place"):
            if plan.mode == "in_place":
                _write_header_in_place(plan)
            elif plan.mode == "copied":
                _rewrite_file(plan.weights.real, plan.new_raw, plan.header.data_offset,
                              plan.header.data_len, plan.weights.path, dest=plan.weights.path)
                plan.touched = True
            else:
                _rewrite_file(plan.weights.real, plan.new_raw, plan.header.data_offset,
                              plan.header.data_len, plan.weights.path)
                plan.touched = True
        _stage("after_weights_before_config")
        if new_index_raw is not None and ckpt.index_path:
            _atomic_write(ckpt.index_path, new_index_raw, "after_index_tmp", "before_index_replace",
                          "after_index_replace")
            json_touched = True
            log.append("%s: weight_map updated" % INDEX_NAME)
        if new_config_raw is not None:
            _atomic_write(ckpt.config_path, new_config_raw, "after_config_tmp",
                          "before_config_replace", "after_config_replace")
            json_touched = True
            log.append("%s written (the original is in %s)" % (CONFIG_NAME, SIDECAR_NAME))
    except FixError as exc:
        touched = [p.weights.name for p in plans if p.touched]
        if touched or json_touched:
            exc.message += ("; already changed: %s; run again once fixed, or --restore"
                            % ", ".join(touched + ([CONFIG_NAME] if json_touched else [])))
            exc.args = (exc.message,)
        elif sidecar_written and sidecar is None:
            _unlink_quiet(ckpt.sidecar_path)      # nothing changed: a failed first run leaves no trace
            _fsync_dir(ckpt.dir)
        raise
    finally:
        for plan in plans:
            _close_quiet(plan.fd)
            plan.fd = None
    _stage("before_verify")

    final_headers = [read_header(w.real, w.path) for w in ckpt.weights]
    _, final_config = _read_config(ckpt.config_path)
    verification = _simulate_load(_merged_shapes(final_headers), final_config, generation)
    summary.update(status="converted", verification=verification,
                   fingerprint=fingerprint(ckpt.input), log=log,
                   exit_code=EXIT_OK if verification["ok"] else EXIT_VERIFY)
    return _ordered(summary)


def _ordered(summary: Dict[str, Any]) -> Dict[str, Any]:
    first = ("status", "path", "exit_code", "dry_run", "files", "renames", "config", "layers",
             "legacy_servable", "verification", "verification_after_conversion", "fingerprint",
             "log")
    out = dict((k, summary[k]) for k in first if k in summary)
    out.update((k, v) for k, v in summary.items() if k not in out)
    return out


def _preflight(ckpt: _Checkpoint, changing: List[_FilePlan], config: bool, index: bool,
               full_backup: bool) -> None:
    """Fail with exit 10 before anything changes: read-only files, directory, space."""
    if not os.access(ckpt.dir, os.W_OK):
        raise FixError(EXIT_IO, "cannot write in %s: permission denied (read-only directory); the "
                       "backup sidecar goes there; nothing was changed" % ckpt.dir)
    for path, name, wanted in ((ckpt.config_path, CONFIG_NAME, config),
                               (ckpt.index_path, INDEX_NAME, index)):
        # a link is replaced, not written through: only the directory must be writable
        if wanted and path and not os.path.islink(path) and not os.access(path, os.W_OK):
            raise FixError(EXIT_IO, "cannot write %s: permission denied (read-only file); nothing "
                           "was changed" % path)
    for plan in changing:
        if plan.mode != "copied" and not os.access(plan.weights.real, os.W_OK):
            raise FixError(EXIT_IO, "cannot write %s: permission denied (read-only file); nothing "
                           "was changed" % plan.weights.path)
    needed = sum(p.new_size for p in changing if p.mode in ("rewritten", "copied"))
    if full_backup:
        needed += sum(p.header.size for p in changing)
    if needed:
        try:
            st = os.statvfs(ckpt.dir)
            free = st.f_bavail * st.f_frsize
        except (AttributeError, OSError):
            free = None
        if free is not None and free < needed + (16 << 20):
            raise FixError(EXIT_IO, "cannot write in %s: no space left on device (%d MiB needed for "
                           "the rewritten copy, %d MiB free); nothing was changed"
                           % (ckpt.dir, needed >> 20, free >> 20))
    for plan in changing:
        if plan.mode != "in_place":
            continue
        try:
            plan.fd = os.open(plan.weights.real, os.O_RDWR)
        except OSError as exc:
            raise _io_error("write", plan.weights.path, exc, "; nothing was changed")
        if _pread_exact(plan.fd, len(plan.header.raw), 0) != plan.header.raw:
            raise FixError(EXIT_CHECKPOINT, "%s changed while it was being read; run again"
                           % plan.weights.path)


def _full_backup(ckpt: _Checkpoint, changing: List[_FilePlan], config: bool, index: bool,
                 log: List[str]) -> None:
    # a copied (shared) file's backup goes beside the link, never beside the shared blob
    pairs = [(p.weights.real, (p.weights.path if p.mode == "copied" else p.weights.real) + ".orig")
             for p in changing]
    pairs += [(p, p + ".orig") for p, wanted in ((ckpt.config_path, config), (ckpt.index_path, index))
              if wanted and p]
    for path, backup in pairs:
        if os.path.exists(backup):
            log.append("%s exists; kept" % os.path.basename(backup))
            continue
        tmp = _tmp_path(backup)
        src = dst = None
        try:
            src = os.open(path, os.O_RDONLY)
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            _copy_range(src, dst, 0, os.fstat(src).st_size, 0,
                        lambda: _stage("mid_full_backup"))
            os.fchmod(dst, stat.S_IMODE(os.fstat(src).st_mode))
            os.fsync(dst)
            os.close(dst)
            dst = None
            os.replace(tmp, backup)
        except OSError as exc:
            _close_quiet(dst)
            _unlink_quiet(tmp)
            raise _io_error("write", backup, exc, "; nothing was changed")
        finally:
            _close_quiet(src)
        _fsync_dir(os.path.dirname(backup))
        log.append("full copy: %s" % os.path.basename(backup))


def _write_sidecar(ckpt: _Checkpoint, sidecar: Optional[Dict[str, Any]], plans: List[_FilePlan],
                   config_raw: Optional[bytes], new_config_raw: Optional[bytes],
                   new_index_raw: Optional[bytes], log: List[str]) -> None:
    """The backup must always hold the ORIGINAL bytes: keep older entries for files in a state
    we produced; replace only entries whose file has changed since (a new original)."""
    side = sidecar if sidecar is not None else _new_sidecar(ckpt)
    files = side["files"]
    for plan in plans:
        entry = files.get(plan.weights.name)
        current = _sha256(plan.header.raw)
        known = isinstance(entry, dict) and current in _known(entry)
        if plan.mode == "unchanged":
            if entry is not None and not known:
                del files[plan.weights.name]
                log.append("backup entry for %s dropped: the file changed since that conversion"
                           % plan.weights.name)
            continue
        target = _record(plan.new_raw, plan.new_size)
        target["mode"] = plan.mode
        if entry is not None and known:
            entry = dict(entry)
        else:
            if entry is not None:
                log.append("backup entry for %s replaced: the file changed since that conversion"
                           % plan.weights.name)
            entry = {"original": _record(plan.header.raw, plan.header.size)}
        entry["source"] = _record(plan.header.raw, plan.header.size)
        entry["target"] = target
        if plan.mode == "copied" and plan.weights.link is not None:
            entry["link"] = plan.weights.link
        entry["known_sha256"] = sorted(set(_known(entry)))
        files[plan.weights.name] = entry
    if new_config_raw is not None and config_raw is not None:
        side["config"], replaced = _json_entry(side.get("config"), config_raw, new_config_raw)
        _note_link(side["config"], ckpt.config_path)
        if replaced:
            log.append("backup of %s replaced: it changed since that conversion" % CONFIG_NAME)
    if new_index_raw is not None and ckpt.index_raw is not None:
        side["index"], _ = _json_entry(side.get("index"), ckpt.index_raw, new_index_raw)
        _note_link(side["index"], ckpt.index_path or "")
    _atomic_write(ckpt.sidecar_path, _dump_json(side), "after_backup_tmp_write", "",
                  "after_backup_rename")
    log.append("original headers%s saved in %s" % (" and config" if new_config_raw else "",
                                                  SIDECAR_NAME))


def _note_link(entry: Dict[str, Any], path: str) -> None:
    """A JSON file that is a link (the Hugging Face cache) is replaced, never written through;
    the sidecar keeps the link's text so --restore can put the link back."""
    if path and os.path.islink(path) and "link" not in entry:
        entry["link"] = os.readlink(path)


def _write_header_in_place(plan: _FilePlan) -> None:
    # Crash model. The header region is rewritten with ONE pwrite() of its N bytes; the length
    # prefix and every tensor byte stay where they are. A process killed at any instant (SIGKILL,
    # OOM killer) leaves the old or the new header when the region [8, 8+N) lies within one page
    # (N < 4088 bytes: every EAGLE-3 drafter seen, ~2 KB for 16 tensors), because Linux copies a
    # page into the page cache under the page lock and checks for fatal signals only between
    # pages (mm/filemap.c generic_perform_write). A header spanning several pages can be cut
    # between two pages; the next run recognises that page-wise mix of the sidecar's source and
    # target and completes it (_heal_torn), and --restore undoes it. Power loss: the page cache
    # reaches the disk in any order; the sidecar, fsynced before this write, and --restore bring
    # the original back.
    assert plan.fd is not None
    body = plan.new_raw[8:]
    _stage("before_header_write")
    try:
        written = os.pwrite(plan.fd, body, 8)
        plan.touched = written > 0
        if written != len(body):
            _write_all(plan.fd, body[written:], 8 + written)
        os.fsync(plan.fd)
    except OSError as exc:
        raise _io_error("write the header of", plan.weights.path, exc,
                        "; the original header is in %s (--restore)" % SIDECAR_NAME)
    _stage("after_header_write")


def _rewrite_file(path: str, new_raw: bytes, data_offset: int, data_len: int, display: str,
                  prefix: str = "", dest: Optional[str] = None) -> None:
    """New file beside the old one: header + data copied in chunks; fsync; atomic rename.

    ``dest``: where the new file goes (default ``path``): a link replaced by a converted copy
    reads from the link's target and renames over the link itself.
    """
    dest = dest or path
    tmp = _tmp_path(dest)
    _unlink_quiet(tmp)
    src = dst = None
    try:
        src = os.open(path, os.O_RDONLY)
        st = os.fstat(src)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        _write_all(dst, new_raw, 0)
        if not prefix:
            _stage("before_copy")
        _copy_range(src, dst, data_offset, data_len, len(new_raw),
                    lambda: _stage(prefix + "mid_copy"))
        os.fchmod(dst, stat.S_IMODE(st.st_mode))
        try:
            os.fchown(dst, st.st_uid, st.st_gid)
        except OSError:
            pass
        os.fsync(dst)
        if os.fstat(dst).st_size != len(new_raw) + data_len:
            raise OSError(errno.EIO, "short copy")
        os.close(dst)
        dst = None
        if not prefix:
            _stage("before_replace")
        os.replace(tmp, dest)
    except OSError as exc:
        _close_quiet(dst)
        _unlink_quiet(tmp)
        raise _io_error("write", display, exc, "; %s is unchanged and the partial copy was "
                        "removed" % display)
    except BaseException:
        _close_quiet(dst)
        _unlink_quiet(tmp)
        raise
    finally:
        _close_quiet(src)
    _fsync_dir(os.path.dirname(dest))
    if not prefix:
        _stage("after_replace")


# --------------------------------------------------------------------------------------------
# restore

def restore(path: str) -> Dict[str, Any]:
    """Put back the original header bytes, config.json and index from the sidecar, byte for byte."""
    ckpt = _Checkpoint(path)
    lock = _lock_dir(ckpt.dir)
    try:
        return _restore(ckpt)
    finally:
        _close_quiet(lock)


def _check_link_target(directory: str, name: str, link: str, entry: Dict[str, Any]) -> None:
    """Before putting a link back: its target must still hold the original header and size."""
    target = os.path.join(directory, link)
    region, size = (None, 0)
    try:
        if os.path.isfile(target):
            region, size = _read_region(target)
    except OSError:
        region = None
    if region is None or _sha256(region) != entry["original"]["sha256"] or \
            size != int(entry["original"]["size"]):
        raise FixError(EXIT_CHECKPOINT, "%s was a link to %s, which no longer holds the original "
                       "file; nothing restored (the converted copy is kept)"
                       % (os.path.join(directory, name), link))


def _relink(path: str, link: str) -> None:
    """Replace the converted copy at ``path`` by the original symbolic link, atomically."""
    tmp = _tmp_path(path)
    _unlink_quiet(tmp)
    try:
        os.symlink(link, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        _unlink_quiet(tmp)
        raise _io_error("put back the link", path, exc)
    _fsync_dir(os.path.dirname(path))


def _restore(ckpt: _Checkpoint) -> Dict[str, Any]:
    sidecar = _load_sidecar(ckpt.sidecar_path)
    if sidecar is None:
        raise FixError(EXIT_CHECKPOINT, "nothing to restore: %s has no %s (no conversion by "
                       "deployctl, or already restored)" % (ckpt.dir, SIDECAR_NAME))
    log: List[str] = []
    steps = []
    for name, entry in sidecar["files"].items():
        file_path = os.path.realpath(os.path.join(ckpt.dir, name))
        if not os.path.isfile(file_path):
            raise FixError(EXIT_CHECKPOINT, "%s is in the backup %s but missing"
                           % (os.path.join(ckpt.dir, name), SIDECAR_NAME))
        original = _unb64(entry["original"]["b64"])
        orig_size = int(entry["original"]["size"])
        region, size = _read_region(file_path)
        current = region
        state = None
        if current is not None and _sha256(current) == entry["original"]["sha256"]:
            state = "original"
        elif current is not None and _sha256(current) in _known(entry):
            state = "converted"
        else:
            target = _unb64(entry["target"]["b64"])
            source = _unb64(entry["source"]["b64"])
            with open(file_path, "rb") as handle:
                head = handle.read(len(target))
            if _torn_between(head, source, target):
                state, current = "converted", head
        if state is None or current is None:
            raise FixError(EXIT_CHECKPOINT, "%s changed since it was converted: its header matches "
                           "neither the original nor a version recorded in %s; nothing restored"
                           % (os.path.join(ckpt.dir, name), SIDECAR_NAME))
        if size - len(current) != orig_size - len(original):
            raise FixError(EXIT_CHECKPOINT, "%s: its tensor data is %d bytes, the original's was "
                           "%d; nothing restored" % (os.path.join(ckpt.dir, name), size - len(current),
                                                     orig_size - len(original)))
        link = entry.get("link")
        if link is not None and state == "converted":
            _check_link_target(ckpt.dir, name, link, entry)
        steps.append((name, file_path, state, original, current, size, link))
    json_steps = []
    for key, json_path in (("index", os.path.join(ckpt.dir, INDEX_NAME)),
                           ("config", ckpt.config_path)):
        entry = sidecar.get(key)
        if not isinstance(entry, dict):
            continue
        original = _unb64(entry["original"]["b64"])
        current = None
        if os.path.isfile(json_path):
            with open(json_path, "rb") as handle:
                current = handle.read()
        if current == original:
            continue
        if current is not None and _sha256(current) not in _known(entry):
            raise FixError(EXIT_CHECKPOINT, "%s changed since it was converted (it matches neither "
                           "the original nor the converted version); nothing restored" % json_path)
        link = entry.get("link")
        if link is not None:
            link_target = os.path.join(ckpt.dir, link)
            try:
                linked = _read_bounded(link_target, len(original), os.path.basename(json_path))
            except FixError:
                linked = None
            if linked != original:
                link = None         # the target changed or is gone: restore the bytes instead
        json_steps.append((json_path, original, link))

    if not os.access(ckpt.dir, os.W_OK):
        raise FixError(EXIT_IO, "cannot write in %s: permission denied; nothing restored" % ckpt.dir)
    for name, file_path, state, _, _, _, link in steps:
        if state != "original" and link is None and not os.access(file_path, os.W_OK):
            raise FixError(EXIT_IO, "cannot write %s: permission denied (read-only file); nothing "
                           "restored" % file_path)

    files = []
    for name, file_path, state, original, current, size, link in steps:
        if state == "original":
            files.append({"file": name, "mode": "unchanged"})
            continue
        if link is not None:
            _relink(os.path.join(ckpt.dir, name), link)
            files.append({"file": name, "mode": "relinked"})
            log.append("%s: the link to %s is back (the converted copy is gone)" % (name, link))
            continue
        if len(current) == len(original):
            fd = None
            try:
                fd = os.open(file_path, os.O_RDWR)
                _stage("restore_before_header_write")
                written = os.pwrite(fd, original[8:], 8)       # one write, as when converting
                if written != len(original) - 8:
                    _write_all(fd, original[8 + written:], 8 + written)
                os.fsync(fd)
            except OSError as exc:
                raise _io_error("restore", file_path, exc)
            finally:
                _close_quiet(fd)
            _stage("restore_after_header_write")
            mode = "in_place"
        else:
            _rewrite_file(file_path, original, len(current), size - len(current), file_path,
                          prefix="restore_")
            mode = "rewritten"
        files.append({"file": name, "mode": mode})
        log.append("%s: original header restored (%s)" % (name, mode.replace("_", " ")))
    for json_path, original, link in json_steps:
        if link is not None:
            _relink(json_path, link)
            log.append("%s: the link to %s is back" % (os.path.basename(json_path), link))
            continue
        _atomic_write(json_path, original)
        log.append("%s restored" % os.path.basename(json_path))
    _stage("restore_after_config")
    for name in sorted(n for n in os.listdir(ckpt.dir) if n.endswith(TMP_SUFFIX)):
        _unlink_quiet(os.path.join(ckpt.dir, name))
        log.append("removed %s left by an interrupted run" % name)
    _stage("restore_before_sidecar_remove")
    try:
        os.unlink(ckpt.sidecar_path)
    except OSError as exc:
        raise _io_error("remove", ckpt.sidecar_path, exc)
    _fsync_dir(ckpt.dir)
    log.append("%s removed" % SIDECAR_NAME)
    origs = [n for n in os.listdir(ckpt.dir) if n.endswith(".orig")]
    if origs:
        log.append("left in place: %s (from --full-backup)" % ", ".join(sorted(origs)))
    return {"status": "restored", "path": ckpt.input, "exit_code": EXIT_OK, "files": files,
            "config": {"restored": any(step[0] == ckpt.config_path for step in json_steps)},
            "fingerprint": fingerprint(ckpt.input), "log": log}


# --------------------------------------------------------------------------------------------
# command line

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:   # no SystemExit(2) from inside a library call
        raise FixError(EXIT_USAGE, message)


def _parser(prog: Optional[str]) -> _Parser:
    parser = _Parser(
        prog=prog, description="Rename an EAGLE-3 drafter's weight keys (layers.0.* -> midlayer.*) "
        "and config for SGLang, in place and crash-safe, and check what SGLang would load.",
        epilog="exit codes: 0 ok, 1 --check: change needed, 2 usage, 6 invalid checkpoint, "
        "8 verification failed, 10 cannot write")
    parser.add_argument("path", help="drafter directory, or one .safetensors file")
    parser.add_argument("--rename", action="append", metavar="OLD=NEW",
                        help="rename keys starting with OLD to start with NEW (repeatable; replaces "
                        "the default layers.0.=midlayer.)")
    parser.add_argument("--hidden-states-from", choices=IDS_MODES, default="keep",
                        help="engine that extracted the training hidden states: vllm writes id-1 "
                        "for each aux layer id (SGLang captures one layer later); default keep")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sglang-generation", choices=sorted(GENERATIONS),
                       help="verify for SGLang 0.5.6-0.5.11 (legacy, default) or 0.5.12+ (modern)")
    group.add_argument("--sglang-version", metavar="X.Y.Z", help="verify for this SGLang version")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a change is needed")
    parser.add_argument("--restore", action="store_true",
                        help="put the original bytes back from the backup sidecar")
    parser.add_argument("--full-backup", action="store_true",
                        help="also copy each changed file to FILE.orig first")
    parser.add_argument("--fingerprint", action="store_true",
                        help="print the drafter fingerprint as JSON and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    return parser


def _render(summary: Dict[str, Any], out: Any) -> None:
    for line in summary.get("log", []):
        out.write(line + "\n")
    status = summary["status"]
    if status == "restored":
        out.write("restored: %s\n" % summary["path"])
        return
    verification = summary.get("verification") or {}
    if status == "needs_conversion":
        changed = [f["file"] for f in summary["files"] if f["mode"] != "unchanged"]
        out.write("needs conversion: %s (%d key(s) in %s%s)\n"
                  % (summary["path"], len(summary["renames"]), ", ".join(changed) or "no file",
                     ", config.json" if summary["config"]["converted"] else ""))
        after = summary.get("verification_after_conversion") or {}
        _render_verification("now", verification, out)
        _render_verification("after conversion", after, out)
    else:
        out.write("%s: %s\n" % (status.replace("_", " "), summary["path"]))
        _render_verification("", verification, out)
    out.write("fingerprint: %s\n" % summary.get("fingerprint"))


def _render_verification(when: str, verification: Dict[str, Any], out: Any) -> None:
    if not verification:
        return
    label = "verification%s for SGLang %s (%s)" % (" " + when if when else "",
                                                   verification.get("sglang_versions"),
                                                   verification.get("generation"))
    out.write("%s: %s\n" % (label, "ok" if verification.get("ok") else "FAILED"))
    for problem in verification.get("problems", []):
        out.write("  problem: %s\n" % problem)
    for note in verification.get("notes", []):
        out.write("  note: %s\n" % note)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, stdout: Any = None,
         stderr: Any = None) -> int:
    """The command line; returns the exit code (no traceback for user errors)."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    args_list = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args_list or "--fingerprint" in args_list
    try:
        args = _parser(prog).parse_args(args_list)
        as_json = args.json or args.fingerprint
        if args.restore or args.fingerprint:
            extra = [flag for flag, on in (("--check", args.check), ("--rename", args.rename),
                                           ("--full-backup", args.full_backup),
                                           ("--restore", args.restore and args.fingerprint))
                     if on]
            if extra:
                raise FixError(EXIT_USAGE, "%s cannot be combined with %s"
                               % ("--fingerprint" if args.fingerprint else "--restore",
                                  ", ".join(extra)))
        if args.fingerprint:
            summary: Dict[str, Any] = {"status": "fingerprint", "path": os.path.abspath(args.path),
                                       "fingerprint": fingerprint(args.path), "exit_code": EXIT_OK}
        elif args.restore:
            summary = restore(args.path)
        else:
            generation = args.sglang_version or args.sglang_generation or "legacy"
            summary = convert(args.path, renames=args.rename,
                              hidden_states_from=args.hidden_states_from, generation=generation,
                              full_backup=args.full_backup, dry_run=args.check)
        if as_json:
            out.write(json.dumps(summary) + "\n")
        else:
            _render(summary, out)
        code = int(summary.get("exit_code", EXIT_OK))
        if code == EXIT_VERIFY:
            verification = summary.get("verification") or {}
            err.write("error: verification failed for SGLang %s: %s\n"
                      % (verification.get("sglang_versions"),
                         "; ".join(verification.get("problems") or ["see above"])))
        out.flush()
        return code
    except FixError as exc:
        if as_json:
            out.write(json.dumps({"status": "error", "code": exc.code, "error": exc.message}) + "\n")
            out.flush()
        err.write("error: %s\n" % exc.message)
        return exc.code
    except SystemExit as exc:       # --help
        return int(exc.code or 0)
    except RecursionError:
        # every JSON is depth-checked; this is the last line of defence, never a traceback
        message = "an input is nested too deeply to process; refused"
        if as_json:
            out.write(json.dumps({"status": "error", "code": EXIT_CHECKPOINT, "error": message}) + "\n")
            out.flush()
        err.write("error: %s\n" % message)
        return EXIT_CHECKPOINT
    except KeyboardInterrupt:
        err.write("error: interrupted\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
