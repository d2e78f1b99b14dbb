"""swap-drafter: put a new drafter into the running server instead of reloading the target.

Opt in (``drafter_update: swap`` on the run, ``restart --swap-drafter``; ``--reload`` refuses it):
not yet seen on real GPUs. ``swap_decision.swap_decision`` says swap or reload, and why; on reload
this step does nothing and the playbook's stop/free/launch steps run as always.

A swap, through SGLang's weight-update session (0.5.21+, deploy/remote/drafter_swap.py under the
run's sglang_python, the drafter fingerprint as ``weight_version``), is verified before anything is
recorded: ``/model_info`` reports the fingerprint, the server's PID is unchanged, and acceptance
passes as after a launch (verify-acceptance's own check and threshold). Verified: deployment.json
says "swapped" and what was verified (its ``argv`` is what the server now serves as, the process's
own command line stays as ``launched_argv``), and the steps that stop, free, launch and wait are
skipped as for converge. Any failure after the tensors were sent (an HTTP error, another
``weight_version``, a changed PID, acceptance under the threshold) marks the record as not what
anyone asked for and lets the playbook reload the new drafter; that reload failing is today's
rollback. The server is never recorded as serving a drafter that was not verified.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import Field

from deploy.base.errors import ConnectionFailed, DeployError, Interrupted
from deploy.facts.drafter_swap import (SENDER, SendSummary, SwapInspection, inspect_command, parse_inspection,
                                      parse_send, send_command)
from deploy.facts.server import ServerState, deployment_path, parse_server_state, record_stdin
from deploy.host.records import DeploymentRecord, DrafterUpdate
from deploy.base.shell import quote_path
from deploy.steps import converge, verify_acceptance
from deploy.base.terminal import safe_line
from deploy.steps.base import Action, Command, CommandResult, StepContext, StepOutcome, StepSettings
from deploy.steps.swap_decision import RunningServer, SwapDecision, base_gpu_id, requested_mode, swap_decision
from deploy.steps.launch import _written, desired, env_path

NAME = "swap-drafter"

#: converge found the server as desired: there is nothing to swap either
CONVERGE_SKIPS = True


class Settings(StepSettings):
    #: run: the run's drafter_update; swap / reload: the command's --swap-drafter / --reload
    mode: Literal["run", "swap", "reload"] = "run"
    send_timeout_s: float = Field(default=600, gt=0, le=3600)
    #: the acceptance check after a swap: the same as verify-acceptance's after a launch
    min_accept_length: float = Field(default=1.5, ge=1.0)
    requests: int = Field(default=4, ge=1, le=64)
    max_new_tokens: int = Field(default=256, ge=8, le=8192)
    concurrency: int = Field(default=4, ge=1, le=64)


def _override(ctx: StepContext) -> str | None:
    return None if ctx.settings.mode == "run" else ctx.settings.mode


def decide(ctx: StepContext, running: RunningServer | None = None,
           inspection: SwapInspection | None = None) -> SwapDecision:
    return swap_decision(ctx.run, desired(ctx), running, inspection, _override(ctx))


def _verify_ctx(ctx: StepContext) -> StepContext:
    s = ctx.settings
    settings = verify_acceptance.Settings(step=verify_acceptance.NAME, min_accept_length=s.min_accept_length,
                                          requests=s.requests, max_new_tokens=s.max_new_tokens,
                                          concurrency=s.concurrency)
    return dataclasses.replace(ctx, settings=settings)


def base_url(ctx: StepContext) -> str:
    return verify_acceptance.base_url(ctx)


def inspect_action(ctx: StepContext, running_drafter: str = "<the running drafter's store path>") -> Command:
    return Command(description="swap check (read-only): both drafters' config, tensor shapes and vocabulary map, "
                               "and each GPU's free memory",
                   when="the swap decision so far is swap",
                   command=inspect_command(ctx.run.sglang_python, ctx.paths.helper(SENDER), running_drafter,
                                           ctx.memory.drafter_path or "<the new drafter's store path>"),
                   timeout_s=120, what="drafter inspection")


def send_action(ctx: StepContext) -> Command:
    wanted = desired(ctx)
    return Command(description="swap the drafter into the running server: SGLang's weight-update session "
                               "(begin selector draft, update_weights_from_tensor with one payload per TP rank and "
                               "the fingerprint as weight_version, end; each holds new requests behind SGLang's "
                               "model-update lock), /flush_cache, then /model_info's weight_version",
                   when="the swap decision is swap",
                   command=send_command(ctx.run.sglang_python, ctx.paths.helper(SENDER), base_url(ctx),
                                        wanted.drafter_path or "<drafter>",
                                        wanted.drafter_fingerprint or "<drafter fingerprint>", ctx.run.tp_size,
                                        base_gpu_id(list(wanted.argv)), ctx.paths.root, ctx.settings.send_timeout_s,
                                        env_path(ctx) if ctx.run.env else None),
                   timeout_s=ctx.settings.send_timeout_s + 30, what="drafter swap")


def after_action(ctx: StepContext) -> Command:
    return dataclasses.replace(converge.state_action(ctx), when="tensors were sent",
                               description="read the running server again: the same PID, alive, /health 200")


def _record_command(ctx: StepContext, pid: int | None) -> str:
    path = quote_path(deployment_path(ctx.paths.root))
    return f"pid={pid if pid is not None else '<pid>'}; {_written(ctx, path, None, 'the deployment record')}"


def _record_write(ctx: StepContext, record: DeploymentRecord | None, pid: int | None, **fields: Any) -> Command:
    """The record on the command's stdin (launch.record_stdin: never on its command line, 1 MiB at most)."""
    data = record_stdin(record, ctx.host.name, "the deployment record") if record is not None else None
    return Command(command=_record_command(ctx, pid), stdin=data, stdin_shown="the deployment record (JSON)",
                   timeout_s=30, what="deployment record", **fields)


