"""record-good: the deployment that passed verification becomes the host's last good one.

``<state_dir>/last-good.json``: its deployment record (argv, drafter fingerprint and store path,
environment hash, SGLang version) plus the numbers it was verified with; ``last-good.env`` its
environment file. A failed later run relaunches exactly this (rollback), and ``nightly``'s
regression gate compares with its numbers. Re-verifying the same deployment keeps the original
numbers (so slow drift cannot lower the bar), only filling in ones it lacked.

Throughput bars are kept per dataset identity and load (``throughput_baselines``: the dataset's
name and sha256, prompts, lengths, concurrency; each with its benchmark rounds): before issue 28 a
``bench --dataset FILE`` replaced nightly's one bar with another dataset's figure and the next
nightly said "not compared". A bench on another dataset now adds its own baseline; an inconclusive
gate verdict (deploy/local/throughput_gate.py) keeps the previous bar for that dataset.
"""

from __future__ import annotations

import math
from typing import Any
from datetime import datetime, timezone

from deploy.facts.server import (last_good_env_path, last_good_path, parse_record, read_record_command, record_stdin,
                                 same_deployment)
from deploy.facts.helpers import write_file_command
from deploy.base.shell import quote_path
from deploy.host.records import Baseline, DriftNote, GateVerdict, LastGood, Metrics
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings

NAME = "record-good"


class Settings(StepSettings):
    pass


def measurements(ctx: StepContext) -> Metrics:
    """This run's numbers, as the last good record keeps them."""
    found: dict[str, Any] = {"draft_tokens": ctx.draft_tokens}
    verify = ctx.memory.verify
    bench = ctx.memory.bench
    if verify is not None:
        found["accept_length"] = verify.accept_length
        # acceptance depends on the prompts: only one measured on the same prompt set compares
        found["verify_settings"] = verify.settings
    if bench is not None:
        # throughput depends on the dataset (its sha256), lengths and concurrency: only the same load compares;
        # the record has always named the measurement's settings bench_settings
        found |= {"output_tok_s": bench.output_tok_s,
                  "output_tok_s_rounds": bench.output_tok_s_rounds or [bench.output_tok_s],
                  "bench_settings": bench.settings, "dataset": bench.dataset, "dataset_sha256": bench.dataset_sha256}
    return Metrics.model_validate(found)


#: throughput baselines kept per record (one per dataset identity and load), the newest kept
MAX_BASELINES = 8


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def usable_rounds_of(rounds: Any, figure: Any) -> list[float]:
    """Throughput rounds as recorded (a list of positive finite numbers), else the single figure, else []."""
    if isinstance(rounds, list) and rounds and len(rounds) <= 1000 and all(_positive(x) for x in rounds):
        return [float(x) for x in rounds]
    return [float(figure)] if _positive(figure) else []


def rounds_of(entry: Baseline | Metrics) -> list[float]:
    """A measurement's throughput rounds; one recorded before issue 28 has its single figure. [] when the
    record holds nothing usable (a hand-edited file is not trusted into the statistics)."""
    return usable_rounds_of(entry.output_tok_s_rounds, entry.output_tok_s)


def throughput_baselines(metrics: Metrics) -> list[Baseline]:
    """The record's throughput baselines, oldest first; a record from before issue 28 has one (its top-level
    figure and load)."""
    if metrics.throughput_baselines is not None:
        return [e for e in metrics.throughput_baselines if rounds_of(e)]
    if _positive(metrics.output_tok_s):
        return [Baseline(output_tok_s=metrics.output_tok_s, output_tok_s_rounds=metrics.output_tok_s_rounds,
                         dataset=metrics.dataset, dataset_sha256=metrics.dataset_sha256, drafter_fingerprint=None,
                         bench_settings=metrics.bench_settings)]
    return []


def throughput_baseline(metrics: Metrics, settings: Any) -> Baseline | None:
    """The baseline measured on this dataset identity and load, if the record has one."""
    return next((e for e in reversed(throughput_baselines(metrics)) if e.bench_settings == settings), None)


