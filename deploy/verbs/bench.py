"""``deployctl bench`` as one request and one engine call: its rounds planned (``--dry-run``) or
run (deploy/verbs/bench_sweep.py's sweep, each round through the rollout and ``run_locked``), and
the one exit code of the whole. ``prepare`` raises every refusal before a host is reached;
``execute`` takes what it resolved. The CLI renders the result and writes the report (deploy/cli/bench.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.verbs import bench_sweep
from deploy.verbs.selection import rollout_of, run_and_hosts, with_dataset, with_draft_tokens

if TYPE_CHECKING:
    from deploy.config.models import Config, Run
    from deploy.engine.playbook import Playbook
    from deploy.engine.records import Progress
    from deploy.fleet.rollout import Rollout


@dataclass(frozen=True)
class BenchRequest:
    """What ``deployctl bench`` was asked, as one value."""

    config_path: Path
    playbook: str = "bench"
    run_name: str | None = None
    host_names: tuple[str, ...] = ()
    #: one round per value, in order (``--draft-tokens``, repeatable); empty: one round of the run's own
    draft_tokens: tuple[int, ...] = ()
    num_prompts: int | None = None
    max_concurrency: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    dataset: str | None = None
    dry_run: bool = False
    ignore_doctor: bool = False
    replace: bool = False


@dataclass
class PlannedRound:
    """One round of a sweep as its run plans it: a node group's ranks, a fleet's batches (the rollout's)."""

    label: str
    run: Run
    plans: dict
    fleet_plan: dict | None


@dataclass
class BenchResult:
    """A sweep planned (``rounds``) or run (``sweep``), the playbook it ran, and its exit code."""

    request: BenchRequest
    run: Run
    playbook: Playbook
    exit_code: int
    rounds: list[PlannedRound] | None = None
    sweep: bench_sweep.SweepResult | None = None


def _settings(request: BenchRequest) -> dict[str, dict[str, Any]]:
    load = {k: v for k, v in (("num_prompts", request.num_prompts), ("max_concurrency", request.max_concurrency),
                              ("input_len", request.input_len), ("output_len", request.output_len)) if v is not None}
    settings: dict[str, dict[str, Any]] = {"benchmark": load} if load else {}
    if request.ignore_doctor:
        settings["doctor"] = {"ignore": True}
    if request.replace:
        settings.setdefault("doctor", {})["replace"] = True
    return settings


@dataclass(frozen=True)
class Prepared:
    """A bench request resolved against the config: what its dry run plans and its run runs."""

    request: BenchRequest
    config: Config
    run: Run
    hosts: list
    rollout: Rollout
    #: one run per round (``--draft-tokens`` applied and re-validated), in order
    runs: list
    playbook: Playbook


def prepare(request: BenchRequest, config: Config) -> Prepared:
    """Resolve (pure: no connection); every refusal (run, hosts, rollout, draft tokens, dataset) is raised here."""
    from deploy.engine.playbook import load_playbook

    run, hosts = run_and_hosts(config, request.run_name, request.host_names)
    rollout = rollout_of(config, run, "bench", request.host_names, playbook=request.playbook)
    runs = [with_draft_tokens(run, t) for t in request.draft_tokens] or [run]
    playbook = load_playbook(request.playbook)
    settings = _settings(request)
    if "benchmark" in settings:
        playbook = playbook.with_settings("benchmark", **settings.pop("benchmark"))
    playbook = with_dataset(playbook, request.dataset, request.config_path)
    for step, updates in settings.items():
        playbook = playbook.with_settings(step, **updates)
    return Prepared(request, config, run, hosts, rollout, runs, rollout.playbook(playbook))


def execute(prepared: Prepared, progress: Progress) -> BenchResult:
    """Plan (``dry_run``) or run every round and the restore of one prepared request."""
    request, config, run, hosts = prepared.request, prepared.config, prepared.run, prepared.hosts
    rollout, runs, playbook = prepared.rollout, prepared.runs, prepared.playbook
    if request.dry_run:
        from deploy.engine.plan import plan_playbook

        stages = [(f"draft tokens {r.draft_tokens}", r, bench_sweep.round_playbook(playbook, r, run)) for r in runs]
        if runs[-1].draft_tokens != run.draft_tokens:
            stages.append((f"restore the configured deployment (draft tokens {run.draft_tokens})", run,
                           bench_sweep.restore_playbook(playbook)))
        rounds = [PlannedRound(label, r, *rollout.with_run(r).plan(config, staged,
                                                                   plan_playbook(staged, r, hosts, lock=True), None))
                  for label, r, staged in stages]
        return BenchResult(request, run, playbook, 0, rounds=rounds)

    from deploy.engine.run import exit_code, run_locked

    def run_round(round_playbook, round_run):
        # a node group benches as one server, replicas behind a router in the rollout's batches
        runner = rollout.with_run(round_run).runner(config, round_playbook, progress)
        ran = run_locked(request.config_path, config, "bench", round_playbook, round_run, hosts, progress,
                         runner=runner)
        error = getattr(ran.phased, "error", None)
        for report in ran.reports:  # a run-level failure (the router's pre-flight) fails the untouched hosts
            report.error = report.error or error
        return ran.reports

    result = bench_sweep.sweep(run_round, playbook, run, runs, hosts, progress)
    codes = [exit_code(reports) for _, reports in result.rounds] + \
        ([exit_code(result.restore)] if result.restore is not None else [])
    code = int(result.error.exit_code) if result.error is not None else int(next((c for c in codes if c != 0), 0))
    return BenchResult(request, run, playbook, code, sweep=result)