def mark_action(ctx: StepContext, record: DeploymentRecord | None = None, pid: int | None = None) -> Command:
    """Before the first tensor leaves (issue 38): from here until a verified answer the server's
    drafter is unknown, whatever ends the swap (a signal, a crash of the sender or of deployctl)."""
    return _record_write(ctx, record, pid,
                         description="deployment record: swapping (no fingerprint until the swap is verified: a swap "
                                     "cut short by a signal or a crash leaves a server that nothing converges on)",
                         when="the swap decision is swap, before the first tensor leaves")


def restore_action(ctx: StepContext, record: DeploymentRecord | None = None, pid: int | None = None) -> Command:
    return _record_write(ctx, record, pid,
                         description="deployment record: put back as it was (the server refused the swap before any "
                                     "tensor was sent)",
                         when="the server refused the session before any tensor was sent")


def record_action(ctx: StepContext, record: DeploymentRecord | None = None, pid: int | None = None) -> Command:
    return _record_write(ctx, record, pid,
                         description="deployment record: swapped (the served drafter and what was verified) or "
                                     "swap-failed (no fingerprint: nothing converges on a server whose drafter is unknown)",
                         when="tensors were sent")


def state_action(ctx: StepContext) -> Command:
    """converge's server-state read, described with the decision as far as it is known without the host."""
    decision = decide(ctx)
    return dataclasses.replace(converge.state_action(ctx), description=f"drafter update: {decision.path} "
                               f"({decision.reason}); read the running server (PID, record, /health)")


def plan(ctx: StepContext) -> list[Action]:
    decision = decide(ctx)
    if decision.path == "reload":
        return [dataclasses.replace(state_action(ctx), when="never in this run: the steps below reload")]
    return [state_action(ctx), inspect_action(ctx), mark_action(ctx), send_action(ctx), restore_action(ctx),
            after_action(ctx), *verify_acceptance.plan(_verify_ctx(ctx)), record_action(ctx)]


