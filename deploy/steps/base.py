"""What every playbook step shares: its context, the actions it performs and its outcome.

A step module exposes ``NAME``, a pydantic ``Settings`` model (its playbook settings), and two
functions built from the same pure action builders:

- ``plan(ctx) -> list[Action]``: every action the step may perform on the host, in order. An action
  that only runs under a condition says so (``when``); a value known only at run time (the PID the
  launch printed, the drafter's store path) is a ``<placeholder>``.
- ``run(ctx) -> StepOutcome``: performs some of exactly those actions, each through
  ``ctx.execute(action)`` (the only way a step reaches the host), and parses their output with facts.

``Command`` is one exec channel, ``Watch`` one exec channel whose lines stream back (a host-side poll
loop), ``Upload`` one SFTP session (files written under a temporary name, then renamed). The plan of
``deployctl plan`` is those actions as data; tests/integration/test_plan_is_run.py checks, for every
built-in playbook, that what ``run`` executed is what ``plan`` listed.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from deploy.config.models import Host, Run, Strict
from deploy.base.errors import Interrupted
from deploy.host.state_layout import StatePaths  # noqa: F401  (re-exported: steps use ctx.paths)
from deploy.steps.memory import StepMemory
from deploy.ssh.transport import CommandResult, Transport, WatchResult


class StepSettings(Strict):
    """Settings every step accepts in a playbook; each step adds its own (no booleans for numbers, no NaN)."""

    step: str
    enabled: bool = True
    timeout_s: float | None = Field(default=None, gt=0, le=24 * 3600)
    retries: int = Field(default=0, ge=0, le=10)
    on_failure: Literal["stop", "continue"] = "stop"


@dataclass(frozen=True, kw_only=True)
class Action:
    """Something a step does on a host; ``plan`` lists it, ``run`` performs it via ``ctx.execute``."""

    kind: ClassVar[str] = "action"
    description: str
    #: None: performed every time the step runs; otherwise the condition under which it is
    when: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "description": self.description}
        if self.when is not None:
            data["when"] = self.when
        return data

    @property
    def shown(self) -> str:
        """The one line ``deployctl plan`` prints under the description."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Command(Action):
    """One remote command (one exec channel), bounded on the host by coreutils ``timeout``."""

    kind: ClassVar[str] = "command"
    command: str
    argv: list[str] | None = None
    timeout_s: float | None = None
    #: a non-zero exit raises RemoteCommandFailed naming this; None: the step judges the exit code
    what: str | None = None
    #: what the command reads on stdin (a record to write, issue 38: never on a command line, where
    #: another user of the host reads it in /proc/*/cmdline and ARG_MAX bounds it); ``stdin_shown``
    #: names it in plans and reports, the bytes are never shown
    stdin: bytes | None = None
    stdin_shown: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict() | {"command": self.command}
        if self.argv is not None:
            data["argv"] = self.argv
        if self.stdin is not None or self.stdin_shown is not None:
            size = f"{len(self.stdin)} bytes" if self.stdin is not None else "on stdin"
            data["stdin"] = f"{self.stdin_shown or 'input'} ({size})"
        return data

    @property
    def shown(self) -> str:
        return self.command


@dataclass(frozen=True, kw_only=True)
class Watch(Action):
    """A host-side poll loop on one exec channel: each stdout line goes to the step's parser."""

    kind: ClassVar[str] = "watch"
    command: str
    timeout_s: float
    #: the longest a live host's loop stays silent (its heartbeat plus one slow sample): silence for
    #: longer (and longer than the connect timeout) means the host or the network froze, and the wait
    #: ends then, not at its deadline
    silence_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"command": self.command}

    @property
    def shown(self) -> str:
        return self.command


@dataclass(frozen=True, kw_only=True)
class UploadFile:
    remote: str
    content: bytes = field(repr=False)
    mode: int = 0o600


@dataclass(frozen=True, kw_only=True)
class Upload(Action):
    """Files written over one SFTP session into ``directory`` (created 0700 when missing): each under
    a temporary name, size-checked, then renamed into place, so a full disk never leaves a truncated file."""

    kind: ClassVar[str] = "upload"
    directory: str
    files: tuple[UploadFile, ...]
    #: the content is a secret (the run's environment): its digest is not shown either
    secret: bool = False

    def to_dict(self) -> dict[str, Any]:
        files = []
        for f in self.files:
            entry: dict[str, Any] = {"remote": f.remote, "mode": f"{f.mode:04o}"}
            if not self.secret:
                entry |= {"bytes": len(f.content), "sha256": hashlib.sha256(f.content).hexdigest()}
            files.append(entry)
        return super().to_dict() | {"directory": self.directory, "files": files}

    @property
    def shown(self) -> str:
        names = " ".join(f.remote for f in self.files)
        return f"sftp: mkdir -p {self.directory}; put {names} (temporary name, then rename)"


@dataclass
class StepOutcome:
    status: Literal["ok", "skipped", "failed"]
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepContext:
    host: Host
    run: Run
    settings: Any
    conn: Transport | None
    launch_stamp: str
    progress: Callable[[str], None] = lambda message: None
    #: values one step hands to a later one on the same host (e.g. the launched PID)
    memory: StepMemory = field(default_factory=StepMemory)
    #: set on Ctrl-C: polling steps stop at their next poll
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: (step, action) for every action performed on this host, in order (shared by the host's steps)
    journal: list[tuple[str, Action]] = field(default_factory=list)
    step: str = ""

    def pause(self, seconds: float) -> None:
        """Wait between polls; returns early and raises Interrupted when the command is cancelled."""
        if self.cancelled.wait(max(0.0, seconds)) or self.cancelled.is_set():
            raise Interrupted(f"{self.host.name}: interrupted")

    @property
    def draft_tokens(self) -> int:
        """The run's draft tokens: a ``--draft-tokens`` override is already in ``run`` (re-validated)."""
        return self.run.draft_tokens

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.host.state_dir)

    def timeout(self, default: float) -> float:
        return self.settings.timeout_s or default

    def require_conn(self) -> Transport:
        assert self.conn is not None, "step run without a connection"
        return self.conn

    def execute(self, action: Command) -> CommandResult:
        """Perform one planned command; the only way a step sends a command to its host."""
        conn = self.require_conn()
        self.journal.append((self.step, action))
        if action.stdin is not None:  # only then: a transport without stdin support serves every other command
            if action.what is not None:
                return conn.check(action.command, timeout=action.timeout_s, what=action.what, stdin=action.stdin)
            return conn.run(action.command, timeout=action.timeout_s, stdin=action.stdin)
        if action.what is not None:
            return conn.check(action.command, timeout=action.timeout_s, what=action.what)
        return conn.run(action.command, timeout=action.timeout_s)

    def execute_watch(self, action: Watch, on_line: Callable[[str], bool]) -> WatchResult:
        """Perform one planned host-side poll loop; ``on_line`` returns True once it has its answer."""
        conn = self.require_conn()
        self.journal.append((self.step, action))
        return conn.watch(action.command, on_line, timeout=action.timeout_s, cancelled=self.cancelled,
                          silence_s=action.silence_s)

    def execute_upload(self, action: Upload) -> None:
        """Perform one planned SFTP upload (temporary names, then renamed into place)."""
        conn = self.require_conn()
        self.journal.append((self.step, action))
        conn.upload(action.directory, [(f.content, f.remote, f.mode) for f in action.files])

