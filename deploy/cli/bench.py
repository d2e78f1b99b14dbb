"""deployctl bench: redeploy with each draft-token value, verify, benchmark, compare; then serve the
configured deployment again and write the sweep report (JSON + HTML with charts)."""

from __future__ import annotations

import click

from deploy.cli import options


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
def command(globals_, host_names, draft_tokens, playbook_name, as_json, **kw) -> int:
    """Redeploy with each --draft-tokens value, verify acceptance, run sglang.bench_serving; compare.

    Ends serving the run's configured draft tokens (a sweep value is never recorded as the last good
    deployment) and writes bench/report-<time>.html and .json under the local state directory."""
    from deploy.cli.common import warn_ignore_doctor
    from deploy.render import report as render
    from deploy.verbs import bench

    request = bench.BenchRequest(config_path=globals_.config_path, playbook=playbook_name,
                                 host_names=tuple(host_names), draft_tokens=tuple(draft_tokens), **kw)
    prepared = bench.prepare(request, globals_.load())
    warn_ignore_doctor(request.ignore_doctor)
    progress = render.progress_printer()
    result = bench.execute(prepared, progress)
    if result.rounds is not None:
        _render_plan(result, as_json)
        return result.exit_code
    return _render_sweep(result, as_json, progress)


def _render_plan(result, as_json: bool) -> None:
    from deploy.render import report as render

    if as_json:
        documents = [render.plan_document("bench", r.run.name, r.plans)
                     | {"draft_tokens": r.run.draft_tokens, "stage": r.label}
                     | ({"fleet": r.fleet_plan} if r.fleet_plan is not None else {})
                     for r in result.rounds]
        render.print_json({"command": "bench", "run": result.run.name, "dry_run": True, "sweep": documents})
        return
    from deploy.fleet.plan import print_fleet_plan

    for r in result.rounds:
        render.plan_text(f"bench ({r.label})", r.plans, render.console())
        if r.fleet_plan is not None:
            print_fleet_plan(r.fleet_plan)


def _render_sweep(result, as_json: bool, progress) -> int:
    """The sweep's table or document and its report files (a record: a failure to write is a warning)."""
    from deploy.local.state import LocalStateError
    from deploy.render import bench_report
    from deploy.render import report as render
    from deploy.verbs import bench_sweep

    sweep, run, code = result.sweep, result.run, result.exit_code
    table = bench_report.rows(sweep.rounds)
    report = bench_report.document(run.name, run.draft_tokens, table, sweep.serving, drafter=run.drafter,
                                   target=run.base_model, load=bench_sweep.benchmark_load(result.playbook))
    json_path = html_path = None
    try:
        json_path, html_path = bench_report.write(report)
    except (OSError, LocalStateError) as exc:  # the report is a record, never a reason to fail the benchmark
        progress("*", "bench", f"WARNING: could not write the report: {exc}")
    if as_json:
        document = render.bench_document(run.name, sweep.rounds)
        # a sweep refused before its first round (a lock) has no failed round: its code says how it ended
        render.print_json(document | sweep.to_dict()
                          | {"ok": document["ok"] and code == 0, "exit_code": code, "report": report["rows"],
                             "report_html": str(html_path) if html_path else None,
                             "report_json": str(json_path) if json_path else None})
    else:
        out = render.console()
        render.bench_table(sweep.rounds, out)
        for line in sweep.serving:
            out.print(f"{line['host']} serves: {line['serves']}", markup=False)
        if html_path is not None:
            out.print(f"report: {html_path} (data: {json_path})", markup=False)
    if sweep.error is not None:
        raise sweep.error
    return code
