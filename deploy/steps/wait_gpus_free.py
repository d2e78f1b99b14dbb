"""wait-gpus-free: poll nvidia-smi until every configured GPU is at or under the threshold.

The hand-run procedure slept a fixed 2 + 3 seconds and read the output by eye. We poll at a short interval, so
the step ends soon after the GPUs are really free, and fail with the holders named on timeout.
Anything nvidia-smi prints that does not parse is an error, never "free".
"""

from __future__ import annotations

import time

from pydantic import Field

from deploy.errors import StepTimeout
from deploy.facts.gpus import COMPUTE_APPS_COMMAND, GPU_QUERY_COMMAND, GpuRow, busy_gpus, read_gpus
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

NAME = "wait-gpus-free"


#: skipped when converge found the server already running as desired
CONVERGE_SKIPS = True


class Settings(StepSettings):
    threshold_mib: int = Field(default=0, ge=0)
    interval_s: float = Field(default=0.5, gt=0, le=60)


def describe_busy(rows: list[GpuRow]) -> str:
    parts = []
    for row in rows:
        holders = ", ".join(f"pid {a.pid} {a.process_name}" for a in row.holders) or "no listed process"
        parts.append(f"GPU {row.index}: {row.used_mib} MiB held by {holders}")
    return "; ".join(parts)


def plan(ctx: StepContext) -> list[PlannedCommand]:
    every = f"every {ctx.settings.interval_s:g} s, up to {ctx.timeout(ctx.run.timeouts.gpus_free_s):g} s"
    return [
        PlannedCommand(f"poll GPU memory ({every})", GPU_QUERY_COMMAND),
        PlannedCommand("poll GPU holders (same interval)", COMPUTE_APPS_COMMAND),
    ]


def run(ctx: StepContext) -> StepOutcome:
    conn = ctx.require_conn()
    timeout = ctx.timeout(ctx.run.timeouts.gpus_free_s)
    started = time.monotonic()
    polls = 0
    while True:
        rows = read_gpus(conn, ctx.host.gpus)
        polls += 1
        busy = busy_gpus(rows, ctx.settings.threshold_mib)
        elapsed = time.monotonic() - started
        if not busy:
            return StepOutcome(
                "ok",
                f"all {len(rows)} GPUs at <= {ctx.settings.threshold_mib} MiB after {elapsed:.1f} s",
                {"polls": polls, "elapsed_s": round(elapsed, 2)},
            )
        if elapsed >= timeout:
            raise StepTimeout(f"{ctx.host.name}: GPUs still in use after {timeout:g} s: {describe_busy(busy)}")
        if polls == 1 or polls % 10 == 0:
            ctx.progress(f"{len(busy)} GPU(s) busy after {elapsed:.1f} s: {describe_busy(busy)[:160]}")
        ctx.pause(min(ctx.settings.interval_s, max(0.0, timeout - elapsed)))
