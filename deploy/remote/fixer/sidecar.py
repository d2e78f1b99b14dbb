"""The backup sidecar (.deployctl-fix-backup.json): the original header bytes and JSON files,
written and fsynced before the first byte of the checkpoint changes, read back by --restore."""

from __future__ import annotations

import base64
import os
from typing import Any, Dict, List, Optional, Tuple

from .errors import EXIT_CHECKPOINT, FixError
from .header import _is_uint, _parse_json, _read_bounded
from .fileio import _b64, _page_size, _sha256
from .checkpoint import MAX_SIDECAR_BYTES, _Checkpoint

SIDECAR_FORMAT = "deployctl-fix-backup"


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
    return {"format": SIDECAR_FORMAT, "version": 1, "tool": "deployctl fixer",
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
