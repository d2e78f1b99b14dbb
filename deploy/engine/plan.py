"""The per-host plan of a playbook: every command each host would run, in order; touches nothing.

Built from the same step modules and action builders as the run (``plan(ctx)`` / ``run(ctx)``):
tests/integration/test_plan_is_run.py checks that what a run executed is what the plan listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deploy.config.models import Config, Host, Run
from deploy.engine.records import launch_stamp
from deploy.engine.session import network_host, step_context

if TYPE_CHECKING:
    from deploy.playbook import Playbook
    from deploy.steps.base import Action


def plan_playbook(playbook: Playbook, run: Run, hosts: Sequence[Host],
                  addresses: dict[str, str] | None = None,
                  lock: bool = False) -> dict[str, list[tuple[str, list[Action]]]]:
    """Every command each host would run, in order; touches nothing.

    ``addresses``: host name -> network address (the ssh_config HostName), where known.
    """
    from deploy.locks import host_lock_command

    stamp = launch_stamp()
    from deploy.steps.base import Command

    plans: dict[str, list[tuple[str, list[Action]]]] = {}
    for host in hosts:
        host = network_host(host, (addresses or {}).get(host.name, host.address))
        memory: dict[str, Any] = {}
        steps: list[tuple[str, list[Action]]] = []
        if lock:
            steps.append(("host-lock", [Command(
                description="hold the host lock (flock) for the whole run, on its own SSH channel; held elsewhere: exit 9",
                command=host_lock_command(host, "<owner>", script="<deploy/remote/host_lock.py>"))]))
        for step in playbook.steps:
            if not step.settings.enabled:
                continue
            ctx = step_context(host, run, step.settings, None, stamp, lambda m: None, memory, step=step.name)
            steps.append((step.name, step.module.plan(ctx)))
        plans[host.name] = steps
    return plans


def describe_endpoints(hosts: Sequence[Host], config: Config) -> dict[str, dict]:
    """Per host name: the effective SSH settings and their sources (for plan and gpu-status output)."""
    from deploy.transport import describe_endpoints as describe

    return describe(hosts, config.ssh)


def plan_with_endpoints(playbook: Playbook, run: Run, hosts: Sequence[Host], config: Config,
                        lock: bool = True) -> tuple[dict[str, list[tuple[str, list[Action]]]], dict[str, dict]]:
    """The plan of every host, with each host's SGLang bind address taken from its ssh_config HostName."""
    endpoints = describe_endpoints(hosts, config)
    addresses = {n: e["hostname"]["value"] for n, e in endpoints.items() if "hostname" in e}
    return plan_playbook(playbook, run, hosts, addresses, lock=lock), endpoints
