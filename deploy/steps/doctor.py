"""doctor: read-only pre-flight, the first step of up/restart/bench, before anything is stopped.

Before this step existed, `up` stopped the running server and only then found out that the host
could not serve (nvidia-smi missing, the port held by another process, a full disk, a Kimi-K2.5
target on SGLang 0.5.9 that never captures the aux hidden states): a nightly redeploy became an
outage. A failing check stops the playbook here, so the running server keeps serving.
``--ignore-doctor`` (setting ``ignore``) runs on anyway and says what it overrides.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from deploy.base.errors import DeployError, ExitCode, VerificationFailed
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings

NAME = "doctor"


class Settings(StepSettings):
    #: run on past failing checks (--ignore-doctor); the failures are still reported
    ignore: bool = False
    #: the playbook runs fix-keys later: a speculators-form drafter config is expected, not a warning
    fix_keys_will_run: bool = True
    #: --replace: a server of another run, or one deployctl did not start, on the GPUs may be stopped
    replace: bool = False
    #: GPU memory the stop must free to; default: the playbook's wait-gpus-free threshold_mib (else 0)
    gpu_threshold_mib: Optional[int] = Field(default=None, ge=0)
    #: free-gpus' kill_other_users (the playbook loader copies it): whose GPU holders the stop ends
    kill_other_users: bool = False


def action(ctx: StepContext, script: str | None = "<deploy/remote/doctor_facts.py>") -> Command:
    from deploy.facts.doctor import doctor_command, run_state_spec  # deploy.facts.doctor imports deploy.steps
    from deploy.steps.ensure_helper import HELPER_FILES
    from deploy.steps.wait_ready import health_url

    spec = run_state_spec(ctx.host, list(HELPER_FILES), health_url(ctx))
    return Command(description="gather host facts, SGLang's version and model sources (under sglang_python), the "
                               "installed helpers' sha256, the running server and the last good record "
                               "(helper sent inline, writes nothing)",
                   command=doctor_command(ctx.host, ctx.run, run_state=spec, script=script),
                   timeout_s=ctx.timeout(75))


def plan(ctx: StepContext) -> list[Command]:
    ctx.memory.sglang_version = ctx.memory.sglang_version or "<sglang version>"  # what later steps' plans show
    return [action(ctx)]


def diagnose(conn, ctx_host, run, *, fix_keys_will_run: bool, settings=None):
    """``settings``: the playbook's doctor settings, when a playbook will run (its --replace, threshold)."""
    from deploy.doctor.before_stop import StopPlan, all_checks
    from deploy.doctor.checks import DoctorInput
    from deploy.facts.doctor import read_doctor_facts

    facts, sglang, why = read_doctor_facts(conn, ctx_host, run)
    plan = StopPlan(threshold_mib=getattr(settings, "gpu_threshold_mib", None) or 0,
                    replace=bool(getattr(settings, "replace", False)),
                    kill_other_users=bool(getattr(settings, "kill_other_users", False)))
    checks = all_checks(DoctorInput(ctx_host, run, run.draft_tokens, facts, sglang, fix_keys_will_run=fix_keys_will_run,
                                    sglang_error=why), plan)
    return checks, (sglang.version if sglang else None)


def left_as_it_was(snapshot) -> str:
    """What the refusal leaves serving, as the doctor's own read under the host lock saw it (never a
    fixed "keeps serving" when nothing runs)."""
    server = getattr(snapshot, "server", None)
    if server is None:
        return "whatever runs on the host is left as it was"
    if not server.alive:
        return "no SGLang server of deployctl's was running, none is started"
    if server.status == 200:
        return f"the running server keeps serving (pid {server.pid})"
    health = f"/health {server.status}" if server.status is not None else "/health no answer"
    return f"the running server (pid {server.pid}, {health} on the run's port) is left running, untouched"


