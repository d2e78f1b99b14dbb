"""deployctl up / restart / down / plan / logs: the playbooks on a run's hosts."""

from __future__ import annotations

import click

common_options = [
    click.option("--run", "run_name", default=None, help="Run from the config (default: the only one)."),
    click.option("--host", "host_names", multiple=True, help="Only these hosts of the run (repeatable)."),
    click.option("--draft-tokens", type=click.IntRange(2, 64), default=None,
                 help="--speculative-num-draft-tokens (topk 1: num-steps = T - 1). Default: the run's."),
    click.option("--playbook", "playbook_name", default=None, help="Playbook name or YAML file to run instead."),
    click.option("--dry-run", is_flag=True, help="Print every command in order; change nothing."),
    click.option("--json", "as_json", is_flag=True, help="Print a JSON report document on stdout."),
]


redeploy_options = [
    click.option("--force", is_flag=True, help="Redeploy even when the server already runs as desired."),
    click.option("--no-rollback", "no_rollback", is_flag=True,
                 help="On a failure after stop-stale, do not relaunch the last good deployment."),
]


def with_common(func):
    for option in reversed(common_options):
        func = option(func)
    return func


def with_redeploy(func):
    for option in reversed(redeploy_options):
        func = option(func)
    return func


def run_locked(globals_, config, command: str, playbook, run, hosts, tokens: int, progress, *,
               rollback: bool = True, force: bool = False):
    """Run a playbook that changes hosts: local lock per config and run, host locks, history."""
    from contextlib import ExitStack
    from datetime import datetime, timezone

    from deploy import history
    from deploy.errors import DeployError, LockHeld
    from deploy.locks import local_lock, owner_info
    from deploy.orchestrator import RunOptions, run_playbook

    owner = owner_info(command, run.name)
    started = datetime.now(timezone.utc)
    with ExitStack() as held:
        try:
            held.enter_context(local_lock(globals_.config_path, run.name, owner))
        except LockHeld as refused:
            try:
                history.append({"time": started.isoformat(timespec="seconds"), "verb": command, "run": run.name,
                                "host": host.name, "draft_tokens": tokens, "outcome": "locked",
                                "exit_code": int(refused.exit_code), "duration_s": 0.0} for host in hosts)
            except (OSError, DeployError):
                pass
            raise
        try:
            reports = run_playbook(config, playbook, run, hosts, tokens, progress,
                                   RunOptions(command=command, lock=True, owner=owner, rollback=rollback, force=force))
        except KeyboardInterrupt as interrupt:
            # Ctrl-C: no rollback, but say what each host was left running, and record it.
            partial = [o.value for o in getattr(interrupt, "outcomes", []) if o.value is not None]
            for report in partial:
                progress(report.host.name, "interrupted", f"left running: {report.left_running or 'unknown'}")
            try:
                history.append(history.records_for(command, run.name, partial, started))
            except (OSError, DeployError):
                pass
            raise
    try:
        history.append(history.records_for(command, run.name, reports, started))
    except (OSError, DeployError) as exc:  # history is a record, never a reason to fail the deploy
        progress("*", "history", f"WARNING: could not append to {history.history_path()}: {exc}")
    return reports


def _run_and_hosts(config, run_name, host_names):
    from deploy.cli.common import select_run
    from deploy.errors import UsageError

    run = select_run(config, run_name)
    hosts = config.hosts_of(run)
    if host_names:
        unknown = [n for n in host_names if n not in {h.name for h in hosts}]
        if unknown:
            raise UsageError(f"--host {unknown[0]!r} is not a host of run {run.name!r} ({', '.join(h.name for h in hosts)})")
        hosts = [h for h in hosts if h.name in host_names]
    return run, hosts


ignore_doctor_option = click.option(
    "--ignore-doctor", is_flag=True,
    help="Run on past failing doctor checks (they are still printed).")


def _doctor_override(ignore_doctor: bool) -> dict:
    if ignore_doctor:
        click.echo("--ignore-doctor: a failing doctor check will not stop this run; the running server may be "
                   "stopped for a deploy the doctor expects to fail", err=True)
        return {"doctor": {"ignore": True}}
    return {}


