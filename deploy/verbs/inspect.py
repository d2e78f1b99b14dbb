"""The read-only verbs: gpu-status, router status, doctor, logs. Each connects, reads and renders
nothing; none takes a lock or changes a host. Above the fleet (the router's state and checks live
there), below the CLI (which never talks SSH itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deploy.config.models import Config, Host, Run
from deploy.engine.plan import describe_endpoints
from deploy.engine.fanout import exit_code, for_each_host
from deploy.ssh.transport import HostConnection, JumpConnections

__all__ = ["describe_endpoints", "doctor", "exit_code", "follow_log", "gpu_status", "latest_log_path", "read_logs", "read_router",
           "router_status"]


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
            if state.get("alive"):  # the running router's package, from its command line
                running = running_package(str(state.get("cmdline") or ""))
                row["running_package"] = running
                row["package_text"] = package_text(running, installed)
            row.update(url=router.url, pid=state.get("pid"), alive=bool(state.get("alive")),
                       answering=bool(state.get("alive")) and state.get("status") == 200,
                       workers=[{"url": w["url"], "healthy": w["is_healthy"]} for w in state.get("workers", [])])
            if state.get("note"):
                row["note"] = str(state["note"])
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
