"""What every playbook step shares: its context, its planned commands and its outcome.

A step module exposes ``NAME``, a pydantic ``Settings`` model (its playbook settings), and two
functions: ``plan(ctx) -> list[PlannedCommand]`` (pure: what it would run) and
``run(ctx) -> StepOutcome`` (a few lines that send those commands through the transport).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from deploy.config.models import Host, Run, Strict
from deploy.errors import Interrupted
from deploy.shell import path_join
from deploy.transport import Transport


class StepSettings(Strict):
    """Settings every step accepts in a playbook; each step adds its own (no booleans for numbers, no NaN)."""

    step: str
    enabled: bool = True
    timeout_s: float | None = Field(default=None, gt=0, le=24 * 3600)
    retries: int = Field(default=0, ge=0, le=10)
    on_failure: Literal["stop", "continue"] = "stop"


@dataclass(frozen=True)
class StatePaths:
    """Files deployctl keeps in the host's persistent state directory (never /tmp)."""

    root: str

    @property
    def helpers(self) -> str:
        return path_join(self.root, "helpers")

    @property
    def logs(self) -> str:
        return path_join(self.root, "logs")

    @property
    def latest_log(self) -> str:
        return path_join(self.root, "logs", "latest.log")

    @property
    def pidfile(self) -> str:
        return path_join(self.root, "server.pid")

    @property
    def drafters(self) -> str:
        return path_join(self.root, "drafters")

    def helper(self, filename: str) -> str:
        return path_join(self.helpers, filename)


@dataclass(frozen=True)
class PlannedCommand:
    description: str
    command: str
    argv: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"description": self.description, "command": self.command}
        if self.argv is not None:
            data["argv"] = self.argv
        return data


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
    memory: dict[str, Any] = field(default_factory=dict)
    #: set on Ctrl-C: polling steps stop at their next poll
    cancelled: threading.Event = field(default_factory=threading.Event)

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
