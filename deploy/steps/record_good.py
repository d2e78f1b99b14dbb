"""record-good: the deployment that passed verification becomes the host's last good one.

``<state_dir>/last-good.json``: its deployment record (argv, drafter fingerprint and store path,
environment hash, SGLang version) plus the numbers it was verified with; ``last-good.env`` its
environment file. A failed later run relaunches exactly this (rollback), and ``nightly``'s
regression gate compares with its numbers. Re-verifying the same deployment keeps the original
numbers (so slow drift cannot lower the bar), only filling in ones it lacked.
"""

from __future__ import annotations

import json
from typing import Any
from datetime import datetime, timezone

from deploy.facts.server import last_good_env_path, last_good_path, parse_record, read_record_command, same_deployment
from deploy.facts.helpers import write_file_command
from deploy.shell import quote, quote_path
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings

NAME = "record-good"


class Settings(StepSettings):
    pass


def measurements(ctx: StepContext) -> dict:
    found: dict[str, Any] = {"draft_tokens": ctx.draft_tokens}
    verify = ctx.memory.verify or {}
    bench = ctx.memory.bench or {}
    if verify.get("accept_length") is not None:
        found["accept_length"] = verify["accept_length"]
        # acceptance depends on the prompts: only one measured on the same prompt set compares
        found["verify_settings"] = verify.get("settings")
    if bench.get("output_tok_s") is not None:
        found["output_tok_s"] = bench["output_tok_s"]
        # throughput depends on the dataset (its sha256), lengths and concurrency: only the same load compares
        found["bench_settings"] = bench.get("settings")
        found["dataset"], found["dataset_sha256"] = bench.get("dataset"), bench.get("dataset_sha256")
    return found


#: each measurement and what makes two of them comparable
BARS = (("accept_length", "verify_settings"), ("output_tok_s", "bench_settings"))


def keep_bar(previous: dict, now: dict) -> dict:
    """Re-verifying the same deployment keeps its original numbers (slow drift cannot lower the bar),
    but only those measured like now's: a bar from another dataset or load is replaced, else no
    later run could ever be compared with it."""
    merged = dict(now)
    for value, settings in BARS:
        if value in previous and (value not in now or previous.get(settings) == now.get(settings)):
            merged[value], merged[settings] = previous[value], previous.get(settings)
            if value == "output_tok_s":
                merged["dataset"], merged["dataset_sha256"] = previous.get("dataset"), previous.get("dataset_sha256")
    return merged


def write_command(ctx: StepContext, record: dict, copy_env_from: str | None, shown: str | None = None) -> str:
    """Copy the env file first (when it is not last-good.env already), then the record.

    ``shown``: the plan's stand-in for the record's JSON (known only after verification)."""
    path = quote_path(last_good_path(ctx.paths.root))
    target = last_good_env_path(ctx.paths.root)
    helper = ctx.paths.helper("host_ops.py")
    if copy_env_from:
        env = (f"{write_file_command(ctx.host.python, helper, quote_path(target))} < {quote_path(copy_env_from)} && ")
    elif record.get("env_file") is None:
        env = f"rm -f -- {quote_path(target)} && "
    else:
        env = ""
    text = shown if shown is not None else json.dumps(record, sort_keys=True)
    return f"{env}printf '%s\\n' {quote(text)} | {write_file_command(ctx.host.python, helper, path)}"


def read_action(ctx: StepContext) -> Command:
    return Command(description="read the last good deployment", when="doctor did not read it in this run",
                   command=read_record_command(last_good_path(ctx.paths.root)))


def write_action(ctx: StepContext, record: dict, copy_env_from: str | None, shown: str | None = None) -> Command:
    return Command(description="record this deployment (and its env file) as the last good one",
                   when="it is not recorded as the last good one already, with these numbers",
                   command=write_command(ctx, record, copy_env_from, shown), what="recording the last good deployment")


def plan(ctx: StepContext) -> list[Command]:
    from deploy.steps.launch import env_path

    env = env_path(ctx) if ctx.run.env else None
    return [read_action(ctx), write_action(ctx, {"env_file": env}, env,
                                           shown="<this deployment's record with its measurements, as JSON>")]


def last_good(ctx: StepContext) -> dict | None:
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
    if previous is not None and same_deployment(previous, deployment) and isinstance(previous.get("metrics"), dict):
        metrics = keep_bar(previous["metrics"], metrics)
    record = dict(deployment) | {"metrics": metrics,
                                 "verified_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if previous is not None and same_deployment(previous, deployment):
        record["verified_at"] = previous.get("verified_at", record["verified_at"])
    env_file = deployment.get("env_file")
    target = last_good_env_path(ctx.paths.root)
    copy_from = env_file if env_file and env_file != target else None
    record["env_file"] = target if env_file else None
    if previous is not None and same_deployment(previous, deployment) and not copy_from and \
            {k: v for k, v in previous.items() if k != "pid"} == {k: v for k, v in record.items() if k != "pid"}:
        ctx.memory.last_good = previous
        return StepOutcome("ok", f"already the last good deployment ({deployment.get('drafter_path')})",
                           {"last_good": {k: previous.get(k) for k in ("drafter_fingerprint", "drafter_path", "metrics")}})
    ctx.execute(write_action(ctx, record, copy_from))
    ctx.memory.last_good = record
    return StepOutcome("ok", f"last good: {deployment.get('drafter_path')} (pid {deployment.get('pid')})",
                       {"last_good": {k: record.get(k) for k in ("drafter_fingerprint", "drafter_path", "metrics")}})
