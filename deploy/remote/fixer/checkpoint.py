"""The drafter on disk: its weights files (links out of the directory detected), config.json,
the sharded index, and the fingerprint deployctl keys its drafter store by."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any, Dict, Optional, Tuple

from .errors import EXIT_CHECKPOINT, FixError
from .header import _parse_json, _read_bounded, _read_region, file_kind, open_regular

#: size limits of the JSON files beside the weights, checked before reading: a drafter's
#: config.json is ~2 KB; the index of a 1T-parameter model ~2 MB; the sidecar holds the headers.
MAX_CONFIG_BYTES = 16 << 20
MAX_INDEX_BYTES = 64 << 20
MAX_SIDECAR_BYTES = 256 << 20
CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SIDECAR_NAME = ".deployctl-fix-backup.json"


def _check_file_name(name: str, where: str) -> None:
    """A shard name from the index is a plain file name: '../x' or 'sub/x' would read and write
    files outside the checkpoint directory."""
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise FixError(EXIT_CHECKPOINT, "%s names the weights file %r, which is not a file name in "
                       "its directory (expected a name such as model-00001-of-00002.safetensors)"
                       % (where, name))


def inspect_entry(path: str, display: str = "") -> str:
    """'' when ``path`` is absent; 'file' when it is (or links to) a regular file; FixError 6 when it
    is something else: a FIFO, a directory, a socket, a device, a dangling link. A FIFO opened for
    reading blocks until a writer comes, so nothing is opened before this check."""
    display = display or path
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise FixError(EXIT_CHECKPOINT, "cannot read %s: %s" % (display, exc.strerror or exc))
    try:
        st = os.stat(path)
    except OSError:
        raise FixError(EXIT_CHECKPOINT, "%s is a dangling link (to %s); expected a regular file"
                       % (display, _link_text(path)))
    if not stat.S_ISREG(st.st_mode):
        what = file_kind(st.st_mode)
        if stat.S_ISLNK(lst.st_mode):
            what = "a link to %s" % what
        raise FixError(EXIT_CHECKPOINT, "%s is %s, not a regular file; refused" % (display, what))
    return "file"


def _link_text(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


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
        if inspect_entry(index_path):
            self.index_raw, self.index = _read_index(index_path)
        inspect_entry(self.config_path)
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
                if not inspect_entry(os.path.join(self.dir, name)):
                    raise FixError(EXIT_CHECKPOINT, "%s lists %s but %s has no such file"
                                   % (index_path, name, self.dir))
            if not names:
                raise FixError(EXIT_CHECKPOINT, "%s has an empty weight_map" % index_path)
        elif inspect_entry(os.path.join(self.dir, "model.safetensors")):
            names = ["model.safetensors"]
        else:
            names = sorted(n for n in os.listdir(self.dir)
                           if n.endswith(".safetensors") and not n.startswith(".")
                           and inspect_entry(os.path.join(self.dir, n)))
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
    """(raw, parsed), or (None, None) when there is no config.json; FixError 6 when config.json is
    a FIFO, a directory, a dangling link or anything else but a regular file."""
    if not inspect_entry(path):
        return None, None
    return _read_json_object(path)


def _dump_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def fingerprint(path: str) -> str:
    """sha256 (hex) over each weights file's name, size, mtime_ns and header bytes, and the JSONs."""
    ckpt = _Checkpoint(path)
    digest = hashlib.sha256(b"deployctl-drafter-fingerprint/1\n")
    for weights in sorted(ckpt.weights, key=lambda w: w.name):
        st = os.stat(weights.real)
        region, _ = _read_region(weights.real)
        if region is None:
            fd = open_regular(weights.real, weights.path)
            try:
                region = os.pread(fd, 8, 0)
            finally:
                os.close(fd)
        digest.update(("%s\0%d\0%d\0%d\0" % (weights.name, st.st_size, st.st_mtime_ns,
                                             len(region))).encode("utf-8"))
        digest.update(region)
    # bounded like every other read: a 2 GB config.json once took 2.1 GB of memory here
    for extra, limit, what in ((ckpt.config_path, MAX_CONFIG_BYTES, CONFIG_NAME),
                               (ckpt.index_path, MAX_INDEX_BYTES, INDEX_NAME)):
        if extra and inspect_entry(extra):
            data = _read_bounded(extra, limit, what)
            digest.update(("%s\0%d\0" % (os.path.basename(extra), len(data))).encode("utf-8"))
            digest.update(data)
    return digest.hexdigest()
