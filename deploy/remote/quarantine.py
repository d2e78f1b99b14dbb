#!/usr/bin/env python3
"""Add or remove a drafter fingerprint in the host's quarantine record (``<state_dir>/quarantine.json``).

Standalone, Python 3.8+ standard library only; deployctl sends it inline
(``python3 -c SOURCE deployctl-quarantine FILE add FINGERPRINT ENTRY_JSON`` or ``... remove FINGERPRINT``)
under the host lock, after a deployment of that fingerprint failed verification or was rolled back
(add), or verified after ``--retry-failed`` (remove). The record is small JSON, read bounded (a regular
file, 256 KiB, 64 levels deep) and written with host_ops.replace_file (an exclusive temporary name,
fsynced, renamed over a regular file only), so a reader sees the old or the new record, never half of one.
Prints one JSON line: ``{"ok": true, "entries": N}``.
"""

from __future__ import annotations

import json
import os
import sys

if __package__:  # imported locally, as deploy.remote.quarantine
    from . import host_ops
else:  # sent inline: deploy/facts/quarantine.py bundles host_ops beside it (deploy/facts/inline.py)
    import host_ops  # type: ignore[no-redef]

MARK = "deployctl-quarantine"
MAX_BYTES = 256 << 10
#: QuarantineRecord.SCHEMA (deploy/host/records.py); before issue 37 the key was "schema"
SCHEMA_VERSION = 1
#: the newest entries kept (a host that fails every night for a year keeps a bounded file)
KEEP = 64


class NotARecord(OSError):
    """quarantine.json is not a regular file (FIFO, directory, device, link): never read nor replaced."""


def read(path: str) -> dict:
    # O_NONBLOCK and fstat before any byte: a FIFO there held the helper 30 s (issue 31)
    text, problem = host_ops.read_regular(path, MAX_BYTES)
    if problem is not None:
        if "over the limit" in problem:
            raise ValueError(problem)
        raise NotARecord(problem)
    if text is None:
        return {}
    document = host_ops.loads_json(text)  # ValueError when nested deeper than MAX_JSON_DEPTH
    entries = document.get("entries") if isinstance(document, dict) else None
    if not isinstance(entries, dict):
        raise ValueError("%s has no entries object" % path)
    return entries


def write(path: str, entries: dict) -> int:
    newest = sorted(entries.items(), key=lambda kv: str(kv[1].get("failed_at", "")) if isinstance(kv[1], dict) else "")
    kept = dict(newest[-KEEP:])
    # the layout of deploy/host/records.py QuarantineRecord (tests/unit/test_records.py ties the two)
    document = {"schema_version": SCHEMA_VERSION, "entries": kept}
    host_ops.replace_file(path, (json.dumps(document, sort_keys=True, indent=1) + "\n").encode("utf-8"), 0o600)
    return len(kept)


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[0] != MARK or args[2] not in ("add", "remove") or (args[2] == "add") != (len(args) == 5):
        sys.stderr.write("usage: quarantine.py %s FILE add FINGERPRINT ENTRY_JSON | remove FINGERPRINT\n" % MARK)
        return 2
    path, op, fingerprint = os.path.expanduser(args[1]), args[2], args[3]
    try:
        entries = read(path)
    except NotARecord as exc:
        sys.stderr.write("quarantine.py: %s\n" % exc.args[0])
        return 1
    except (OSError, ValueError) as exc:
        if op == "remove":
            sys.stderr.write("quarantine.py: %s: %s\n" % (path, exc))
            return 1
        entries = {}  # a corrupt record is replaced by one that holds the new failure
    if op == "add":
        entries[fingerprint] = json.loads(args[4])
    else:
        entries.pop(fingerprint, None)
    try:
        kept = write(path, entries)
    except OSError as exc:
        sys.stderr.write("quarantine.py: %s\n" % (exc.strerror if exc.filename is None else exc))
        return 1
    sys.stdout.write(json.dumps({"ok": True, "entries": kept}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
