"""deployctl bench: redeploy with each draft-token value, verify, benchmark, compare; then serve the
configured deployment again and write the sweep report (JSON + HTML with charts)."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import doctor_override, rollout_of, run_and_hosts, with_dataset, with_draft_tokens


@click.command("bench")
@options.run
@options.hosts
@options.draft_tokens_sweep
@click.option("--num-prompts", type=click.IntRange(1, 100000), default=None)
@click.option("--max-concurrency", type=click.IntRange(1, 4096), default=None)
@click.option("--input-len", type=click.IntRange(1, 1_000_000), default=None, help="random-ids only.")
@click.option("--output-len", type=click.IntRange(4, 1_000_000), default=None)
@options.dataset
@options.playbook("bench")
@options.dry_run
@options.as_json()
@options.ignore_doctor
@options.replace
@click.pass_obj
def command(globals_, run_name, host_names, draft_tokens, num_prompts, max_concurrency, input_len, output_len,
            dataset, playbook_name, dry_run, as_json, ignore_doctor, replace) -> int:
    """Redeploy with each --draft-tokens value, verify acceptance, run sglang.bench_serving; compare.

    Ends serving the run's configured draft tokens (a sweep value is never recorded as the last good
    deployment) and writes bench/report-<time>.html and .json under the local state directory."""
    from deploy.local.state import LocalStateError
    from deploy.render import bench_report
    from deploy.verbs import bench_sweep
    from deploy.render import report as render
    from deploy.engine.plan import plan_playbook
    from deploy.engine.run import exit_code, run_locked
    from deploy.engine.playbook import load_playbook

    config = globals_.load()
    run, hosts = run_and_hosts(config, run_name, host_names)
    rollout = rollout_of(config, run, "bench", host_names, playbook=playbook_name)
    runs = [with_draft_tokens(run, t) for t in draft_tokens] or [run]
    playbook = load_playbook(playbook_name)
    updates = {k: v for k, v in (("num_prompts", num_prompts), ("max_concurrency", max_concurrency),
                                 ("input_len", input_len), ("output_len", output_len)) if v is not None}
    if updates:
        playbook = playbook.with_settings("benchmark", **updates)
    playbook = with_dataset(playbook, dataset, globals_.config_path)
    for step, settings in doctor_override(ignore_doctor, replace).items():
        playbook = playbook.with_settings(step, **settings)
    playbook = rollout.playbook(playbook)
    if dry_run:
        plans = [(f"draft tokens {r.draft_tokens}", r, bench_sweep.round_playbook(playbook, r, run)) for r in runs]
        if runs[-1].draft_tokens != run.draft_tokens:
            plans.append((f"restore the configured deployment (draft tokens {run.draft_tokens})", run,
                          bench_sweep.restore_playbook(playbook)))
        # each round as its run plans it: a node group's ranks, a fleet's batches (the rollout's)
        rounds = [(label, r, *rollout.with_run(r).plan(config, p, plan_playbook(p, r, hosts, lock=True), None))
                  for label, r, p in plans]
        if as_json:
            documents = [render.plan_document("bench", r.name, host_plans)
                         | {"draft_tokens": r.draft_tokens, "stage": label}
                         | ({"fleet": fleet_plan} if fleet_plan is not None else {})
                         for label, r, host_plans, fleet_plan in rounds]
            render.print_json({"command": "bench", "run": run.name, "dry_run": True, "sweep": documents})
        else:
            from deploy import fleet

            for label, r, host_plans, fleet_plan in rounds:
                render.plan_text(f"bench ({label})", host_plans, render.console())
                if fleet_plan is not None:
                    fleet.print_fleet_plan(fleet_plan)
        return 0
    progress = render.progress_printer()

    def run_round(round_playbook, round_run):
        # a node group benches as one server, replicas behind a router in the rollout's batches
        runner = rollout.with_run(round_run).runner(config, round_playbook, progress)
        result = run_locked(globals_.config_path, config, "bench", round_playbook, round_run, hosts, progress,
                            runner=runner)
        if runner is None:
            return result
        for report in result.reports:  # a run-level failure (the router's pre-flight) fails the untouched hosts
            report.error = report.error or result.error
        return result.reports

    result = bench_sweep.sweep(run_round, playbook, run, runs, hosts, progress)
    table = bench_report.rows(result.rounds)
    report = bench_report.document(run.name, run.draft_tokens, table, result.serving, drafter=run.drafter,
                                   target=run.base_model, load=bench_sweep.benchmark_load(playbook))
    json_path = html_path = None
    try:
        json_path, html_path = bench_report.write(report)
    except (OSError, LocalStateError) as exc:  # the report is a record, never a reason to fail the benchmark
        progress("*", "bench", f"WARNING: could not write the report: {exc}")
    codes = [exit_code(reports) for _, reports in result.rounds] + \
        ([exit_code(result.restore)] if result.restore is not None else [])
    code = int(result.error.exit_code) if result.error is not None else int(next((c for c in codes if c != 0), 0))
    if as_json:
        document = render.bench_document(run.name, result.rounds)
        # a sweep refused before its first round (a lock) has no failed round: its code says how it ended
        render.print_json(document | result.to_dict()
                          | {"ok": document["ok"] and code == 0, "exit_code": code, "report": report["rows"],
                             "report_html": str(html_path) if html_path else None,
                             "report_json": str(json_path) if json_path else None})
    else:
        out = render.console()
        render.bench_table(result.rounds, out)
        for line in result.serving:
            out.print(f"{line['host']} serves: {line['serves']}", markup=False)
        if html_path is not None:
            out.print(f"report: {html_path} (data: {json_path})", markup=False)
    if result.error is not None:
        raise result.error
    return code
