"""What a verb was asked to touch, resolved from the config: its run (with ``--draft-tokens``
applied and re-validated), its hosts (``--host``, ``--group``), its rollout, and a playbook's
benchmark dataset. Every user error here names the flag and exits 2 (a bad dataset file: 3);
nothing is connected or changed. The CLI builds a request; the verbs resolve it with these."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.base.errors import ConfigError, UsageError

if TYPE_CHECKING:  # pydantic stays unimported until a verb runs (a fast --help)
    from deploy.config.models import Config, Host, Run
    from deploy.fleet.rollout import Rollout


def load_config(config_path: Path, accept_new_host_keys: bool = False) -> Config:
    """The config file, with ``--accept-new-host-keys`` applied to its ssh settings."""
    from deploy.config import load_config as load

    config = load(config_path)
    if accept_new_host_keys:
        ssh = config.ssh.model_copy(update={"host_key_policy": "accept-new"})
        config = config.model_copy(update={"ssh": ssh})
    return config


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


def rollout_of(config: Config, run: Run, verb: str, host_names, serial: int | None = None,
               allow_downtime: bool = False, playbook: str | None = None, canary: bool = False) -> Rollout:
    """The verb's one rollout value (deploy/fleet/rollout.py): its plan and its run take the same."""
    from deploy.fleet.rollout import Rollout

    return Rollout.of(run, config.hosts_of(run), verb, tuple(host_names or ()), serial=serial,
                      allow_downtime=allow_downtime, playbook=playbook, canary=canary)


def with_dataset(playbook, dataset: str | None, config_path) -> Any:
    """The playbook with its benchmark step's ``dataset`` resolved and validated before any host is
    touched (a bad file: exit 3 naming file and line). ``--dataset`` is relative to the current
    directory; the playbook's ``dataset`` setting to the config file's folder."""
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