def merge_baselines(previous: Metrics | None, now: Metrics, keep: bool, fingerprint: str | None = None) -> list[Baseline]:
    """``previous``' baselines with now's measurement for its own dataset and load: added, or replacing
    the one there unless ``keep`` (the same deployment re-verified, or an inconclusive gate) and that
    one has enough rounds for the gate. Baselines of other datasets are never touched."""
    from deploy.local.throughput_gate import MIN_ROUNDS

    # at most MAX_BASELINES, the newest (a record grown by hand to 10,000 is trimmed when written)
    entries = throughput_baselines(previous or Metrics())[-MAX_BASELINES:]
    if not rounds_of(now):
        return entries
    mine = Baseline(output_tok_s=now.output_tok_s, output_tok_s_rounds=now.output_tok_s_rounds, dataset=now.dataset,
                    dataset_sha256=now.dataset_sha256, drafter_fingerprint=fingerprint, bench_settings=now.bench_settings,
                    # issue 39: each bar with its time (and its load above)
                    measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    existing = throughput_baseline(previous or Metrics(), now.bench_settings)
    if existing is not None and keep and len(rounds_of(existing)) >= min(MIN_ROUNDS, len(rounds_of(mine))):
        return entries
    others = [e for e in entries if e.bench_settings != now.bench_settings]
    return (others + [mine])[-MAX_BASELINES:]


def keep_bar(previous: Metrics, now: Metrics, fingerprint: str | None = None) -> Metrics:
    """Re-verifying the same deployment keeps its original numbers (slow drift cannot lower the bar),
    but only those measured like now's: an accept length from another prompt set is replaced, a
    throughput from another dataset or load is kept beside now's (``merge_baselines``)."""
    merged = now
    if "accept_length" in previous.model_fields_set and ("accept_length" not in now.model_fields_set
                                                         or previous.verify_settings == now.verify_settings):
        merged = now.but(accept_length=previous.accept_length, verify_settings=previous.verify_settings)
    return with_baselines(merged, previous, True, fingerprint)


def with_baselines(metrics: Metrics, previous: Metrics | None, keep: bool, fingerprint: str | None = None) -> Metrics:
    """``metrics`` with the merged throughput baselines; its top-level throughput figures are the
    baseline of now's dataset and load (what ``deployctl status`` compares with)."""
    baselines = merge_baselines(previous, metrics, keep, fingerprint)
    changes: dict[str, Any] = {"throughput_baselines": baselines} if baselines else {}
    current = throughput_baseline(Metrics(throughput_baselines=baselines), metrics.bench_settings) \
        if "output_tok_s" in metrics.model_fields_set else None
    if current is not None:
        changes |= {"output_tok_s": current.output_tok_s, "output_tok_s_rounds": current.output_tok_s_rounds,
                    "dataset": current.dataset, "dataset_sha256": current.dataset_sha256,
                    "bench_settings": current.bench_settings}
    return metrics.but(**changes)


def drift_note(gate: GateVerdict | None) -> DriftNote | None:
    """What the record keeps of a night the gate judged the host's drift (deploy/local/same_night.py)."""
    if gate is None or gate.outcome != "drift":
        return None
    return DriftNote(night=datetime.now(timezone.utc).isoformat(timespec="seconds"), ratio=gate.drift_ratio,
                     unchanged=gate.unchanged, why=gate.why[:400])


def write_command(ctx: StepContext, record: LastGood, copy_env_from: str | None, shown: str | None = None) -> str:
    """Copy the env file first (when it is not last-good.env already), then the record.

    ``shown``: the plan's stand-in for the record's JSON (known only after verification)."""
    path = quote_path(last_good_path(ctx.paths.root))
    target = last_good_env_path(ctx.paths.root)
    helper = ctx.paths.helper("host_ops.py")
    if copy_env_from:
        env = (f"{write_file_command(ctx.host.python, helper, quote_path(target))} < {quote_path(copy_env_from)} && ")
    elif record.env_file is None:
        env = f"rm -f -- {quote_path(target)} && "
    else:
        env = ""
    # the record itself comes on stdin (write_action): 10,000 baselines on this command line were over
    # ARG_MAX ("connection lost" every night), and another user read the admin key in /proc/*/cmdline
    return f"{env}{write_file_command(ctx.host.python, helper, path)}"


def read_action(ctx: StepContext) -> Command:
    return Command(description="read the last good deployment", when="doctor did not read it in this run",
                   command=read_record_command(last_good_path(ctx.paths.root)))


def write_action(ctx: StepContext, record: LastGood, copy_env_from: str | None, shown: str | None = None) -> Command:
    return Command(description="record this deployment (and its env file) as the last good one",
                   when="it is not recorded as the last good one already, with these numbers",
                   command=write_command(ctx, record, copy_env_from, shown), what="recording the last good deployment",
                   stdin=None if shown is not None else record_stdin(record, ctx.host.name, "the last good record"),
                   stdin_shown=shown or "the last good record (JSON)")


def plan(ctx: StepContext) -> list[Command]:
    from deploy.steps.launch import env_path

    env = env_path(ctx) if ctx.run.env else None
    return [read_action(ctx), write_action(ctx, LastGood(argv=[], env_file=env), env,
                                           shown="<this deployment's record with its measurements, as JSON>")]


def last_good(ctx: StepContext) -> LastGood | None:
    """The last good record: as doctor read it under the host lock in this run, else read now."""
    snapshot = ctx.memory.snapshot
    if snapshot is not None:
        return snapshot.last_good
    path = last_good_path(ctx.paths.root)
    return parse_record(ctx.execute(read_action(ctx)).stdout, ctx.host.name, path)


def run(ctx: StepContext) -> StepOutcome:
    deployment = ctx.memory.deployment
    if deployment is None:
        return StepOutcome("skipped", "no deployment recorded in this run")
    previous = last_good(ctx)
    metrics = measurements(ctx)
    fingerprint = deployment.drafter_fingerprint
    previous_metrics = previous.metrics if previous is not None else None
    inconclusive = ctx.memory.gate is not None and ctx.memory.gate.outcome == "inconclusive"
    if previous_metrics is not None and same_deployment(previous, deployment):
        metrics = keep_bar(previous_metrics, metrics, fingerprint=fingerprint)
    else:
        # another deployment: its own accept length; the baselines of other datasets stay (bench --dataset)
        metrics = with_baselines(metrics, previous_metrics, inconclusive, fingerprint)
    drift = drift_note(ctx.memory.gate)
    if drift is not None:
        # the host's speed moved since the bar's night: an unchanged deployment keeps its bar, a new one's rounds
        # tonight became it; either way the record says so
        metrics = metrics.but(throughput_drift=drift)
    verified_at: str | None = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if previous is not None and same_deployment(previous, deployment) and "verified_at" in previous.model_fields_set:
        verified_at = previous.verified_at
    env_file = deployment.env_file
    target = last_good_env_path(ctx.paths.root)
    copy_from = env_file if env_file and env_file != target else None
    record = LastGood.model_validate(deployment.model_dump(exclude_unset=True) | {
        "metrics": metrics, "verified_at": verified_at, "env_file": target if env_file else None})

    def without_pid(r: LastGood) -> dict:
        return {k: v for k, v in r.document().items() if k != "pid"}

    if previous is not None and same_deployment(previous, deployment) and not copy_from and \
            without_pid(previous) == without_pid(record):
        ctx.memory.last_good = previous
        return StepOutcome("ok", f"already the last good deployment ({deployment.drafter_path})",
                           {"last_good": shown(previous)})
    ctx.execute(write_action(ctx, record, copy_from))
    ctx.memory.last_good = record
    return StepOutcome("ok", f"last good: {deployment.drafter_path} (pid {deployment.pid})",
                       {"last_good": shown(record)})


def shown(record: LastGood) -> dict:
    """What the step's data says of the last good record."""
    document = record.document()
    return {k: document.get(k) for k in ("drafter_fingerprint", "drafter_path", "metrics")}
