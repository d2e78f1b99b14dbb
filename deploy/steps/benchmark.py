"""benchmark: ``python3 -m sglang.bench_serving`` against the server, on the host.

``--dataset-name random-ids`` because ``random`` and ``sharegpt`` download ShareGPT from the
Hugging Face hub, which GPU hosts often cannot reach. Fixed input/output lengths
(``--random-range-ratio 1``) keep runs with different draft-token counts comparable. The
result block is parsed strictly; each run also appends its JSON line to the state dir.
"""

from __future__ import annotations

from pydantic import Field

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.facts.bench import parse_bench_result
from deploy.shell import path_join, quote, quote_path
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.steps.verify_acceptance import base_url

NAME = "benchmark"


class Settings(StepSettings):
    num_prompts: int = Field(default=64, ge=1, le=100000)
    input_len: int = Field(default=1024, ge=1, le=1_000_000)
    output_len: int = Field(default=512, ge=1, le=1_000_000)
    max_concurrency: int = Field(default=8, ge=1, le=4096)


def results_path(ctx: StepContext) -> str:
    return path_join(ctx.paths.root, "bench", f"bench-{ctx.launch_stamp}-t{ctx.draft_tokens}.jsonl")


def command(ctx: StepContext) -> str:
    s = ctx.settings
    argv = [ctx.run.sglang_python, "-m", "sglang.bench_serving", "--backend", "sglang",
            "--base-url", base_url(ctx), "--dataset-name", "random-ids",
            "--num-prompts", str(s.num_prompts), "--random-input-len", str(s.input_len),
            "--random-output-len", str(s.output_len), "--random-range-ratio", "1.0",
            "--max-concurrency", str(s.max_concurrency), "--flush-cache", "--disable-tqdm"]
    out = results_path(ctx)
    return (f"mkdir -p -m 700 -- {quote_path(out.rsplit('/', 1)[0])} && "
            + " ".join(quote(a) for a in argv) + f" --output-file {quote_path(out)}")


def action(ctx: StepContext) -> Command:
    s = ctx.settings
    return Command(description=f"bench_serving: {s.num_prompts} prompts, {s.input_len} in / {s.output_len} out, "
                               f"concurrency {s.max_concurrency}", command=command(ctx), timeout_s=ctx.timeout(3600))


def plan(ctx: StepContext) -> list[Command]:
    return [action(ctx)]


def run(ctx: StepContext) -> StepOutcome:
    result = ctx.execute(action(ctx))
    if result.exit_code != 0:
        tail = (result.stderr.strip() or result.stdout.strip())[-600:]
        raise RemoteCommandFailed(f"{ctx.host.name}: bench_serving failed (exit {result.exit_code}): {tail}")
    bench = parse_bench_result(result.stdout, source=ctx.host.name)
    if bench.successful_requests != ctx.settings.num_prompts:
        raise RemoteOutputError(f"{ctx.host.name}: only {bench.successful_requests} of "
                                f"{ctx.settings.num_prompts} benchmark requests succeeded")
    s = ctx.settings
    data = {"draft_tokens": ctx.draft_tokens, **bench.to_dict(), "results_file": results_path(ctx),
            "settings": {"num_prompts": s.num_prompts, "input_len": s.input_len, "output_len": s.output_len,
                         "max_concurrency": s.max_concurrency}}
    ctx.memory["bench"] = data
    accept = f", accept length {bench.accept_length:.2f}" if bench.accept_length is not None else ""
    return StepOutcome("ok", f"{bench.output_tok_s:.1f} output tok/s{accept} (T={ctx.draft_tokens})", data)
