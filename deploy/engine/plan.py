"""The per-host plan of a playbook: every command each host would run, in order; touches nothing.

Built from the same step modules and action builders as the run (``plan(ctx)`` / ``run(ctx)``):
tests/integration/test_plan_is_run.py checks that what a run executed is what the plan listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from deploy.config.models import Config, Host, Run
from deploy.engine.records import launch_stamp
from deploy.engine.session import network_host, step_context

if TYPE_CHECKING:
    from deploy.engine.playbook import Playbook
    from deploy.steps.base import Action


def plan_playbook(playbook: Playbook, run: Run, hosts: Sequence[Host],
                  addresses: dict[str, str] | None = None,
                  lock: bool = False) -> dict[str, list[tuple[str, list[Action]]]]:
    """Every command each host would run, in order; touches nothing.

    ``addresses``: host name -> network address (the ssh_config HostName), where known.
    """
    from deploy.engine.locks import host_lock_command

    stamp = launch_stamp()
    from deploy.steps.base import Command
    from deploy.steps.memory import StepMemory

    plans: dict[str, list[tuple[str, list[Action]]]] = {}
    for host in hosts:
        host = network_host(host, (addresses or {}).get(host.name, host.address))
        memory = StepMemory()
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
    from deploy.ssh.transport import describe_endpoints as describe

    return describe(hosts, config.ssh)


def plan_with_endpoints(playbook: Playbook, run: Run, hosts: Sequence[Host], config: Config,
                        lock: bool = True) -> tuple[dict[str, list[tuple[str, list[Action]]]], dict[str, dict]]:
    """The plan of every host, with each host's SGLang bind address taken from its ssh_config HostName."""
    endpoints = describe_endpoints(hosts, config)
    addresses = {n: e["hostname"]["value"] for n, e in endpoints.items() if "hostname" in e}
    return plan_playbook(playbook, run, hosts, addresses, lock=lock), endpoints


def plan_failure(playbook: Playbook, run: Run, host: Host) -> list[tuple[str, list[Action]]]:
    """What a run sends to a host only when a step fails: the server-state read (what it was left
    running, whether the server died), its log tail, and the rollback (the last good record read,
    then the rollback steps relaunching that record's argv exactly)."""
    from deploy.engine.session import ROLLBACK_STEPS, rollback_steps, server_state_action
    from deploy.facts.server import last_good_path, read_record_command
    from deploy.steps.base import Command
    from deploy.host.records import LastGood
    from deploy.steps.memory import StepMemory
    from deploy.steps.wait_ready import tail_command

    rollback = "a step after stop-stale failed and a last good deployment is recorded (not with --no-rollback)"
    steps: list[tuple[str, list[Action]]] = [
        ("on failure", [server_state_action(host, run),
                        Command(description="the server's log tail", when="the server died",
                                command=tail_command("<the launch's log>"))]),
        ("rollback", [Command(description="read the last good deployment", when=rollback,
                              command=read_record_command(last_good_path(host.state_dir)))]),
    ]
    memory = StepMemory(rollback_record=LastGood(argv=["<the last good deployment's argv>"]))
    stamp = launch_stamp()
    for step in rollback_steps(playbook):
        ctx = step_context(host, run, step.settings, None, stamp, lambda m: None, memory, step=step.name)
        actions = [a if a.when else _with_when(a, rollback) for a in step.module.plan(ctx)]
        steps.append((f"rollback/{step.name}", actions))
    from deploy.facts.quarantine import update_command
    from deploy.host.records import QuarantineEntry
    from deploy.steps.quarantine import QUARANTINED_CAUSES

    steps.append(("quarantine", [
        Command(description="record the drafter fingerprint in the host's quarantine (restart/nightly refuse it: exit 13)",
                when=f"{QUARANTINED_CAUSES} (rolled back or not), the fingerprint is not the last good one",
                command=update_command(host.python, host.state_dir, "add", "<fingerprint>",
                                       QuarantineEntry(failed_at="<time>"),
                                       script="<deploy/remote/quarantine.py>")),
        Command(description="take a verified fingerprint out of the quarantine", when="it was quarantined (--retry-failed)",
                command=update_command(host.python, host.state_dir, "remove", "<fingerprint>",
                                       script="<deploy/remote/quarantine.py>"))]))
    assert {s.name for s in rollback_steps(playbook)} <= set(ROLLBACK_STEPS)
    return steps


def _with_when(action: Action, when: str) -> Action:
    import dataclasses

    return dataclasses.replace(action, when=when)
