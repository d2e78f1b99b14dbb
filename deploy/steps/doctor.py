"""doctor: read-only pre-flight, the first step of up/restart/bench, before anything is stopped.

Before this step existed, `up` stopped the running server and only then found out that the host
could not serve (nvidia-smi missing, the port held by another process, a full disk, a Kimi-K2.5
target on SGLang 0.5.9 that never captures the aux hidden states): a nightly redeploy became an
outage. A failing check stops the playbook here, so the running server keeps serving.
``--ignore-doctor`` (setting ``ignore``) runs on anyway and says what it overrides.
"""

from __future__ import annotations

from deploy.errors import VerificationFailed
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings

NAME = "doctor"


class Settings(StepSettings):
    #: run on past failing checks (--ignore-doctor); the failures are still reported
    ignore: bool = False
    #: the playbook runs fix-keys later: a speculators-form drafter config is expected, not a warning
    fix_keys_will_run: bool = True


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
    ctx.memory.setdefault("sglang_version", "<sglang version>")  # what later steps' plans show
    return [action(ctx)]


def diagnose(conn, ctx_host, run, *, fix_keys_will_run: bool):
    from deploy.doctor.checks import DoctorInput, run_checks
    from deploy.facts.doctor import read_doctor_facts

    facts, sglang, why = read_doctor_facts(conn, ctx_host, run)
    checks = run_checks(DoctorInput(ctx_host, run, run.draft_tokens, facts, sglang, fix_keys_will_run=fix_keys_will_run,
                                    sglang_error=why))
    return checks, (sglang.version if sglang else None)


def failure_text(host: str, checks) -> str:
    from deploy.doctor.checks import failed

    bad = failed(checks)
    lines = [f"{host}: doctor: {len(bad)} check(s) failed; nothing was stopped, the running server keeps serving "
             "(--ignore-doctor runs anyway)"]
    for check in bad:
        reason = check.reason.splitlines()
        lines.append(f"  {check.name}: {reason[0]}")
        lines += [f"    {more}" for more in reason[1:]]
        if check.fix:
            lines.append(f"    fix: {check.fix}")
    return "\n".join(lines)


def run(ctx: StepContext) -> StepOutcome:
    from deploy.doctor.checks import DoctorInput, run_checks
    from deploy.facts.doctor import facts_of
    from deploy.facts.server import snapshot_of

    facts, sglang, why = facts_of(ctx.execute(action(ctx, script=None)), ctx.host, ctx.run)
    checks = run_checks(DoctorInput(ctx.host, ctx.run, ctx.run.draft_tokens, facts, sglang,
                                    fix_keys_will_run=ctx.settings.fix_keys_will_run, sglang_error=why))
    version = sglang.version if sglang else None
    if version:
        ctx.memory["sglang_version"] = version  # fix-keys and converge reuse it: no command of their own
    if facts.run_state is not None:
        # read under the host lock: ensure-helper, converge, record-good and regression-gate use it
        ctx.memory["snapshot"] = snapshot_of(facts.run_state, facts.python.version, ctx.host.name,
                                             ctx.host.state_dir)
    from deploy.doctor.checks import failed
    from deploy.doctor.speculation import DRAFT_QUANT_FLAG, draft_quantization_flag

    # an unquantized drafter under a quantized target: the launch passes the draft's own quantization
    quantization = draft_quantization_flag(DoctorInput(ctx.host, ctx.run, ctx.run.draft_tokens, facts, sglang))
    ctx.memory["draft_quantization"] = quantization
    passes = f"; the launch passes {DRAFT_QUANT_FLAG} {quantization}" if quantization else ""
    documents = [c.to_dict() for c in checks]
    ctx.memory["doctor_checks"] = documents
    data = {"checks": documents}
    bad = failed(checks)
    warned = [c.name for c in checks if c.status == "warn"]
    if bad and not ctx.settings.ignore:
        raise VerificationFailed(failure_text(ctx.host.name, checks))
    if bad:
        names = ", ".join(c.name for c in bad)
        ctx.progress(f"--ignore-doctor: running on past {len(bad)} failing check(s): {names}")
        return StepOutcome("ok", f"IGNORED {len(bad)} failing check(s) (--ignore-doctor): {names}{passes}", data)
    suffix = (f"; warnings: {', '.join(warned)}" if warned else "") + passes
    return StepOutcome("ok", f"{len(checks)} checks passed{suffix}", data)
