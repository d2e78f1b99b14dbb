"""converge: leave a server alone when it already runs exactly what this run would launch.

Compares the desired state (launch argv with the drafter from the store, drafter fingerprint,
environment hash, SGLang version) with the record the last launch wrote on the host. Equal, PID
alive and /health 200: "already running as desired", and the orchestrator skips every step that
stops, frees or launches (a real model load is many minutes of lost service). ``--force``
redeploys anyway. Verification and benchmarks still run.
"""

from __future__ import annotations

from deploy.base.errors import DeployError, ExitCode
from deploy.facts.server import SNAPSHOT_FRESH_S, identity, parse_server_state, server_state_command
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.steps.fix_keys import parse_version, version_command
from deploy.host.deployment import DesiredDeployment
from deploy.steps.launch import desired
from deploy.steps.wait_ready import health_url

NAME = "converge"


class Settings(StepSettings):
    pass


def command(ctx: StepContext) -> str:
    return server_state_command(ctx.host.python, ctx.paths.helper("host_ops.py"), ctx.paths.root, health_url(ctx))


def version_action(ctx: StepContext) -> Command:
    return Command(description="read SGLang's version (package metadata) for the desired record",
                   when="sglang_generation is auto and neither doctor nor fix-keys read the version",
                   command=version_command(ctx), timeout_s=60)


def state_action(ctx: StepContext) -> Command:
    return Command(description="read the running server (PID file, deployment record, /health): alive, /health 200 "
                               "and the record as desired -> skip stop/free/launch/wait (--force: redeploy)",
                   when=f"doctor did not read it in this run, less than {SNAPSHOT_FRESH_S:g} s ago",
                   command=command(ctx), timeout_s=30, what="server-state")


def plan(ctx: StepContext) -> list[Command]:
    return [version_action(ctx), state_action(ctx)]


def would_converge(desired: DesiredDeployment, state) -> tuple[bool, str]:
    """(already running as desired?, why not): the one rule, for converge and the fleet's probe
    before it drains a replica (deploy/host/deployment.py builds ``desired`` for both)."""
    if state.record is None:
        return False, "no deployment is recorded on this host"
    changed = desired.differences(state.record)
    if changed:
        return False, ", ".join(changed) + " changed"
    if not state.alive:
        return False, "the recorded server is not running"
    if state.status != 200:
        return False, f"the server answers /health {state.status or state.error}"
    return True, "already running as desired"


def run(ctx: StepContext) -> StepOutcome:
    outcome = _decide(ctx)
    if ctx.memory.must_converge and not outcome.data.get("converged"):
        # the fleet kept this replica in the router because a probe found it unchanged; it changed since:
        # redeploying it now would stop a server that takes requests. Nothing was stopped.
        raise DeployError(f"{ctx.host.name}: {outcome.detail.removeprefix('redeploying: ')} since the check before "
                          "the drain, while this replica stayed in the router; nothing was stopped: run again",
                          exit_code=ExitCode.FAILED)
    return outcome


def _decide(ctx: StepContext) -> StepOutcome:
    if ctx.run.sglang_generation == "auto" and not ctx.memory.sglang_version:
        ctx.memory.sglang_version = parse_version(ctx.execute(version_action(ctx)), ctx.host.name,
                                                     ctx.run.sglang_python)
    wanted = desired(ctx)
    snapshot = ctx.memory.snapshot
    if snapshot is not None and snapshot.fresh:
        state = snapshot.server
    else:
        state = parse_server_state(ctx.execute(state_action(ctx)).stdout, ctx.host.name)
    changed = wanted.differences(state.record)
    data = {"desired": identity(wanted.record()), "recorded_pid": state.pid, "alive": state.alive, "health": state.status}
    if ctx.memory.force:
        return StepOutcome("ok", "--force: redeploying", data | {"converged": False})
    unchanged, why = would_converge(wanted, state)  # the one rule, shared with the fleet's pre-drain probe
    if not unchanged:
        return StepOutcome("ok", f"redeploying: {why}", data | {"converged": False} | ({"changed": changed} if changed else {}))
    assert state.record is not None and state.pid is not None
    ctx.memory.converged, ctx.memory.pid = True, state.pid
    ctx.memory.log, ctx.memory.deployment = state.record.log, state.record
    return StepOutcome("ok", f"already running as desired (pid {state.pid}); nothing touched",
                       data | {"converged": True, "pid": state.pid})