def _execute(globals_, command: str, default_playbook: str, run_name, host_names, draft_tokens, playbook_name,
             dry_run: bool, as_json: bool, overrides: dict | None = None, force: bool = False,
             no_rollback: bool = False) -> int:
    from deploy import render
    from deploy.orchestrator import exit_code, plan_playbook
    from deploy.playbook import load_playbook

    config = globals_.load()
    run, hosts = _run_and_hosts(config, run_name, host_names)
    playbook = load_playbook(playbook_name or default_playbook)
    for step, updates in (overrides or {}).items():
        playbook = playbook.with_settings(step, **updates)
    tokens = draft_tokens if draft_tokens is not None else run.draft_tokens
    if dry_run:
        from deploy.transport import describe_endpoints

        endpoints = describe_endpoints(hosts, config.ssh)
        addresses = {n: e["hostname"]["value"] for n, e in endpoints.items() if "hostname" in e}
        plans = plan_playbook(playbook, run, hosts, tokens, addresses, lock=True)
        if as_json:
            render.print_json(render.plan_document(command, run.name, plans, endpoints))
        else:
            render.plan_text(command, plans, render.console(), endpoints)
        return 0
    reports = run_locked(globals_, config, command, playbook, run, hosts, tokens, render.progress_printer(),
                         rollback=not no_rollback and command != "down", force=force)
    if as_json:
        render.print_json(render.report_document(command, run.name, reports))
    else:
        render.step_summary_tables(command, reports, render.console())
    return int(exit_code(reports))


@click.command("up")
@with_common
@ignore_doctor_option
@with_redeploy
@click.pass_obj
def up(globals_, ignore_doctor: bool, **kw) -> int:
    """Doctor, fix the drafter's keys, stop stale python3, free the GPUs, launch SGLang, wait until ready.

    Already running as desired (same argv, drafter, environment, SGLang version; alive; /health
    200): nothing is touched. A failure after stop-stale relaunches the last good deployment (exit 11).
    """
    return _execute(globals_, "up", "up", overrides=_doctor_override(ignore_doctor), **kw)


@click.command("restart")
@with_common
@ignore_doctor_option
@with_redeploy
@click.pass_obj
def restart(globals_, ignore_doctor: bool, **kw) -> int:
    """After a checkpoint change: doctor, re-fix if the drafter changed, then stop, free, launch, wait."""
    return _execute(globals_, "restart", "restart", overrides=_doctor_override(ignore_doctor), **kw)


@click.command("down")
@with_common
@click.option("--free-gpus", is_flag=True, help="Also fuser -k the GPU device files and wait until free.")
@click.pass_obj
def down(globals_, free_gpus: bool, **kw) -> int:
    """Stop the server deployctl launched (by its PID file first)."""
    overrides = {"free-gpus": {"enabled": True}, "wait-gpus-free": {"enabled": True}} if free_gpus else {}
    return _execute(globals_, "down", "down", overrides=overrides, **kw)


@click.command("plan")
@click.argument("playbook", default="up")
@click.option("--run", "run_name", default=None, help="Run from the config (default: the only one).")
@click.option("--host", "host_names", multiple=True, help="Only these hosts of the run (repeatable).")
@click.option("--draft-tokens", type=click.IntRange(2, 64), default=None)
@click.option("--json", "as_json", is_flag=True, help="The plan as a JSON document (launch argv as a list).")
@click.pass_obj
def plan(globals_, playbook: str, run_name, host_names, draft_tokens, as_json) -> int:
    """Print, per host, every command PLAYBOOK (up, restart, down or a file) would run; change nothing."""
    return _execute(globals_, "plan", playbook, run_name, host_names, draft_tokens, None, True, as_json)


