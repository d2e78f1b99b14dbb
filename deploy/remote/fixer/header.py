"""The safetensors header: strict read (size, depth, duplicate-key, NaN and offset checks), render.

Shared with the doctor, which embeds this module in its inline ``python3 -c`` program
(deploy/facts/inline.py), so it imports nothing but the standard library and ``.errors``."""

from __future__ import annotations

import json
import os
import stat
import struct
from typing import Any, Dict, List, Optional, Tuple

from .errors import EXIT_CHECKPOINT, FixError

#: safetensors refuses headers above 100 MB (safetensors/src/tensor.rs MAX_HEADER_SIZE).
MAX_HEADER_LEN = 100000000

#: nesting depth of any JSON read here (a safetensors header is 3 deep, config.json ~4).
MAX_JSON_DEPTH = 64

#: bits per element, every dtype safetensors 0.8 accepts.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}


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
    """Nesting depth of a parsed JSON value, without recursion, one level at a time (a header of
    200,000 tensors is 800,000 values: a level's values are gathered by list.extend, not a tuple each,
    1.1 -> 0.3 s here), stopping one level past MAX_JSON_DEPTH."""
    deepest, level = 0, [document]
    while deepest <= MAX_JSON_DEPTH:
        containers = [value for value in level if isinstance(value, (dict, list))]
        if not containers:
            break
        deepest += 1
        level = []
        for value in containers:
            level.extend(value.values() if isinstance(value, dict) else value)
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
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
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


def open_regular(path: str, display: Optional[str] = None) -> int:
    """An O_RDONLY fd of the regular file ``path``; FixError 6 naming it otherwise.

    O_NONBLOCK: opening a FIFO for reading blocks until a writer comes (a drafter whose
    model.safetensors is a FIFO hung doctor and up for 75 s); with it the open returns at once and
    the fstat below refuses it. The flag is cleared again for the regular file it admits.
    """
    display = display or path
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FixError(EXIT_CHECKPOINT, "%s does not exist" % display)
    except OSError as exc:
        raise FixError(EXIT_CHECKPOINT, "cannot read %s: %s" % (display, exc.strerror or exc))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise FixError(EXIT_CHECKPOINT, "%s is not a regular file (%s); refused"
                           % (display, file_kind(mode)))
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a file"


def _read_region(path: str) -> Tuple[Optional[bytes], int]:
    """The prefix and header bytes as they are, unvalidated (None when the length is absurd)."""
    fd = open_regular(path)
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
    fd = open_regular(path, display)
    try:
        st = os.fstat(fd)
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
        # a list or object here is unhashable: test the type before the table lookup
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
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
