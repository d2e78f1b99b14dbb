"""verify-acceptance: prove that speculation actually accepts draft tokens.

A server can be "healthy" while its drafter is useless: SGLang 0.5.6-0.5.11 silently drops a
speculators checkpoint's decoder weights, and a target that sends one hidden state bypasses fc;
both give ``accept len: 1.00`` (no draft token ever accepted). This step sends greedy requests and
fails when the measured accept length is under the threshold.

The prompts are the first ``requests`` of deployctl's built-in prompt set (deploy/local/datasets.py, the
set ``benchmark`` uses by default), sent at most ``concurrency`` at a time; the step's data names the
set's sha256, so the regression gate compares accept lengths measured on the same prompts only.
"""

from __future__ import annotations

from pydantic import Field

from deploy.local import datasets
from deploy.doctor.suspects import likely_causes, simulated_acceptance
from deploy.base.errors import VerificationFailed
from deploy.facts.host_helper import accept_check_command, parse_accept_check
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.host.sglang_argv import probe_address
from deploy.host.records import AcceptMeasurement

NAME = "verify-acceptance"


class Settings(StepSettings):
    #: 1.0 means nothing accepted; a trained EAGLE-3 drafter typically gives 2.5-3.5
    min_accept_length: float = Field(default=1.5, ge=1.0)
    requests: int = Field(default=4, ge=1, le=64)
    max_new_tokens: int = Field(default=256, ge=8, le=8192)
    #: requests in flight at once (the server batches them; a real one takes about as long for 4 as for 1)
    concurrency: int = Field(default=4, ge=1, le=64)


def base_url(ctx: StepContext) -> str:
    address = probe_address(ctx.run, ctx.host)
    return f"http://{'[' + address + ']' if ':' in address else address}:{ctx.run.port}"


def command(ctx: StepContext) -> str:
    s = ctx.settings
    return accept_check_command(ctx.host.python, ctx.paths.helper("host_ops.py"), base_url(ctx), s.requests,
                                s.max_new_tokens, datasets.verify_prompts(s.requests), concurrency(ctx),
                                key_from=ctx.paths.deployment)


def concurrency(ctx: StepContext) -> int:
    return min(ctx.settings.concurrency, ctx.settings.requests)


def prompt_set(ctx: StepContext) -> dict:
    """What the accept length depends on besides the deployment (compared by the regression gate)."""
    s = ctx.settings
    return {"prompts": datasets.BUILTIN, "prompts_sha256": datasets.builtin().sha256, "requests": s.requests,
            "max_new_tokens": s.max_new_tokens}


def action(ctx: StepContext) -> Command:
    return Command(description=f"{ctx.settings.requests} greedy /generate requests from the built-in prompt set, "
                               f"{concurrency(ctx)} at a time; fail if accept length < {ctx.settings.min_accept_length:g}",
                   command=command(ctx), timeout_s=ctx.timeout(900), what="accept-check")


def plan(ctx: StepContext) -> list[Command]:
    return [action(ctx)]


def run(ctx: StepContext) -> StepOutcome:
    document = parse_accept_check(ctx.execute(action(ctx)).stdout, ctx.host.name).model_dump()
    if not document["ok"]:
        raise VerificationFailed(f"{ctx.host.name}: could not measure acceptance: {document.get('error')}")
    length = float(document["accept_length"])
    measured = AcceptMeasurement.model_validate(
        {k: document.get(k) for k in ("accept_length", "completion_tokens", "spec_verify_ct",
                                      "server_avg_spec_accept_length")} | {"settings": prompt_set(ctx)})
    data = measured.model_dump()
    ctx.memory.verify = measured
    simulated = simulated_acceptance(ctx.memory.doctor_checks)
    if simulated:  # the doctor ran (--ignore-doctor too) and found the knob: no number proves anything
        raise VerificationFailed(f"{ctx.host.name}: accept length {length:.2f} is simulated, not measured: {simulated}")
    if length < ctx.settings.min_accept_length:
        hint = ""
        if length < 1.05:
            # Ordered by the doctor's facts for this host: a Kimi-K2.5 target on SGLang 0.5.9 never
            # captures the aux states, yet "keys dropped" used to be blamed first whatever the facts.
            causes = likely_causes(ctx.memory.doctor_checks)
            hint = " — no draft token was accepted; likely causes, most likely first:\n" + "\n".join(
                f"  {i}. {cause}" for i, cause in enumerate(causes, 1))
        raise VerificationFailed(
            f"{ctx.host.name}: accept length {length:.2f} < {ctx.settings.min_accept_length:g}{hint}"
        )
    return StepOutcome("ok", f"accept length {length:.2f} over {document['completion_tokens']} tokens", data)
