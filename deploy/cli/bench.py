"""deployctl bench: redeploy with each draft-token value, verify, benchmark, compare."""

from __future__ import annotations

import click

from deploy.cli import options
from deploy.cli.common import doctor_override, run_and_hosts, with_draft_tokens


@click.command("bench")
@options.run
@options.hosts
@options.draft_tokens_sweep
@click.option("--num-prompts", type=click.IntRange(1, 100000), default=None)
@click.option("--max-concurrency", type=click.IntRange(1, 4096), default=None)
@click.option("--input-len", type=click.IntRange(1, 1_000_000), default=None)
@click.option("--output-len", type=click.IntRange(1, 1_000_000), default=None)
@options.playbook("bench")
@options.dry_run
@options.as_json()
@options.ignore_doctor
@click.pass_obj
def command(globals_, run_name, host_names, draft_tokens, num_prompts, max_concurrency, input_len, output_len,
            playbook_name, dry_run, as_json, ignore_doctor) -> int:
    """Redeploy with each --draft-tokens value, verify acceptance, run sglang.bench_serving; compare."""
    from deploy import render
    from deploy.engine.plan import plan_playbook
    from deploy.engine.run import exit_code, run_locked
    from deploy.playbook import load_playbook

    config = globals_.load()
    run, hosts = run_and_hosts(config, run_name, host_names)
    runs = [with_draft_tokens(run, t) for t in draft_tokens] or [run]
    playbook = load_playbook(playbook_name)
    updates = {k: v for k, v in (("num_prompts", num_prompts), ("max_concurrency", max_concurrency),
                                 ("input_len", input_len), ("output_len", output_len)) if v is not None}
    if updates:
        playbook = playbook.with_settings("benchmark", **updates)
    for step, settings in doctor_override(ignore_doctor).items():
        playbook = playbook.with_settings(step, **settings)
    if dry_run:
        documents = [render.plan_document("bench", r.name, plan_playbook(playbook, r, hosts, lock=True))
                     | {"draft_tokens": r.draft_tokens} for r in runs]
        if as_json:
            render.print_json({"command": "bench", "run": run.name, "dry_run": True, "sweep": documents})
        else:
            for r in runs:
                render.plan_text(f"bench (draft tokens {r.draft_tokens})", plan_playbook(playbook, r, hosts, lock=True),
                                 render.console())
        return 0
    progress = render.progress_printer()
    rounds = []
    for r in runs:
        progress("*", "bench", f"draft tokens {r.draft_tokens}")
        rounds.append((r.draft_tokens, run_locked(globals_.config_path, config, "bench", playbook, r, hosts, progress)))
    if as_json:
        render.print_json(render.bench_document(run.name, rounds))
    else:
        render.bench_table(rounds, render.console())
    codes = [exit_code(reports) for _, reports in rounds]
    return int(next((c for c in codes if c != 0), 0))