@click.command("logs")
@click.option("--run", "run_name", default=None)
@click.option("--host", "host_names", multiple=True)
@click.option("-n", "--lines", type=click.IntRange(1, 100000), default=50, show_default=True)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.pass_obj
def logs(globals_, run_name, host_names, lines: int, follow: bool) -> int:
    """Show the latest SGLang server log of the run's hosts."""
    from deploy.fanout import for_each_host
    from deploy.orchestrator import exit_code
    from deploy.shell import quote_path
    from deploy.steps.base import StatePaths
    from deploy.transport import HostConnection, JumpConnections

    config = globals_.load()
    _, hosts = _run_and_hosts(config, run_name, host_names)

    if follow:
        if len(hosts) != 1:
            from deploy.errors import UsageError

            raise UsageError("--follow needs exactly one host (use --host NAME)")
        host = hosts[0]
        with HostConnection(host, config.ssh) as conn:
            conn.stream(f"tail -n {lines} -F -- {quote_path(StatePaths(host.state_dir).latest_log)}")
        return 0

    def work(host):
        with HostConnection(host, config.ssh, jumps) as conn:
            return conn.check(f"tail -n {lines} -- {quote_path(StatePaths(host.state_dir).latest_log)}",
                              what="reading the server log").stdout

    with JumpConnections() as jumps:
        outcomes = for_each_host(hosts, work, config.ssh.max_parallel)
    for outcome in outcomes:
        click.echo(f"==> {outcome.host.name}: {StatePaths(outcome.host.state_dir).latest_log} <==")
        if outcome.error is not None:
            click.echo(f"error: {outcome.error}", err=True)
        else:
            click.echo(outcome.value, nl=False)
    return int(exit_code(outcomes))


@click.command("bench")
@click.option("--run", "run_name", default=None, help="Run from the config (default: the only one).")
@click.option("--host", "host_names", multiple=True, help="Only these hosts of the run (repeatable).")
@click.option("--draft-tokens", "draft_tokens", type=click.IntRange(2, 64), multiple=True,
              help="Deploy and benchmark with T draft tokens; repeat for a sweep (16, 10, 5). Default: the run's.")
@click.option("--num-prompts", type=click.IntRange(1, 100000), default=None)
@click.option("--max-concurrency", type=click.IntRange(1, 4096), default=None)
@click.option("--input-len", type=click.IntRange(1, 1_000_000), default=None)
@click.option("--output-len", type=click.IntRange(1, 1_000_000), default=None)
@click.option("--playbook", "playbook_name", default="bench", show_default=True)
@click.option("--dry-run", is_flag=True, help="Print every command in order; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report document on stdout.")
@ignore_doctor_option
@click.pass_obj
def bench(globals_, run_name, host_names, draft_tokens, num_prompts, max_concurrency, input_len, output_len,
          playbook_name, dry_run, as_json, ignore_doctor) -> int:
    """Redeploy with each --draft-tokens value, verify acceptance, run sglang.bench_serving; compare."""
    from deploy import render
    from deploy.orchestrator import exit_code, plan_playbook
    from deploy.playbook import load_playbook

    config = globals_.load()
    run, hosts = _run_and_hosts(config, run_name, host_names)
    playbook = load_playbook(playbook_name)
    updates = {k: v for k, v in (("num_prompts", num_prompts), ("max_concurrency", max_concurrency),
                                 ("input_len", input_len), ("output_len", output_len)) if v is not None}
    if updates:
        playbook = playbook.with_settings("benchmark", **updates)
    for step, settings in _doctor_override(ignore_doctor).items():
        playbook = playbook.with_settings(step, **settings)
    sweep = list(draft_tokens) or [run.draft_tokens]
    if dry_run:
        documents = [render.plan_document("bench", run.name, plan_playbook(playbook, run, hosts, t, lock=True)) | {"draft_tokens": t}
                     for t in sweep]
        if as_json:
            render.print_json({"command": "bench", "run": run.name, "dry_run": True, "sweep": documents})
        else:
            for t in sweep:
                render.plan_text(f"bench (draft tokens {t})", plan_playbook(playbook, run, hosts, t, lock=True), render.console())
        return 0
    progress = render.progress_printer()
    rounds = []
    for t in sweep:
        progress("*", "bench", f"draft tokens {t}")
        rounds.append((t, run_locked(globals_, config, "bench", playbook, run, hosts, t, progress)))
    if as_json:
        render.print_json(render.bench_document(run.name, rounds))
    else:
        render.bench_table(rounds, render.console())
    codes = [exit_code(reports) for _, reports in rounds]
    return int(next((c for c in codes if c != 0), 0))


COMMANDS = [up, restart, down, plan, logs, bench]
