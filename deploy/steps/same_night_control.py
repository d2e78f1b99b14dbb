"""same-night-control: nightly benchmarks the running last good deployment before it is stopped (issue 39).

The throughput gate compared tonight's rounds with a bar measured on another night, under another load on
the machine, and blamed the difference on the checkpoint: a month of simulated nightlies rolled back and
quarantined 7 good checkpoints and reported 4 unchanged deployments as regressions. The control is the
last good deployment measured under tonight's conditions, with the benchmark step's own load (the
playbook gives this step the benchmark step's settings: ``_control_measures_the_benchmark_load`` in
deploy/engine/playbook.py), minutes before the new one; regression-gate judges the new rounds against it
(deploy/local/same_night.py) and the stored bar only tells the host's drift.

A paired design without a reload: the server that serves anyway is measured while it still runs, instead
of restoring it after the new one looked slow (a second model load, minutes on a real host, and a third to
put the new one back when the host had drifted). It runs whenever the checkpoint changed, not only when
the new rounds look slow: a host that runs faster tonight hides a slower checkpoint above the stored bar.

Measured only when it can control anything: the drafter changed (converge did not find the deployment
running as desired: CONVERGE_SKIPS), the running server is the last good deployment of this run (alive,
/health 200, its record the last good one's, as the doctor read it), measured at this draft-token count
and load before (a stored bar). A failure of the harness here is no reason to fail the night: the
step says "no same-night control" and the gate then never calls a regression.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from deploy.host.records import ControlMeasurement, Metrics
from deploy.base.errors import BenchmarkHarnessFailed
from deploy.facts.server import same_deployment
from deploy.steps import benchmark
from deploy.steps.base import Action, StepContext, StepOutcome
from deploy.steps.record_good import throughput_baseline

NAME = "same-night-control"
#: converge found the deployment running as desired: the benchmark measures that very deployment
CONVERGE_SKIPS = True


class Settings(benchmark.Settings):
    """The benchmark step's load (copied from it by the playbook loader) and where the rounds are kept."""

    results_kind: str = "control"


WHEN = "the drafter changed and the running server is the last good deployment, measured at this load before"


def plan(ctx: StepContext) -> list[Action]:
    return [replace(action, when=WHEN, description=f"same-night control (the last good deployment, before the stop): "
                                                   f"{action.description}") for action in benchmark.plan(ctx)]


def not_applicable(ctx: StepContext) -> str | None:
    """Why there is nothing to control tonight, or None."""
    snapshot = ctx.memory.snapshot
    good = getattr(snapshot, "last_good", None)
    if snapshot is None or good is None or good.run != ctx.run.name:
        return "no last good deployment of this run recorded: nothing to control"
    metrics = good.metrics or Metrics()
    if metrics.draft_tokens != ctx.draft_tokens:
        return f"the last good deployment was measured at {metrics.draft_tokens} draft tokens, not {ctx.draft_tokens}"
    if good.drafter_fingerprint and good.drafter_fingerprint == ctx.memory.drafter_fingerprint:
        return "the drafter is the last good one's: the benchmark measures it itself"
    server = snapshot.server
    if not (server.alive and server.status == 200 and same_deployment(server.record, good)):
        return "the running server is not the last good deployment (or does not answer /health 200)"
    if throughput_baseline(metrics, benchmark.load(ctx, benchmark.dataset(ctx))) is None:
        return "the last good deployment has no stored bar at this load: nothing to compare"
    return None


def run(ctx: StepContext) -> StepOutcome:
    why = not_applicable(ctx)
    if why is not None:
        return StepOutcome("skipped", why)
    ds = benchmark.dataset(ctx)
    try:
        if ds.is_file:
            benchmark.ensure_dataset(ctx, ds)
        rounds = []
        for number in range(1, ctx.settings.rounds + 1):
            if number > 1:
                ctx.progress(f"control round {number} of {ctx.settings.rounds}")
            rounds.append(benchmark.one_round(ctx, ds, number).output_tok_s)
    except BenchmarkHarnessFailed as exc:
        # nothing is stopped yet; the gate says "no same-night control" and never calls a regression
        return StepOutcome("ok", f"NOT MEASURED (no same-night control tonight): {exc}", {"measured": False})
    good = ctx.memory.snapshot.last_good if ctx.memory.snapshot is not None else None
    control = ControlMeasurement(measured=True, output_tok_s_rounds=rounds, settings=benchmark.load(ctx, ds),
                                 drafter_fingerprint=good.drafter_fingerprint if good is not None else None,
                                 measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                 results_file=benchmark.results_path(ctx))
    ctx.memory.control = control
    data = control.document()
    return StepOutcome("ok", f"the last good deployment tonight: {min(rounds):.1f}-{max(rounds):.1f} output tok/s over "
                             f"{len(rounds)} round(s)", data)
