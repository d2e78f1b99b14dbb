"""--restore: put the original header bytes, config.json and index back from the sidecar."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from .errors import EXIT_CHECKPOINT, EXIT_IO, EXIT_OK, FixError
from .header import _read_bounded, _read_region
from .fileio import TMP_SUFFIX, _atomic_write, _close_quiet, _fsync_dir, _io_error, _sha256, _stage, _tmp_path, _unb64, _unlink_quiet, _write_all
from .checkpoint import INDEX_NAME, SIDECAR_NAME, _Checkpoint, fingerprint
from .sidecar import _known, _load_sidecar, _torn_between
from .conversion import _lock_dir, _rewrite_file


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
