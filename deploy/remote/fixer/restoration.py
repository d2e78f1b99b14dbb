"""--restore: put the original header bytes, config.json and index back from the sidecar."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from .errors import EXIT_CHECKPOINT, EXIT_IO, EXIT_OK, FixError
from .header import _pread_exact, _read_bounded, _read_region, open_regular
from .fileio import TMP_SUFFIX, _atomic_write, _close_quiet, _fsync_dir, _io_error, _sha256, _stage, _tmp_path, _unb64, _unlink_quiet, _write_all
from .checkpoint import (CONFIG_NAME, INDEX_NAME, MAX_CONFIG_BYTES, MAX_INDEX_BYTES, SIDECAR_NAME, _Checkpoint,
                         fingerprint, inspect_entry)
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


def _inside(directory: str, path: str) -> bool:
    real_dir = os.path.realpath(directory).rstrip("/")
    return os.path.realpath(path).startswith(real_dir + "/")


def link_leaves(directory: str, link: str) -> str:
    """Why putting the JSON file link ``link`` back in ``directory`` would point the checkpoint out
    of it ('' when it may go back): its target must be inside the directory, or, for the Hugging
    Face cache layout ``<repo>/snapshots/<rev>/x -> ../../blobs/<sha>``, in that repo's blobs/. A
    forged sidecar once turned config.json into a link to /etc/passwd this way; otherwise the
    original bytes are written into the directory's own file instead."""
    target = os.path.realpath(os.path.join(directory, link))
    real_dir = os.path.realpath(directory)
    if target.startswith(real_dir.rstrip("/") + "/"):
        return ""
    snapshots = os.path.dirname(real_dir)
    if os.path.basename(snapshots) == "snapshots" and \
            os.path.dirname(target) == os.path.join(os.path.dirname(snapshots), "blobs"):
        return ""
    return "it leads out of the checkpoint directory (to %s)" % target


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
        shown = os.path.join(ckpt.dir, name)
        file_path = os.path.realpath(shown)
        if not inspect_entry(shown):
            raise FixError(EXIT_CHECKPOINT, "%s is in the backup %s but missing"
                           % (shown, SIDECAR_NAME))
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
            rfd = open_regular(file_path, shown)
            try:
                head = _pread_exact(rfd, len(target), 0)
            finally:
                os.close(rfd)
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
            # a weights link may lead out (a shared blob): it goes back only to a regular file
            # holding the original header and size recorded in the (hash-checked) sidecar
            _check_link_target(ckpt.dir, name, link, entry)
        if state == "converted" and link is None:
            # the bytes go into file_path itself: it must be this directory's own file
            if not _inside(ckpt.dir, file_path):
                raise FixError(EXIT_CHECKPOINT, "%s is a link to %s, outside the checkpoint directory: "
                               "--restore writes only inside it; nothing restored" % (shown, file_path))
            links = os.stat(file_path).st_nlink
            if links > 1:
                raise FixError(EXIT_CHECKPOINT, "%s has %d hard links (its bytes are shared with files "
                               "elsewhere): --restore does not write through them; nothing restored"
                               % (shown, links))
        steps.append((name, file_path, state, original, current, size, link))
    json_steps = []
    for key, json_path in (("index", os.path.join(ckpt.dir, INDEX_NAME)),
                           ("config", ckpt.config_path)):
        entry = sidecar.get(key)
        if not isinstance(entry, dict):
            continue
        original = _unb64(entry["original"]["b64"])
        current = None
        if inspect_entry(json_path):
            current = _read_bounded(json_path, MAX_INDEX_BYTES if key == "index" else MAX_CONFIG_BYTES,
                                    INDEX_NAME if key == "index" else CONFIG_NAME)
        if current == original:
            continue
        if current is not None and _sha256(current) not in _known(entry):
            raise FixError(EXIT_CHECKPOINT, "%s changed since it was converted (it matches neither "
                           "the original nor the converted version); nothing restored" % json_path)
        link = entry.get("link")
        if link is not None and link_leaves(ckpt.dir, link):
            log.append("%s: the link %s is not put back: %s; the original bytes are restored instead"
                       % (os.path.basename(json_path), link, link_leaves(ckpt.dir, link)))
            link = None
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
    # only the temporary files this fixer names (".<file>.tmp-fix"), never another file
    ours = set(sidecar["files"]) | {CONFIG_NAME, INDEX_NAME, SIDECAR_NAME}
    ours |= set(n + ".orig" for n in list(ours))
    for name in sorted(n for n in os.listdir(ckpt.dir)
                       if n.startswith(".") and n.endswith(TMP_SUFFIX) and n[1:-len(TMP_SUFFIX)] in ours):
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
