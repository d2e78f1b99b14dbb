"""What the verbs share: selecting hosts and the run (with its overrides, re-validated) from the
config, and running or planning a playbook through the engine (deploy/engine/). No SSH here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from deploy.base.errors import ConfigError, UsageError

if TYPE_CHECKING:  # pydantic stays unimported until a verb runs (a fast --help)
    from deploy.config.models import Config, Host, Run
    from deploy.fleet.rollout import Rollout


def select_hosts(config: Config, names: list[str], group: str | None) -> list[Host]:
    try:
        hosts = config.select_hosts(names or None, group)
    except KeyError as exc:
        known = ", ".join(h.name for h in config.hosts)
        raise UsageError(f"--host {exc.args[0]!r}: no such host in the config (known: {known})") from None
    if not hosts:
        raise UsageError(f"--group {group!r}: no host is in that group")
    return hosts


def select_run(config: Config, name: str | None) -> Run:
    if not config.runs:
        raise ConfigError("the config defines no runs: add one under 'runs:'")
    try:
        return config.run(name)
    except KeyError:
        known = ", ".join(r.name for r in config.runs) or "(none)"
        if name is None:
            raise UsageError(f"the config has several runs; pick one with --run (known: {known})") from None
        raise UsageError(f"--run {name!r}: no such run in the config (known: {known})") from None


def with_draft_tokens(run: Run, draft_tokens: int | None) -> Run:
    """The run with ``--draft-tokens`` applied, validated by the config's own rules (exit 2 if not)."""
    if draft_tokens is None:
        return run
    from pydantic import ValidationError

    try:
        return run.overridden(draft_tokens=draft_tokens)
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise UsageError(f"--draft-tokens {draft_tokens}: {problems} (run {run.name!r})") from None


def run_and_hosts(config: Config, run_name: str | None, host_names: tuple[str, ...] | list[str],
                  draft_tokens: int | None = None) -> tuple[Run, list[Host]]:
    """The selected run (overrides applied and re-validated) and its hosts, narrowed by --host."""
    run = select_run(config, run_name)
    hosts = config.hosts_of(run)
    if host_names:
        unknown = [n for n in host_names if n not in {h.name for h in hosts}]
        if unknown:
            raise UsageError(f"--host {unknown[0]!r} is not a host of run {run.name!r} ({', '.join(h.name for h in hosts)})")
        hosts = [h for h in hosts if h.name in host_names]
    return with_draft_tokens(run, draft_tokens), hosts


def doctor_override(ignore_doctor: bool, replace: bool = False, retry_failed: bool = False) -> dict[str, dict[str, Any]]:
    overrides: dict[str, dict[str, Any]] = {}
    if ignore_doctor:
        click.echo("--ignore-doctor: a failing doctor check will not stop this run; the running server may be "
                   "stopped for a deploy the doctor expects to fail", err=True)
        overrides["doctor"] = {"ignore": True}
    if replace:
        overrides.setdefault("doctor", {})["replace"] = True
    if retry_failed:
        overrides["quarantine"] = {"retry_failed": True}
    return overrides


def rollout_of(config: Config, run: Run, verb: str, host_names, serial: int | None = None,
               allow_downtime: bool = False, playbook: str | None = None, canary: bool = False) -> Rollout:
    """The verb's one rollout value (deploy/fleet/rollout.py): its plan and its run take the same."""
    from deploy.fleet.rollout import Rollout

    return Rollout.of(run, config.hosts_of(run), verb, tuple(host_names or ()), serial=serial,
                      allow_downtime=allow_downtime, playbook=playbook, canary=canary)


