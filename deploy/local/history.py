"""Local history: one JSON line per host per invocation, in ``$XDG_STATE_HOME/deployctl/history.jsonl``.

Appended under a file lock (several deployctl runs may finish at once); a line that cannot be
parsed (a crash mid-write on an old kernel, a hand edit) is skipped with a warning naming its line,
never silently dropped and never fatal. Reads are bounded (deploy/local/state.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deploy.base.limits import parse_json
from deploy.local.state import LocalStateError, check_state_root, ensure_directory, read_regular, require_not_directory, state_home
from deploy.base.secrets import mask_secrets
from deploy.local.state import write_regular

FIELDS = ("time", "verb", "run", "host", "sglang_version", "drafter_fingerprint", "draft_tokens", "accept_length",
          "output_tok_s", "dataset", "dataset_sha256", "throughput_gate", "outcome", "exit_code", "duration_s", "serving")


def history_path() -> Path:
    return state_home() / "history.jsonl"


def records_for(verb: str, run: str, reports: Sequence, started_at: datetime | None = None) -> list[dict[str, Any]]:
    when = (started_at or datetime.now(timezone.utc)).isoformat(timespec="seconds")
    rows = []
    for report in reports:
        facts = report.facts or {}
        rows.append({
            "time": when, "verb": verb, "run": run, "host": report.host.name,
            "sglang_version": facts.get("sglang_version"), "drafter_fingerprint": facts.get("drafter_fingerprint"),
            "draft_tokens": facts.get("draft_tokens"), "accept_length": facts.get("accept_length"),
            "output_tok_s": facts.get("output_tok_s"),
            "dataset": facts.get("dataset"), "dataset_sha256": facts.get("dataset_sha256"), "outcome": report.outcome,
            # the throughput gate's verdict (pass | regression | inconclusive), ratio, interval, floor
            "throughput_gate": facts.get("throughput_gate"),
            "exit_code": int(report.error.exit_code) if report.error is not None else 0,
            "duration_s": round(report.duration_s, 3),
            # what the host serves after the run (deploy/engine/serving.py): the same decision as the report's
            "serving": report.serving.state if getattr(report, "serving", None) is not None else None,
            # "swapped" (into the running server, with what was verified) or "reloaded" and why (issue 29)
            "drafter_update": facts.get("drafter_update"),
            # a canary host's live window (issue 43, fleet/canary.py): decision, cause, ratios to the others
            "canary": facts.get("canary"),
        })
    return rows


#: history is one ~300-byte line per host per invocation: 64 MiB is ~200k records, years of use
MAX_HISTORY_BYTES = 64 << 20
#: a record is a flat object of a dozen fields; a longer line is not one of ours
MAX_RECORD_BYTES = 64 << 10
#: seconds to wait for another deployctl appending at the same moment
LOCK_TIMEOUT_S = 10


def append(rows: Iterable[dict[str, Any]], path: Path | None = None) -> None:
    """Append records under a lock; a history that is not a regular file is a LocalStateError (exit 10).

    The open is non-blocking: a FIFO as history.jsonl used to block ``up`` forever after the deploy,
    its report never printed. Callers after a deploy catch the error and warn (the deploy stands).
    """
    from filelock import FileLock, Timeout

    path = path or history_path()
    text = "".join(json.dumps(mask_secrets(row), sort_keys=True) + "\n" for row in rows)
    if not text:
        return
    ensure_directory(path.parent)
    lock_path = Path(str(path) + ".lock")
    require_not_directory(lock_path, "the history's lock file")
    try:
        with FileLock(str(lock_path), timeout=LOCK_TIMEOUT_S):
            write_regular(path, text.encode(), "the history", append=True)
    except Timeout:
        raise LocalStateError(f"{lock_path}: held by another process for over {LOCK_TIMEOUT_S} s; "
                              "history not appended") from None
    except OSError as exc:
        raise LocalStateError(f"{lock_path}: cannot lock the history: {exc.strerror or exc}") from None


def read(run: str | None = None, host: str | None = None, path: Path | None = None,
         warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """Records, oldest first. A line that is not a record (not UTF-8, not JSON, nested too deep, too
    long: a crash mid-write, a hand edit) is skipped and named in ``warnings``, never fatal."""
    if path is None:
        check_state_root()
    path = path or history_path()
    data = read_regular(path, MAX_HISTORY_BYTES, "the history")
    if data is None:
        return []
    rows = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        row = _record(raw)
        if row is None:
            if warnings is not None:
                warnings.append(f"{path}:{number}: skipped, not a history record: {raw[:80]!r}")
            continue
        if (run is None or row.get("run") == run) and (host is None or row.get("host") == host):
            rows.append(row)
    return rows


def _record(raw: bytes) -> dict[str, Any] | None:
    if len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        # a record is flat: '[' or '{' nested deeper than a few levels is not one (and json
        # recursion over 100k levels is a RecursionError)
        if raw.count(b"[") + raw.count(b"{") > 64:
            return None
        row = parse_json(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return row if isinstance(row, dict) else None
