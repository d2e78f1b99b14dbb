"""The server deployctl launched, as seen on the host: PID file, deployment record, /health.

``launch`` writes ``<state_dir>/deployment.json`` (the desired state it started: argv, drafter
fingerprint and store path, environment hash, SGLang version, PID, log). ``converge`` compares it
with what it would launch now; the orchestrator reads it after a failure to say what is left
running. ``last-good.json`` is the same record plus the numbers it was verified with. Both are read
into their models (deploy/host/records.py: DeploymentRecord, LastGood), strictly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from deploy.base.limits import parse_json
from deploy.base.errors import DeployError, ExitCode, RemoteOutputError
from deploy.base.shell import quote, quote_path
from deploy.facts.helpers import helper_python
# the deployment's identity is spelled once, next to the desired deployment it is compared with
from deploy.host.deployment import IDENTITY, env_hash, identity  # noqa: F401  (re-exported)
from deploy.host.records import DeploymentRecord, LastGood, Record, record_of
from deploy.host.state_layout import (StatePaths, deployment_path, last_good_env_path,  # noqa: F401  (re-exported)
                                 last_good_path)

def same_deployment(a: DeploymentRecord | None, b: DeploymentRecord | None) -> bool:
    ia, ib = identity(a), identity(b)
    return ia is not None and ia == ib and ia["argv"] is not None


def server_state_command(python: str, helper: str, state_dir: str, health_url: str) -> str:
    return " ".join([helper_python(python), quote_path(helper), "server-state",
                     "--pidfile", quote_path(StatePaths(state_dir).pidfile),
                     "--record", quote_path(deployment_path(state_dir)), "--url", quote(health_url)])


#: host_ops.check_server_pid's verdicts on the PID file (only the first two are ever signalled)
PID_CHECKS = ("verified", "unverified", "not-ours", "elsewhere", "dead", "invalid", "none")


@dataclass(frozen=True)
class ServerState:
    pid: int | None
    alive: bool
    status: int | None
    error: str | None
    record: DeploymentRecord | None
    #: what the PID file's PID is (PID_CHECKS): ``verified`` = alive and its command line is
    #: deployment.json's argv; ``not-ours`` = another program; ``elsewhere`` = the recorded server
    #: runs under a PID the file does not name. None: an older helper that did not say.
    pid_check: str | None = None
    #: why, in words (names the PID file and what it holds)
    pid_note: str | None = None
    #: what really runs when the PID file does not name the server: "PID 4242: python3 -m sglang..."
    running: str | None = None

    @property
    def healthy(self) -> bool:
        return self.alive and self.status == 200

    def describe(self) -> str:
        if not self.alive and self.pid_check in ("not-ours", "elsewhere", "invalid"):
            return f"unknown: {self.pid_note}" + (f" (running: {self.running})" if self.running else "")
        if not self.alive:
            return "nothing: no SGLang server of deployctl's is running on this host"
        drafter = (self.record.drafter_path if self.record else None) or "?"
        log = self.record.log if self.record and "log" in self.record.model_fields_set else "?"
        health = f"/health {self.status}" if self.status is not None else f"/health no answer ({self.error})"
        return f"SGLang pid {self.pid} ({health}), drafter {drafter}, log {log}"


def parse_server_state(output: str, source: str) -> ServerState:
    try:
        document = parse_json(output)
        pid = document["pid"]
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
            raise TypeError
        if not isinstance(document["alive"], bool):
            raise TypeError
        status = document["status"]
        if status is not None and (not isinstance(status, int) or isinstance(status, bool)):
            raise TypeError
        record = document["record"]
        if record is not None and not isinstance(record, dict):
            raise TypeError
        check = document.get("pid_check")
        if check is not None and check not in PID_CHECKS:
            raise TypeError
        texts = [document.get(k) for k in ("pid_note", "running")]
        if any(t is not None and not isinstance(t, str) for t in texts):
            raise TypeError
    except (ValueError, KeyError, TypeError, RecursionError):
        raise RemoteOutputError(f"{source}: server-state printed unexpected output: {output[:300]!r}") from None
    if record is not None and "unreadable" in record:
        record = None
    deployment = None if record is None else record_of(DeploymentRecord, record, f"{source}: deployment.json")
    return ServerState(pid, document["alive"], status, document.get("error"), deployment, check, texts[0], texts[1])


def parse_record(output: str, source: str, what: str) -> LastGood | None:
    """last-good.json read with ``head`` (empty output: no record), as its model: a field of another
    shape is an error naming the file and the field."""
    text = output.strip()
    if not text:
        return None
    if len(text) > MAX_RECORD_BYTES:
        raise RemoteOutputError(f"{source}: {what} is over {MAX_RECORD_BYTES} bytes: not a deployment record")
    try:
        document = parse_json(text)
        if not isinstance(document, dict) or not isinstance(document.get("argv"), list):
            raise TypeError
    except (ValueError, TypeError, RecursionError):  # 100k-deep nesting is a RecursionError
        raise RemoteOutputError(f"{source}: {what} is not a deployment record: {text[:200]!r}") from None
    return record_of(LastGood, document, f"{source}: {what}")


#: a record is a few KB; read one byte more than this to know it is over
MAX_RECORD_BYTES = 1 << 20


#: the launch's record placeholder for the PID only the host knows (the launch script fills it in)
PID_MARK = "__PID__"


def record_stdin(record: Record | dict[str, Any], host: str, what: str, *, pid_mark: bool = False) -> bytes:
    """A record as the bytes a write reads on stdin (issue 38: never on a command line, where another
    user of the host reads it, ``--admin-api-key`` included, in /proc/*/cmdline, and where over 128 KiB
    the exec failed: "connection lost"). At most MAX_RECORD_BYTES, what the readers read back (1 MiB):
    a larger one is refused naming it, nothing written (exit 10)."""
    document = record.document() if isinstance(record, Record) else record
    data = (json.dumps(document | {"pid": PID_MARK} if pid_mark else document, sort_keys=True) + "\n").encode()
    if len(data) > MAX_RECORD_BYTES:
        raise DeployError(f"{host}: {what} would be {len(data)} bytes, over the {MAX_RECORD_BYTES} bytes deployctl "
                          "reads back: not written (nothing changed)", exit_code=ExitCode.IO)
    return data


def read_record_command(path: str) -> str:
    # a regular file only (a FIFO would block cat), and bounded: head -c, not cat
    quoted = quote_path(path)
    return f"if [ -f {quoted} ]; then head -c {MAX_RECORD_BYTES + 1} -- {quoted} 2>/dev/null; fi; true"


#: a snapshot older than this is read again by converge (the server may have died since)
SNAPSHOT_FRESH_S = 30.0


@dataclass(frozen=True)
class RunSnapshot:
    """What the doctor's command read for the run's later steps, under the host lock."""

    taken_at: float
    #: the host python's version, "3.11.7"
    python: str
    helpers: dict[str, str | None]
    server: ServerState
    last_good: LastGood | None
    #: quarantine.json as text (None: absent), when the doctor's command read it (quarantine_read)
    quarantine: str | None = None
    quarantine_read: bool = False

    @property
    def fresh(self) -> bool:
        import time

        return time.monotonic() - self.taken_at < SNAPSHOT_FRESH_S


def snapshot_of(run_state, python: str, source: str, state_dir: str) -> RunSnapshot:
    """The doctor's ``run_state`` facts (a pydantic model) -> the snapshot; records parsed strictly."""
    import time

    state = parse_server_state(json.dumps(run_state.server), source)
    good = parse_record(run_state.last_good or "", source, last_good_path(state_dir))
    quarantine = getattr(run_state, "quarantine", None)
    return RunSnapshot(time.monotonic(), python, dict(run_state.helpers), state, good,
                       quarantine=quarantine.text if quarantine is not None else None,
                       quarantine_read=quarantine is not None)
