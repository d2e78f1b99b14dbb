#!/usr/bin/env python3
"""Add or remove a drafter fingerprint in the host's quarantine record (``<state_dir>/quarantine.json``).

Standalone, Python 3.8+ standard library only; deployctl sends it inline
(``python3 -c SOURCE deployctl-quarantine FILE add FINGERPRINT ENTRY_JSON`` or ``... remove FINGERPRINT``)
under the host lock, after a deployment of that fingerprint failed verification or was rolled back
(add), or verified after ``--retry-failed`` (remove). The record is small JSON, written to a temporary
file, fsynced and renamed into place, so a reader sees the old or the new record, never half of one.
Prints one JSON line: ``{"ok": true, "entries": N}``.
"""

from __future__ import annotations

import json
import os
import sys

MARK = "deployctl-quarantine"
MAX_BYTES = 256 << 10
#: the newest entries kept (a host that fails every night for a year keeps a bounded file)
KEEP = 64


def read(path: str) -> dict:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return {}
    if len(raw) > MAX_BYTES:
        raise ValueError("%s is larger than %d bytes" % (path, MAX_BYTES))
    document = json.loads(raw.decode("utf-8"))
    entries = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        raise ValueError("%s has no entries object" % path)
    return entries


def write(path: str, entries: dict) -> int:
    newest = sorted(entries.items(), key=lambda kv: str(kv[1].get("failed_at", "")) if isinstance(kv[1], dict) else "")
    kept = dict(newest[-KEEP:])
    document = {"schema": 1, "entries": kept}
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write(json.dumps(document, sort_keys=True, indent=1) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return len(kept)


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != MARK or args[2] not in ("add", "remove") or (args[2] == "add") != (len(args) == 5):
        sys.stderr.write("usage: quarantine.py %s FILE add FINGERPRINT ENTRY_JSON | remove FINGERPRINT\n" % MARK)
        return 2
    path, op, fingerprint = os.path.expanduser(args[1]), args[2], args[3]
    try:
        entries = read(path)
    except (OSError, ValueError) as exc:
        if op == "remove":
            sys.stderr.write("quarantine.py: %s\n" % exc)
            return 1
        entries = {}  # a corrupt record is replaced by one that holds the new failure
    if op == "add":
        entries[fingerprint] = json.loads(args[4])
    else:
        entries.pop(fingerprint, None)
    kept = write(path, entries)
    sys.stdout.write(json.dumps({"ok": True, "entries": kept}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
