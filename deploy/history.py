"""Local history: one JSON line per host per invocation, in ``$XDG_STATE_HOME/deployctl/history.jsonl``.

Appended under a file lock (several deployctl runs may finish at once); a line that cannot be
parsed (a crash mid-write on an old kernel, a hand edit) is reported, never silently dropped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deploy.errors import DeployError, ExitCode
from deploy.local_state import state_home

FIELDS = ("time", "verb", "run", "host", "sglang_version", "drafter_fingerprint", "draft_tokens", "accept_length",
          "output_tok_s", "dataset", "dataset_sha256", "outcome", "exit_code", "duration_s")


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
            "exit_code": int(report.error.exit_code) if report.error is not None else 0,
            "duration_s": round(report.duration_s, 3),
        })
    return rows


def append(rows: Iterable[dict[str, Any]], path: Path | None = None) -> None:
    from filelock import FileLock

    path = path or history_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    if not text:
        return
    with FileLock(str(path) + ".lock", timeout=30):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def read(run: str | None = None, host: str | None = None, path: Path | None = None) -> list[dict[str, Any]]:
    path = path or history_path()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise DeployError(f"{path}: cannot read the history: {exc}", exit_code=ExitCode.IO) from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError
        except ValueError:
            raise DeployError(f"{path}:{number}: not a history record: {line[:120]!r}",
                              exit_code=ExitCode.CONFIG) from None
        if (run is None or row.get("run") == run) and (host is None or row.get("host") == host):
            rows.append(row)
    return rows
