"""What a host session records: its steps, its outcome, how it was asked to run.

``HostReport`` is one host's result (steps, rollback, warnings, what it left running, facts for
history); ``StepRecord`` one step; ``RunOptions`` how a verb runs its playbook. Pure data: the
renderers, history and the fleet read these without loading SSH.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from typing import TYPE_CHECKING

from deploy.config.models import Host
from deploy.base.errors import DeployError, ExitCode

if TYPE_CHECKING:
    from deploy.engine.serving import Serving

Progress = Callable[[str, str, str], None]  # (host, step, message)


@dataclass
class StepRecord:
    name: str
    status: str  # ok | skipped | failed | not-run | disabled
    duration_s: float = 0.0
    detail: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    exit_code: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "status": self.status, "duration_s": round(self.duration_s, 3),
                "detail": self.detail, "attempts": self.attempts, "exit_code": self.exit_code, "data": self.data}


@dataclass
class RunOptions:
    """How a verb runs its playbook: lock or not, rollback or not, force a redeploy or not."""

    command: str = ""
    lock: bool = False
    owner: dict[str, Any] | None = None
    rollback: bool = True
    force: bool = False
    #: hosts a fleet kept in its router (a probe found them unchanged): converge must find them so,
    #: or fail before anything is stopped
    keep_serving: frozenset[str] = frozenset()
    #: host locks the run took before its first change (fleet/phases.py hold_host_locks: a fleet or
    #: ``down`` behind a router locks every host before the router is touched); a session uses the
    #: one held for its host instead of taking it again, and does not release it
    held_locks: dict[str, Any] = field(default_factory=dict)


class RolledBack(DeployError):
    exit_code = ExitCode.ROLLED_BACK


@dataclass
class HostReport:
    host: Host
    steps: list[StepRecord] = field(default_factory=list)
    error: DeployError | None = None
    #: the failure that started a rollback (``error`` is then the outcome: 11, 12 or 1)
    cause: DeployError | None = None
    rollback: list[StepRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    left_running: str | None = None
    #: for history: sglang_version, drafter_fingerprint, draft_tokens, accept_length, output_tok_s, converged
    facts: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    #: what the host serves after the run (deploy/engine/serving.py): the one decision for text, JSON, history
    serving: Serving | None = None
    #: whose failure it was (deploy/steps/failure_cause.py: crashed, not-ready, ..., benchmark-harness, host)
    failure_cause: str | None = None

    @property
    def not_run(self) -> bool:
        """No step ran (a later batch of a stopped roll): never reported as ``ok``."""
        return self.error is None and bool(self.steps) and all(s.status == "not-run" for s in self.steps)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.not_run

    @property
    def outcome(self) -> str:
        if self.not_run:
            return "not-run"
        if self.error is None:
            return "converged" if self.facts.get("converged") else "ok"
        return {ExitCode.ROLLED_BACK: "rolled-back", ExitCode.REGRESSION: "regression",
                ExitCode.LOCKED: "locked", ExitCode.INTERRUPTED: "interrupted",
                ExitCode.TERMINATED: "interrupted", ExitCode.HANGUP: "interrupted"}.get(self.error.exit_code, "failed")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host.name, "address": self.host.address, "ok": self.ok,
                                "outcome": self.outcome, "steps": [s.to_dict() for s in self.steps]}
        if self.rollback:
            data["rollback"] = [s.to_dict() for s in self.rollback]
        if self.warnings:
            data["warnings"] = self.warnings
        if self.error is not None:
            data["error"] = str(self.error)
            data["exit_code"] = int(self.error.exit_code)
        else:
            data["exit_code"] = 0
        if self.cause is not None:
            data["cause"] = str(self.cause)
        if self.failure_cause is not None:
            data["failure_cause"] = self.failure_cause
        if self.left_running is not None:
            data["left_running"] = self.left_running
        if self.serving is not None:
            data["serving"] = self.serving.to_dict()
        data["facts"] = self.facts
        data["duration_s"] = round(self.duration_s, 3)
        return data


def launch_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
