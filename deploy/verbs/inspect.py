"""The read-only verbs: gpu-status, router status, doctor, logs. Each connects, reads and renders
nothing; none takes a lock or changes a host. Above the fleet (the router's state and checks live
there), below the CLI (which never talks SSH itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploy.config.models import Config, Host, Run
from deploy.engine.plan import describe_endpoints
from deploy.engine.fanout import exit_code, for_each_host
from deploy.ssh.transport import HostConnection, JumpConnections

__all__ = ["DoctorReport", "GpuStatusReport", "LogsReport", "describe_endpoints", "doctor", "doctor_report", "exit_code",
           "follow_log", "follow_run_log", "gpu_status", "gpu_status_report", "latest_log_path", "logs_report",
           "read_logs", "read_router", "router_status"]


@dataclass
class GpuStatusReport:
    """``deployctl gpu-status``: every host's GPUs (HostOutcome[list[GpuRow]]), the routers running on
    them, their ssh endpoints, and the exit code."""

    outcomes: list
    routers: list[dict[str, Any]]
    endpoints: dict[str, dict]
    exit_code: int


def gpu_status_report(config: Config, host_names: Sequence[str], group: str | None) -> GpuStatusReport:
    from deploy.verbs.selection import select_hosts

    hosts = select_hosts(config, list(host_names), group)
    outcomes = gpu_status(config, hosts)
    routers = router_status(config, hosts)
    return GpuStatusReport(outcomes, routers, describe_endpoints(hosts, config), int(exit_code(outcomes)))


@dataclass
class DoctorReport:
    """``deployctl doctor``: per host (in order) its checks as dicts, and the exit code: the first
    unreachable host's code, else 8 when a check failed, else 0."""

    results: list[tuple[str, list[dict[str, Any]]]]
    exit_code: int


def doctor_report(config: Config, run_name: str | None, host_names: Sequence[str]) -> DoctorReport:
    from deploy.base.errors import ExitCode
    from deploy.verbs.selection import run_and_hosts

    run, hosts = run_and_hosts(config, run_name, tuple(host_names))
    results, code = [], ExitCode.OK
    for outcome in doctor(config, run, hosts):
        if outcome.error is not None:
            error = outcome.error
            checks = [{"name": "reachable", "status": "fail", "reason": str(error),
                       "fix": "check the host's address, SSH key and known_hosts" if error.exit_code ==
                       ExitCode.CONNECTION else "see the reason"}]
            if code == ExitCode.OK:
                code = ExitCode(error.exit_code)
        else:
            checks = [c.to_dict() for c in outcome.value]
            if code == ExitCode.OK and any(c["status"] == "fail" for c in checks):
                code = ExitCode.VERIFY
        results.append((outcome.host.name, checks))
    return DoctorReport(results, int(code))


@dataclass
class LogsReport:
    """``deployctl logs``: the run, each host's latest log (HostOutcome[str]) and the exit code."""

    run: Run
    outcomes: list
    exit_code: int


def logs_report(config: Config, run_name: str | None, host_names: Sequence[str], lines: int) -> LogsReport:
    from deploy.verbs.selection import run_and_hosts

    run, hosts = run_and_hosts(config, run_name, tuple(host_names))
    outcomes = read_logs(config, hosts, lines)
    return LogsReport(run, outcomes, int(exit_code(outcomes)))


def follow_run_log(config: Config, run_name: str | None, host_names: Sequence[str], lines: int) -> None:
    """``logs --follow``: one host's log, followed until Ctrl-C."""
    from deploy.base.errors import UsageError
    from deploy.verbs.selection import run_and_hosts

    _, hosts = run_and_hosts(config, run_name, tuple(host_names))
    if len(hosts) != 1:
        raise UsageError("--follow needs exactly one host (use --host NAME)")
    follow_log(config, hosts[0], lines)