#: failures that mean the drafter's files cannot be read as a checkpoint (still being written, truncated,
#: no config.json): exit 6 like fix-keys, not 8 (the checkpoint itself is invalid, nothing was verified)
CHECKPOINT_FAILURES = (("drafter", ""), ("drafter-weights", "cannot read the drafter's safetensors headers"),
                       ("drafter-config", "cannot read"))


def checkpoint_invalid(bad) -> bool:
    return bool(bad) and all(any(c.name == name and c.reason.startswith(start) for name, start in CHECKPOINT_FAILURES)
                             for c in bad)


def failure_text(host: str, checks, snapshot=None) -> str:
    from deploy.doctor.checks import failed

    bad = failed(checks)
    lines = [f"{host}: doctor: {len(bad)} check(s) failed; nothing was stopped, {left_as_it_was(snapshot)} "
             "(--ignore-doctor runs anyway)"]
    for check in bad:
        reason = check.reason.splitlines()
        lines.append(f"  {check.name}: {reason[0]}")
        lines += [f"    {more}" for more in reason[1:]]
        if check.fix:
            lines.append(f"    fix: {check.fix}")
    return "\n".join(lines)


def run(ctx: StepContext) -> StepOutcome:
    from deploy.doctor.before_stop import StopPlan, all_checks, gpu_baseline
    from deploy.doctor.checks import DoctorInput
    from deploy.facts.doctor import facts_of
    from deploy.facts.server import snapshot_of

    facts, sglang, why = facts_of(ctx.execute(action(ctx, script=None)), ctx.host, ctx.run)
    given = DoctorInput(ctx.host, ctx.run, ctx.run.draft_tokens, facts, sglang,
                        fix_keys_will_run=ctx.settings.fix_keys_will_run, sglang_error=why)
    plan = StopPlan(threshold_mib=ctx.settings.gpu_threshold_mib or 0, replace=ctx.settings.replace,
                    kill_other_users=ctx.settings.kill_other_users)
    checks = all_checks(given, plan)
    # memory no process the stop ends holds, per GPU: wait-gpus-free (a rollback's too) never waits for it
    ctx.memory.gpu_baseline_mib = gpu_baseline(given, plan.kill_other_users)
    version = sglang.version if sglang else None
    if version:
        ctx.memory.sglang_version = version  # fix-keys and converge reuse it: no command of their own
    if facts.run_state is not None:
        # read under the host lock: ensure-helper, converge, record-good and regression-gate use it
        ctx.memory.snapshot = snapshot_of(facts.run_state, facts.python.version, ctx.host.name,
                                             ctx.host.state_dir)
    from deploy.doctor.checks import failed
    from deploy.doctor.speculation import DRAFT_QUANT_FLAG, draft_quantization_flag

    # an unquantized drafter under a quantized target: the launch passes the draft's own quantization
    quantization = draft_quantization_flag(DoctorInput(ctx.host, ctx.run, ctx.run.draft_tokens, facts, sglang))
    ctx.memory.draft_quantization = quantization
    passes = f"; the launch passes {DRAFT_QUANT_FLAG} {quantization}" if quantization else ""
    documents = [c.to_dict() for c in checks]
    ctx.memory.doctor_checks = documents
    data = {"checks": documents}
    bad = failed(checks)
    warned = [c.name for c in checks if c.status == "warn"]
    if bad and not ctx.settings.ignore:
        text = failure_text(ctx.host.name, checks, ctx.memory.snapshot)
        if checkpoint_invalid(bad):
            raise DeployError(text, exit_code=ExitCode.CHECKPOINT)
        raise VerificationFailed(text)
    if bad:
        names = ", ".join(c.name for c in bad)
        ctx.progress(f"--ignore-doctor: running on past {len(bad)} failing check(s): {names}")
        return StepOutcome("ok", f"IGNORED {len(bad)} failing check(s) (--ignore-doctor): {names}{passes}", data)
    suffix = (f"; warnings: {', '.join(warned)}" if warned else "") + passes
    return StepOutcome("ok", f"{len(checks)} checks passed{suffix}", data)
