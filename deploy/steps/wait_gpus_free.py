"""wait-gpus-free: poll nvidia-smi until every configured GPU is at or under the threshold.

The hand-run procedure slept a fixed 2 + 3 seconds and read the output by eye. The poll runs on the host
(host_ops.py watch-gpus: both nvidia-smi queries every ``interval_s``, one JSON line per change) over ONE
exec channel, so the step ends within about one interval of the GPUs being really free and fails with
the holders named on timeout. Every line is parsed here, strictly, by facts.gpus: anything nvidia-smi
prints that does not parse is an error, never "free".
"""

from __future__ import annotations

import time

from pydantic import Field

from deploy.base.errors import StepTimeout
from deploy.facts import host_helper
from deploy.facts.gpus import COMPUTE_APPS_COMMAND, GPU_QUERY_COMMAND, GpuRow, busy_gpus, read_answers
from deploy.steps.base import StepContext, StepOutcome, StepSettings, Watch

NAME = "wait-gpus-free"


#: skipped when converge found the server already running as desired
CONVERGE_SKIPS = True


class Settings(StepSettings):
    threshold_mib: int = Field(default=0, ge=0)
    interval_s: float = Field(default=0.1, gt=0, le=60)
    #: the host-side loop reports at least this often even when nothing changed (progress, liveness)
    heartbeat_s: float = Field(default=1.0, gt=0, le=60)


def describe_busy(rows: list[GpuRow]) -> str:
    parts = []
    for row in rows:
        holders = ", ".join(f"pid {a.pid} {a.process_name}" for a in row.holders) or "no listed process"
        parts.append(f"GPU {row.index}: {row.used_mib} MiB held by {holders}")
    return "; ".join(parts)


def busy_beyond_baseline(rows: list[GpuRow], threshold_mib: int, baseline: dict[int, int]) -> list[GpuRow]:
    """GPUs over the threshold, or over what was held before anything was stopped (the doctor's
    ``gpu_baseline_mib``: memory no process the stop ends accounts for, e.g. a leaked context).
    Waiting for that to go would never end; a rollback would wait for it too."""
    return [r for r in busy_gpus(rows, threshold_mib) if r.used_mib > max(threshold_mib, baseline.get(r.index, 0))]


def watch_command(ctx: StepContext) -> str:
    return host_helper.watch_gpus_command(
        ctx.host.python, ctx.paths.helper("host_ops.py"), GPU_QUERY_COMMAND, COMPUTE_APPS_COMMAND,
        interval_s=ctx.settings.interval_s, every_s=ctx.settings.heartbeat_s,
        for_s=ctx.timeout(ctx.run.timeouts.gpus_free_s))


def read_sample(line: str, expected_gpus: int, source: str) -> list[GpuRow]:
    """One watch-gpus line -> the GPU rows with their holders (strict: the parser gpu-status uses)."""
    sample = host_helper.parse_gpu_sample(line, source)
    return read_answers((sample.gpus.exit_code, sample.gpus.stdout, sample.gpus.stderr),
                        (sample.apps.exit_code, sample.apps.stdout, sample.apps.stderr), expected_gpus, source).gpus


def action(ctx: StepContext) -> Watch:
    every = f"every {ctx.settings.interval_s:g} s on the host, up to {ctx.timeout(ctx.run.timeouts.gpus_free_s):g} s"
    # the host loop ends itself at the deadline; the channel gets a little longer for the last line
    return Watch(description=f"poll GPU memory and holders ({every}), one line per change", command=watch_command(ctx),
                 timeout_s=ctx.timeout(ctx.run.timeouts.gpus_free_s) + 5,
                 # both nvidia-smi queries of a sample may take their 30 s each on a live host (host_ops.run_bounded)
                 silence_s=ctx.settings.heartbeat_s + 2 * 30 + 5)


def plan(ctx: StepContext) -> list[Watch]:
    return [action(ctx)]


def run(ctx: StepContext) -> StepOutcome:
    timeout = ctx.timeout(ctx.run.timeouts.gpus_free_s)
    started = time.monotonic()
    seen: dict = {"samples": 0, "busy": None, "free": None}

    baseline = ctx.memory.gpu_baseline_mib or {}

    def on_line(line: str) -> bool:
        rows = read_sample(line, ctx.host.gpus, ctx.host.name)
        seen["samples"] += 1
        busy = busy_beyond_baseline(rows, ctx.settings.threshold_mib, baseline)
        if not busy:
            seen["free"] = rows
            return True
        seen["busy"] = busy
        if seen["samples"] == 1 or seen["samples"] % 10 == 0:
            elapsed = time.monotonic() - started
            ctx.progress(f"{len(busy)} GPU(s) busy after {elapsed:.1f} s: {describe_busy(busy)[:160]}")
        return False

    watched = ctx.execute_watch(action(ctx), on_line)
    host_helper.check_watch_ended(watched.exit_code, watched.stderr, ctx.host.name, "watch-gpus")
    elapsed = time.monotonic() - started
    if seen["free"] is not None:
        kept = {i: m for i, m in baseline.items() if m > ctx.settings.threshold_mib}
        held = "; ".join(f"GPU {i}: {m} MiB held before the stop, not waited for" for i, m in sorted(kept.items()))
        return StepOutcome(
            "ok",
            f"all {len(seen['free'])} GPUs at <= {ctx.settings.threshold_mib} MiB after {elapsed:.1f} s"
            + (f" ({held})" if held else ""),
            {"polls": seen["samples"], "elapsed_s": round(elapsed, 2)},
        )
    if seen["busy"] is None:
        raise StepTimeout(f"{ctx.host.name}: no GPU reading from the host within {timeout:g} s")
    raise StepTimeout(f"{ctx.host.name}: GPUs still in use after {timeout:g} s: {describe_busy(seen['busy'])}")
