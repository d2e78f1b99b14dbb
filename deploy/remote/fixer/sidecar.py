"""The backup sidecar (.deployctl-fix-backup.json): the original header bytes and JSON files,
written and fsynced before the first byte of the checkpoint changes, read back by --restore."""

from __future__ import annotations

import base64
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from .errors import EXIT_CHECKPOINT, FixError
from .header import _is_uint, _parse_json, _read_bounded
from .fileio import _b64, _page_size, _sha256
from .checkpoint import MAX_SIDECAR_BYTES, _Checkpoint

SIDECAR_FORMAT = "deployctl-fix-backup"


#: the sidecar's own hash: sha256 over its canonical JSON without this key. Version 2 sidecars
#: carry it; version 1 (deployctl before it) are accepted without it: every path and hash in them
#: is checked all the same (see _sidecar_problem, restoration.py), and refusing them would leave
#: their users no way back to the original bytes.
CONTENT_HASH = "content_sha256"
SIDECAR_VERSION = 2
MAX_NAME_BYTES = 255


def content_digest(sidecar: Dict[str, Any]) -> str:
    body = dict((k, v) for k, v in sidecar.items() if k != CONTENT_HASH)
    return _sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii"))


def seal(sidecar: Dict[str, Any]) -> Dict[str, Any]:
    sealed = dict(sidecar)
    sealed["version"] = SIDECAR_VERSION
    sealed[CONTENT_HASH] = content_digest(sealed)
    return sealed


def _load_sidecar(path: str) -> Optional[Dict[str, Any]]:
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):
        # deployctl writes the sidecar as a regular file (tmp + rename); a link is not its own
        raise FixError(EXIT_CHECKPOINT, "backup sidecar %s is a symbolic link (to %s), not the file "
                       "deployctl wrote; nothing was changed (move it away)" % (path, os.readlink(path)))
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
    if CONTENT_HASH in sidecar and sidecar[CONTENT_HASH] != content_digest(sidecar):
        raise FixError(EXIT_CHECKPOINT, "backup sidecar %s is damaged: its content does not match its "
                       "%s; it is not trusted and nothing was changed (move it away only if the "
                       "drafter holds its original bytes)" % (path, CONTENT_HASH))
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
    if CONTENT_HASH in sidecar and not isinstance(sidecar[CONTENT_HASH], str):
        return "%s is not a string" % CONTENT_HASH
    for name, entry in sidecar["files"].items():
        if (not isinstance(name, str) or not name or "/" in name or name in (".", "..")
                or _bad_text(name) or len(name.encode("utf-8", "replace")) > MAX_NAME_BYTES):
            return "file name %r is not a file in the checkpoint directory" % (name,)
        if not isinstance(entry, dict):
            return "entry %r is not an object" % name
        if not _is_record(entry.get("original")) or not _is_record(entry.get("source")):
            return "entry %r has no valid original/source header record" % name
        if not _is_record(entry.get("target"), with_mode=True):
            return "entry %r has no valid target header record" % name
        if "link" in entry and not _link_text_ok(entry["link"]):
            return "entry %r: link is not a link text (a non-empty string without NUL)" % name
        known = entry.get("known_sha256", [])
        if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
            return "entry %r: known_sha256 is not a list of strings" % name
    for key in ("config", "index"):
        entry = sidecar.get(key)
        if entry is None:
            continue
        if not isinstance(entry, dict) or not _is_record(entry.get("original")):
            return "%s entry has no valid original record" % key
        if "link" in entry and not _link_text_ok(entry["link"]):
            return "%s entry: link is not a link text (a non-empty string without NUL)" % key
        known = entry.get("known_sha256", [])
        if not isinstance(known, list) or not all(isinstance(k, str) for k in known):
            return "%s entry: known_sha256 is not a list of strings" % key
    return ""


def _bad_text(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _link_text_ok(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and not _bad_text(value) and len(value) <= 4096


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
    return {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "tool": "deployctl fixer",
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
