"""regression-gate: nightly's comparison with the host's last good deployment of the same run.

Fails (exit 12, then the orchestrator rolls back) when the accept length measured by
verify-acceptance or the output throughput measured by benchmark falls below the configured
fraction of the last good record's. Only like with like: the accept length when both were
measured on the same prompt set (sha256, count, length), the throughput when both ran the same
dataset (sha256) at the same load (prompts, lengths, concurrency); otherwise that number is "not
compared", and the outcome says when nothing was (no comparable baseline). No record yet for
this run and draft-token count: this deployment becomes the baseline (record-good runs next).
"""

from __future__ import annotations

from pydantic import Field

from deploy.errors import Regression
from deploy.facts.server import last_good_path, parse_record, read_record_command, same_deployment
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.steps.record_good import measurements

NAME = "regression-gate"


class Settings(StepSettings):
    min_accept_fraction: float = Field(default=0.9, gt=0, le=1.0)
    min_throughput_fraction: float = Field(default=0.9, gt=0, le=1.0)


def read_action(ctx: StepContext) -> Command:
    s = ctx.settings
    return Command(description=f"read the last good record to compare: accept length >= {s.min_accept_fraction:g}x, "
                               f"output tok/s >= {s.min_throughput_fraction:g}x",
                   when="doctor did not read it in this run",
                   command=read_record_command(last_good_path(ctx.paths.root)))


def plan(ctx: StepContext) -> list[Command]:
    return [read_action(ctx)]


def _load(settings: dict | None) -> str:
    if not isinstance(settings, dict):
        return "unknown (recorded before deployctl named datasets: random ids)"
    dataset = settings.get("dataset") or settings.get("prompts") or "random-ids"
    digest = settings.get("dataset_sha256") or settings.get("prompts_sha256")
    rest = ", ".join(f"{k} {v}" for k, v in sorted(settings.items())
                     if k not in ("dataset", "dataset_sha256", "dataset_kind", "prompts", "prompts_sha256"))
    return f"{dataset}{f' (sha256 {digest[:12]})' if digest else ''}, {rest}"


def compare(now: dict, good: dict, accept_fraction: float, throughput_fraction: float) -> tuple[list[str], list[str]]:
    """(regressions, comparisons) as human-readable lines; pure."""
    regressions, lines = [], []
    for key, label, fraction, settings in (("accept_length", "accept length", accept_fraction, "verify_settings"),
                                           ("output_tok_s", "output tok/s", throughput_fraction, "bench_settings")):
        if now.get(key) is None or good.get(key) is None:
            lines.append(f"{label}: not compared (not measured {'now' if now.get(key) is None else 'for the last good one'})")
            continue
        if now.get(settings) != good.get(settings):
            # a manual `deployctl bench --dataset mine.json` (64 prompts, concurrency 8) recorded the bar,
            # nightly measures the built-in set, 16 at 4: different prompts or loads, not a regression
            lines.append(f"{label}: not compared (no comparable baseline: the last good one was measured on "
                         f"{_load(good.get(settings))}; now {_load(now.get(settings))})")
            continue
        ratio = now[key] / good[key] if good[key] else float("inf")
        line = f"{label} {now[key]:.2f} vs last good {good[key]:.2f} ({ratio:.0%}, minimum {fraction:.0%})"
        lines.append(line)
        if ratio < fraction:
            regressions.append(line)
    return regressions, lines


def run(ctx: StepContext) -> StepOutcome:
    snapshot = ctx.memory.snapshot
    if snapshot is not None:
        good = snapshot.last_good
    else:
        path = last_good_path(ctx.paths.root)
        good = parse_record(ctx.execute(read_action(ctx)).stdout, ctx.host.name, path)
    now = measurements(ctx)
    if good is None or good.get("run") != ctx.run.name:
        return StepOutcome("ok", "no last good record of this run yet: this deployment becomes the baseline", {"now": now})
    metrics = good.get("metrics") or {}
    if metrics.get("draft_tokens") != ctx.draft_tokens:
        return StepOutcome("ok", f"last good record was measured at {metrics.get('draft_tokens')} draft tokens, "
                                 f"not {ctx.draft_tokens}: not compared", {"now": now})
    regressions, lines = compare(now, metrics, ctx.settings.min_accept_fraction, ctx.settings.min_throughput_fraction)
    data = {"now": now, "last_good": metrics, "comparisons": lines,
            "same_as_last_good": same_deployment(good, ctx.memory.deployment)}
    if regressions:
        raise Regression(f"{ctx.host.name}: regression against the last good deployment "
                         f"({good.get('drafter_path')}): {'; '.join(regressions)}")
    if not any(" vs last good " in line for line in lines):
        return StepOutcome("ok", "no comparable baseline (nothing compared): " + "; ".join(lines), data)
    return StepOutcome("ok", "; ".join(lines), data)