def _state(ctx: StepContext) -> ServerState:
    snapshot = ctx.memory.snapshot
    if snapshot is not None and snapshot.fresh:
        return snapshot.server
    return parse_server_state(ctx.execute(state_action(ctx)).stdout, ctx.host.name)


def _reload(ctx: StepContext, reason: str, extra: dict | None = None) -> StepOutcome:
    asked, _ = requested_mode(ctx.run, _override(ctx))
    # the launch writes this into deployment.json (launch.desired_record): a fallback says it reloaded, and why
    ctx.memory.drafter_update = DrafterUpdate.model_validate(
        {"how": "reloaded", "why": reason, "asked": asked, "at": _now()} | (extra or {}))
    return StepOutcome("skipped", f"reload: {reason}", {"path": "reload", "reason": reason} | (extra or {}))


def run(ctx: StepContext) -> StepOutcome:
    decision = decide(ctx)
    if decision.path == "reload":
        return _reload(ctx, decision.reason)
    state = _state(ctx)
    running = RunningServer(state.record, state.alive, state.status, state.pid)
    decision = decide(ctx, running)
    if decision.path == "reload":
        return _reload(ctx, decision.reason)
    assert state.record is not None and state.pid is not None
    seen = parse_inspection(ctx.execute(inspect_action(ctx, state.record.drafter_path or "")).stdout,
                            ctx.host.name)
    decision = decide(ctx, running, seen)
    if decision.path == "reload":
        return _reload(ctx, decision.reason)
    return _swap(ctx, state, decision)


def sender_died(result: CommandResult) -> str:
    """Why the sender printed no summary, in one line: its exit status and its last line that says
    something (a traceback's last line, not the ``^^^^`` under it), sanitised and cut."""
    code = result.exit_code
    how = f"the sender exited with code {code}" + (" (killed: SIGKILL, e.g. out of memory)" if code in (137, -9) else "")
    words = [line.strip() for line in (result.stderr or "").splitlines()
             if line.strip() and not set(line.strip()) <= set("^~ ") and not line.startswith((" ", "Traceback"))]
    return how + (f"; its last words: {safe_line(words[-1])[:200]!r}" if words else ", with no output")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _marked(record: DeploymentRecord, how: Literal["swapping", "swap-failed"], fingerprint: str | None,
            **more: Any) -> DeploymentRecord:
    """The running record with its drafter unknown (no fingerprint, ``drafter_update.how``: swapping or
    swap-failed; deploy/host/deployment.py UNKNOWN_DRAFTER): its argv, PID and launched_argv stay,
    which stop and the PID check compare."""
    return record.but(drafter_fingerprint=None,
                      drafter_update=DrafterUpdate.model_validate(
                          {"how": how, "at": _now(), "from": record.drafter_fingerprint, "to": fingerprint, **more}))


def _failed(ctx: StepContext, state: ServerState, fingerprint: str | None, why: str,
            verified: dict[str, Any]) -> StepOutcome:
    # The server may hold the new drafter, the old one or a mix: nothing may converge on it.
    assert state.record is not None
    ctx.execute(record_action(ctx, _marked(state.record, "swap-failed", fingerprint, why=why), state.pid))
    ctx.memory.verify = None
    ctx.progress(f"swap failed verification: {why}; reloading the new drafter")
    return _reload(ctx, f"the swap failed verification: {why}", {"sent": True, "verified": verified})


#: errors after which no further command is sent: the swapping mark on the host says what is known
_STOPS = (Interrupted, ConnectionFailed)


