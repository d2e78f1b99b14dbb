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

__all__ = ["describe_endpoints", "doctor", "exit_code", "follow_log", "gpu_status", "latest_log_path", "read_logs", "router_status"]


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
    if not any(r.router is not None for r in config.runs):
        return []
    from deploy.engine.session import network_host
    from deploy.base.errors import DeployError
    from deploy.fleet.router import RouterHost
    from deploy.fleet.router_package import package_text, running_package

    names = {h.name for h in hosts}
    rows = []
    with JumpConnections() as jumps:
        for run in config.runs:
            if run.router is None or run.router.host not in names:
                continue
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
                               workers=[{"url": w["url"], "healthy": w["is_healthy"]} for w in state.get("workers", [])])
            except DeployError as exc:
                row["error"] = str(exc)
            rows.append(row)
    return rows


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
