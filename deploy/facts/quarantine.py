"""The host's quarantine record: drafter fingerprints that failed verification or were rolled back there.

``<state_dir>/quarantine.json`` = ``{"schema_version": 1, "entries": {FINGERPRINT: {"failed_at", "verb", "run",
"exit_code", "reason", "drafter_path"}}}`` (its model: ``deploy/host/records.py`` QuarantineRecord; a record
written before issue 37 spells its version ``"schema": 1``), written only by ``deploy/remote/quarantine.py``
under the host lock. Read by the doctor's command (run_state) or with one bounded ``head``; parsed strictly:
a record that is not this shape is an error naming the file and the field, never "nothing quarantined".
"""

from __future__ import annotations

import json
from pathlib import Path

from deploy.base.limits import parse_json
from deploy.base.errors import RemoteOutputError
from deploy.host.records import QuarantineEntry, QuarantineRecord, validated
from deploy.facts.helpers import helper_python, host_ops_modules
from deploy.base.once import built_once
from deploy.facts.inline import inline_program
from deploy.base.shell import path_join, quote, quote_path

SOURCE = Path(__file__).resolve().parents[1] / "remote" / "quarantine.py"
MARK = "deployctl-quarantine"
MAX_BYTES = 256 << 10


def quarantine_path(state_dir: str) -> str:
    return path_join(state_dir, "quarantine.json")


def read_command(state_dir: str) -> str:
    # a FIFO there would block head: anything but a regular file is named, and the parser refuses it
    quoted = quote_path(quarantine_path(state_dir))
    return (f"if [ -e {quoted} ] && ! [ -f {quoted} ]; then printf '(not a regular file)\\n'; "
            f"else head -c {MAX_BYTES + 1} -- {quoted} 2>/dev/null; fi; true")


@built_once  # as the lock's and the doctor's programs
def update_program() -> str:
    """quarantine.py with host_ops beside it (its bounded reads and replace_file), one ``-c`` program."""
    return inline_program(host_ops_modules() + [("quarantine", SOURCE.read_text())], "quarantine")


def update_command(python: str, state_dir: str, op: str, fingerprint: str, entry: QuarantineEntry | None = None,
                   script: str | None = None) -> str:
    source = update_program() if script is None else script
    parts = [helper_python(python), "-c", quote(source), MARK, quote_path(quarantine_path(state_dir)), op,
             quote(fingerprint)]
    if op == "add":
        parts.append(quote(json.dumps({} if entry is None else entry.model_dump(mode="json", exclude_unset=True),
                                      sort_keys=True)))
    return " ".join(parts)


def parse_quarantine(text: str | None, source: str, what: str) -> QuarantineRecord:
    """The record (its entries: fingerprint -> entry); no record (absent, empty): nothing is quarantined."""
    if text is None or not text.strip():
        return QuarantineRecord(entries={})
    try:
        if len(text.encode()) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        return validated(QuarantineRecord, parse_json(text))
    except ValueError as exc:  # RecordShapeError names the field: entries.<fingerprint>.failed_at
        raise RemoteOutputError(f"{source}: {what} is not a quarantine record ({exc}): {text[:200]!r}; "
                                "remove the file to clear the quarantine") from None


def parse_update(output: str, source: str) -> int:
    try:
        document = parse_json(output.strip().splitlines()[-1])
        if document.get("ok") is not True or not isinstance(document.get("entries"), int):
            raise TypeError
    except (ValueError, TypeError, IndexError, AttributeError):
        raise RemoteOutputError(f"{source}: the quarantine helper printed {output[:300]!r}") from None
    return document["entries"]