def _swap(ctx: StepContext, state: ServerState, decision: SwapDecision) -> StepOutcome:
    assert state.record is not None
    wanted = desired(ctx)
    fingerprint = wanted.drafter_fingerprint
    ctx.progress(f"swapping the drafter into pid {state.pid}: {decision.reason}")
    ctx.execute(mark_action(ctx, _marked(state.record, "swapping", fingerprint), state.pid))
    try:
        # its exit status is judged here, not by check(): a dead sender is an unknown outcome, not exit 1
        sent = ctx.execute(dataclasses.replace(send_action(ctx), what=None))
        if sent.exit_code != 0:
            return _failed(ctx, state, fingerprint, f"the swap's outcome is unknown: {sender_died(sent)}", {})
        summary = parse_send(sent.stdout, ctx.host.name)
    except _STOPS:
        raise
    except DeployError as exc:
        # the sender outlived its bound, or printed what is not its summary: tensors may have gone
        # out, the server's drafter is unknown
        return _failed(ctx, state, fingerprint, f"the swap's outcome is unknown: {str(exc).splitlines()[0][:300]}",
                       {})
    if not summary.sent:
        # refused before any tensor was sent (version, key, session): the server is as it was
        ctx.execute(restore_action(ctx, state.record, state.pid))
        why = f"the server refused the swap at {summary.stage} (HTTP {summary.http_status}: {summary.message})"
        return _reload(ctx, why, {"sent": False})
    # held_s: how long SGLang's model-update writer lock could hold new requests back (the begin, update
    # and end calls' durations, measured by the sender; tokenizer_control_mixin.py 0.5.21 - 0.5.23)
    verified: dict[str, Any] = {"weight_version": summary.weight_version, "tensors": summary.tensors,
                                "send_s": summary.seconds, "cache_flushed": summary.flushed,
                                "held_s": summary.held_s, "held": dict(summary.held)}
    try:
        failures = _verify(ctx, state, summary, fingerprint, verified)
    except _STOPS:
        raise
    except DeployError as exc:
        failures = [f"verifying the swap failed: {str(exc).splitlines()[0][:300]}"]
    if failures:
        return _failed(ctx, state, fingerprint, "; ".join(failures), verified)
    update = DrafterUpdate.model_validate({"how": "swapped", "at": _now(), "from": state.record.drafter_fingerprint,
                                           "to": fingerprint, "verified": verified})
    record = wanted.record().but(pid=state.pid, log=state.record.log, launched_at=state.record.launched_at,
                                 launched_argv=state.record.launched_argv or state.record.argv, drafter_update=update)
    ctx.execute(record_action(ctx, record, state.pid))
    memory = ctx.memory
    memory.swapped, memory.pid, memory.log, memory.deployment = True, state.pid, state.record.log, record
    memory.drafter_update = DrafterUpdate(how="swapped", verified=verified)
    return StepOutcome("ok", f"swapped into pid {state.pid} in {summary.seconds:.1f} s (new requests held up to "
                             f"{summary.held_s:.2f} s by SGLang's model-update lock): weight_version "
                             f"{str(fingerprint)[:12]}, accept length {verified.get('accept_length')}, no restart",
                       {"path": "swap", "reason": decision.reason, "pid": state.pid, "verified": verified})


def _verify(ctx: StepContext, state: ServerState, summary: SendSummary, fingerprint: str | None,
            verified: dict[str, Any]) -> list[str]:
    """What is wrong with a swap whose tensors went out (empty: verified, as after a launch)."""
    if not summary.ok:
        return [f"{summary.stage} failed (HTTP {summary.http_status}: {summary.message})"]
    if summary.weight_version != fingerprint:
        return [f"/model_info reports weight_version {summary.weight_version!r}, not {fingerprint!r}"]
    after = parse_server_state(ctx.execute(after_action(ctx)).stdout, ctx.host.name)
    verified["pid"] = after.pid
    if after.pid != state.pid or not after.healthy:
        return [f"the server is not the one swapped into (pid {state.pid} -> {after.pid}, "
                f"alive {after.alive}, /health {after.status})"]
    try:
        outcome = verify_acceptance.run(_verify_ctx(ctx))
        verified["accept_length"] = outcome.data.get("accept_length")
    except _STOPS:
        raise
    except DeployError as exc:
        return [str(exc).splitlines()[0]]
    return []