def execute(globals_, command: str, default_playbook: str, run_name, host_names, draft_tokens, playbook_name,
            dry_run: bool, as_json: bool, overrides: dict | None = None, force: bool = False,
            no_rollback: bool = False, serial: int | None = None, allow_downtime: bool = False,
            canary: bool = False) -> int:
    """up, restart, down and plan: load, resolve the rollout, plan or run the playbook, render."""
    from deploy import fleet
    from deploy.render import report as render
    from deploy.engine.plan import plan_with_endpoints
    from deploy.engine.run import exit_code, run_locked
    from deploy.engine.playbook import load_playbook

    config = globals_.load()
    run, hosts = run_and_hosts(config, run_name, host_names, draft_tokens)
    name = playbook_name or default_playbook
    verb = name if command == "plan" and name in ("up", "restart", "down") else command
    rollout = rollout_of(config, run, verb, host_names, serial, allow_downtime, playbook=name, canary=canary)
    playbook = load_playbook(name)
    for step, updates in (overrides or {}).items():
        playbook = playbook.with_settings(step, **updates)
    playbook = with_dataset(playbook, None, globals_.config_path)  # a playbook's benchmark dataset: exit 3 if bad
    playbook = rollout.playbook(playbook)
    if dry_run:
        plans, endpoints = plan_with_endpoints(playbook, run, hosts, config)
        plans, fleet_plan = rollout.plan(config, playbook, plans, endpoints)
        if as_json:
            document = render.plan_document(command, run.name, plans, endpoints)
            if fleet_plan is not None:
                document["fleet"] = fleet_plan
            render.print_json(document)
        else:
            render.plan_text(command, plans, render.console(), endpoints)
            if fleet_plan is not None:
                fleet.print_fleet_plan(fleet_plan)
        # a host whose ssh settings are refused (ssh_config) is planned as "ssh: ERROR": the plan
        # is still printed, but it exits with that error's code, like gpu-status (HOSTILE, issue 22)
        refused = [int(e["exit_code"]) for e in (endpoints or {}).values() if "error" in e]
        return max(refused) if refused else 0
    progress = render.progress_printer()
    down = rollout.verb == "down" or name == "down"
    runner = rollout.runner(config, playbook, progress)
    result = run_locked(globals_.config_path, config, command, playbook, run, hosts, progress,
                        rollback=not no_rollback and not down, force=force, runner=runner)
    if runner is None:
        reports, code = result, int(exit_code(result))
    else:
        reports, code = result.reports, int(result.exit_code())
    # a fleet's phases (RunResult), or down behind a router (DownResult: what became of the router)
    phased, stopped = getattr(result, "phases", None) is not None, getattr(result, "router", None)
    if phased:
        write_canary_report(result, run.name, progress)
    if as_json:
        document = render.report_document(command, run.name, reports)
        if phased:
            document["fleet"] = fleet.fleet_report(result)
        if stopped is not None:
            document["router"] = stopped
        render.print_json(document)
    else:
        render.step_summary_tables(command, reports, render.console())
        if phased:
            fleet.print_fleet_report(result)
    return code


def write_canary_report(result: Any, run_name: str, progress: Any = None) -> str | None:
    """A canary window ran: its HTML page (deploy/render/canary_report.py), its path kept in
    ``result.canary["report_html"]``; None when no window ran. A failure to write it is a warning on
    ``progress``: the page is a record, never a reason to fail the run."""
    canary = getattr(result, "canary", None)
    if not canary or not canary.get("intervals") and canary.get("outcome") == "not-run":
        return None
    from deploy.local.state import LocalStateError
    from deploy.render import canary_report

    try:
        path = str(canary_report.write(canary, run_name))
    except (OSError, LocalStateError) as exc:
        if progress is not None:
            progress("*", "canary", f"WARNING: the canary report was not written: {exc}")
        return None
    canary["report_html"] = path
    if progress is not None:
        progress("*", "canary", f"report: {path}")
    return path


def with_dataset(playbook, dataset: str | None, config_path) -> Any:
    """The playbook with its benchmark step's ``dataset`` resolved and validated before any host is
    touched (a bad file: exit 3 naming file and line). ``--dataset`` is relative to the current
    directory; the playbook's ``dataset`` setting to the config file's folder."""
    from pathlib import Path

    from deploy.local import datasets

    step = next((s for s in playbook.steps if s.name == "benchmark"), None)
    if step is None:
        if dataset is not None:
            raise UsageError(f"--dataset: playbook {playbook.name!r} has no benchmark step")
        return playbook
    value = dataset if dataset is not None else step.settings.dataset
    if value in (datasets.BUILTIN, datasets.RANDOM_IDS):
        return playbook.with_settings("benchmark", dataset=value)
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = (Path.cwd() if dataset is not None else Path(config_path).resolve().parent) / path
    datasets.load_file(path)
    return playbook.with_settings("benchmark", dataset=str(path.resolve()))
