"""Run (or plan) a playbook on a run's hosts: one connection per host, hosts in parallel."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from deploy.config.models import Config, Host, Run
from deploy.errors import DeployError, ExitCode
from deploy.fanout import for_each_host
from deploy.playbook import Playbook
from deploy.steps.base import PlannedCommand, StepContext
from deploy.transport import HostConnection, JumpConnections

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
class HostReport:
    host: Host
    steps: list[StepRecord] = field(default_factory=list)
    error: DeployError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host.name, "address": self.host.address, "ok": self.ok,
                                "steps": [s.to_dict() for s in self.steps]}
        if self.error is not None:
            data["error"] = str(self.error)
            data["exit_code"] = int(self.error.exit_code)
        else:
            data["exit_code"] = 0
        return data


def launch_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _context(host: Host, run: Run, settings, conn, draft_tokens: int, stamp: str, progress, memory,
             cancelled: threading.Event | None = None) -> StepContext:
    return StepContext(host=host, run=run, settings=settings, conn=conn, draft_tokens=draft_tokens,
                       launch_stamp=stamp, progress=progress, memory=memory,
                       cancelled=cancelled or threading.Event())


def network_host(host: Host, address: str) -> Host:
    """The host as its steps see it: ``address`` is where it is on the network.

    The YAML address may be an ssh_config alias (``gpu-a``) that only ssh understands; SGLang's
    default bind address (a run without serve_host) must be the HostName it resolves to.
    """
    return host if address == host.address else host.model_copy(update={"address": address})


def plan_playbook(playbook: Playbook, run: Run, hosts: Sequence[Host], draft_tokens: int,
                  addresses: dict[str, str] | None = None) -> dict[str, list[tuple[str, list[PlannedCommand]]]]:
    """Every command each host would run, in order; touches nothing.

    ``addresses``: host name -> network address (the ssh_config HostName), where known.
    """
    stamp = launch_stamp()
    plans: dict[str, list[tuple[str, list[PlannedCommand]]]] = {}
    for host in hosts:
        host = network_host(host, (addresses or {}).get(host.name, host.address))
        memory: dict[str, Any] = {}
        steps = []
        for step in playbook.steps:
            if not step.settings.enabled:
                continue
            ctx = _context(host, run, step.settings, None, draft_tokens, stamp, lambda m: None, memory)
            steps.append((step.name, step.module.plan(ctx)))
        plans[host.name] = steps
    return plans


def _run_on_host(config: Config, playbook: Playbook, run: Run, host: Host, draft_tokens: int, stamp: str,
                 progress: Progress, cancelled: threading.Event, jumps: JumpConnections) -> HostReport:
    report = HostReport(host)
    memory: dict[str, Any] = {}
    try:
        conn = HostConnection(host, config.ssh, jumps)
        conn.connect()
    except DeployError as exc:
        report.error = exc
        report.steps = [StepRecord(s.name, "not-run") for s in playbook.steps]
        return report
    host = network_host(host, conn.endpoint.hostname.value)
    with conn:
        failed = False
        for step in playbook.steps:
            if failed or cancelled.is_set():
                report.steps.append(StepRecord(step.name, "not-run"))
                continue
            if not step.settings.enabled:
                report.steps.append(StepRecord(step.name, "disabled"))
                continue
            record = StepRecord(step.name, "failed")
            started = time.monotonic()
            for attempt in range(1, step.settings.retries + 2):
                record.attempts = attempt
                ctx = _context(host, run, step.settings, conn, draft_tokens, stamp,
                               lambda m, s=step.name: progress(host.name, s, m), memory, cancelled)
                progress(host.name, step.name, "start" if attempt == 1 else f"retry {attempt - 1}")
                try:
                    outcome = step.module.run(ctx)
                except DeployError as exc:
                    record.detail = str(exc)
                    record.exit_code = int(exc.exit_code)
                    if attempt <= step.settings.retries and not cancelled.is_set():
                        progress(host.name, step.name, f"failed, retrying: {str(exc).splitlines()[0][:200]}")
                        continue
                    if report.error is None:
                        report.error = exc
                    failed = step.settings.on_failure == "stop"
                    progress(host.name, step.name, f"FAILED: {str(exc).splitlines()[0][:300]}")
                    break
                record.status, record.detail, record.data = outcome.status, outcome.detail, outcome.data
                progress(host.name, step.name, f"{outcome.status}: {outcome.detail}")
                break
            record.duration_s = time.monotonic() - started
            report.steps.append(record)
    return report


def run_playbook(config: Config, playbook: Playbook, run: Run, hosts: Sequence[Host], draft_tokens: int,
                 progress: Progress) -> list[HostReport]:
    stamp = launch_stamp()
    cancelled = threading.Event()
    with JumpConnections() as jumps:  # one connection per jump host, shared by its targets
        outcomes = for_each_host(
            hosts, lambda h: _run_on_host(config, playbook, run, h, draft_tokens, stamp, progress, cancelled, jumps),
            config.ssh.max_parallel, cancel=cancelled,
        )
    reports = []
    for outcome in outcomes:
        if outcome.value is not None:
            reports.append(outcome.value)
        else:
            reports.append(HostReport(outcome.host, error=outcome.error))
    return reports


def exit_code(reports: Sequence[HostReport]) -> ExitCode:
    for report in reports:
        if report.error is not None:
            return ExitCode(report.error.exit_code)
    return ExitCode.OK
