"""Small pieces shared by the CLI verbs (selection of hosts and runs from the config)."""

from __future__ import annotations

from deploy.config.models import Config, Host, Run
from deploy.errors import ConfigError, UsageError


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