def gpu_status(config: Config, hosts: Sequence[Host]) -> list:
    """nvidia-smi facts of every host, in parallel: HostOutcome[list[GpuRow]] in host order."""
    from deploy.facts.gpus import read_gpus

    def work(host: Host):
        with HostConnection(host, config.ssh, jumps) as conn:
            return read_gpus(conn, host.gpus)

    with JumpConnections() as jumps:
        return for_each_host(hosts, work, config.ssh.max_parallel)


def router_status(config: Config, hosts: Sequence[Host]) -> list[dict[str, Any]]:
    """gpu-status: each run's router that runs on one of ``hosts``: PID, alive, its workers."""
    names = {h.name for h in hosts}
    runs = [r for r in config.runs if r.router is not None and r.router.host in names]
    if not runs:
        return []
    with JumpConnections() as jumps:
        return [read_router(config, run, jumps) for run in runs]


def read_router(config: Config, run: Run, jumps: JumpConnections) -> dict[str, Any]:
    """One run's router, read-only (one SSH connection to its host): ``url``, ``pid``, ``alive`` (the
    process deployctl started there, fleet_ops.py router_pid), ``answering`` (GET of its worker list
    answered 200), ``workers`` [{url, healthy}], ``package``; ``error`` when the host could not be read.
    gpu-status shows it; status judges it (verbs/status.py judge_router)."""
    from deploy.engine.session import network_host
    from deploy.base.errors import DeployError
    from deploy.fleet.router import RouterHost
    from deploy.fleet.router_package import package_text, running_package

    assert run.router is not None
    host = config.host(run.router.host)
    row: dict[str, Any] = {"run": run.name, "host": host.name}
    try:
        with HostConnection(host, config.ssh, jumps) as conn:
            router = RouterHost(conn, network_host(host, conn.endpoint.hostname.value), run)
            state = router.state()
            installed = None
            try:
                installed = router.package()
                row["package"] = {"name": installed.name, "version": installed.version}
            except DeployError as exc:
                row["package"] = {"error": str(exc)}
            if state.alive:  # the running router's package, from its command line
                running = running_package(state.cmdline)
                row["running_package"] = running
                row["package_text"] = package_text(running, installed)
            row.update(url=router.url, pid=state.pid, alive=state.alive,
                       answering=state.alive and state.status == 200,
                       workers=[{"url": w.url, "healthy": w.is_healthy} for w in state.workers or []])
            if state.note:
                row["note"] = state.note
    except DeployError as exc:
        row["error"] = str(exc)
        row["exit_code"] = int(exc.exit_code)
    return row


def doctor(config: Config, run: Run, hosts: Sequence[Host]) -> list:
    """The doctor's checks on every host, in parallel (read-only): HostOutcome[list[Check]] in host order."""
    from deploy.steps.doctor import diagnose

    def work(host: Host):
        with HostConnection(host, config.ssh) as conn:
            return diagnose(conn, host, run, fix_keys_will_run=False)[0]

    outcomes = for_each_host(hosts, work, config.ssh.max_parallel)
    if run.router is not None:
        from deploy.fleet.doctor import add_router_checks

        add_router_checks(config, run, hosts, outcomes)
    return outcomes


def latest_log_path(host: Host) -> str:
    from deploy.host.state_layout import StatePaths

    return StatePaths(host.state_dir).latest_log


def read_logs(config: Config, hosts: Sequence[Host], lines: int) -> list:
    """The last ``lines`` lines of each host's latest server log: HostOutcome[str] in host order."""
    from deploy.base.shell import quote_path

    def work(host: Host) -> str:
        with HostConnection(host, config.ssh, jumps) as conn:
            return conn.check(f"tail -n {lines} -- {quote_path(latest_log_path(host))}",
                              what="reading the server log").stdout

    with JumpConnections() as jumps:
        return for_each_host(hosts, work, config.ssh.max_parallel)


def follow_log(config: Config, host: Host, lines: int) -> None:
    """Print the host's latest server log and follow it (``tail -F``) until Ctrl-C."""
    from deploy.base.shell import quote_path

    with HostConnection(host, config.ssh) as conn:
        conn.stream(f"tail -n {lines} -F -- {quote_path(latest_log_path(host))}")
