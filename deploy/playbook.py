"""Playbooks: ordered named steps with per-step settings, read from YAML and validated strictly."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.config.loader import compose_yaml, locate_node, format_validation_error
from deploy.errors import ConfigError
from deploy.steps import REGISTRY
from deploy.steps.base import StepSettings

BUILTIN = ("up", "restart", "down")


class _PlaybookFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    description: str = ""
    steps: list[dict[str, Any]] = Field(min_length=1)


@dataclass(frozen=True)
class PlannedStep:
    name: str
    settings: StepSettings

    @property
    def module(self):
        return REGISTRY[self.name]


@dataclass(frozen=True)
class Playbook:
    name: str
    description: str
    path: Path
    steps: tuple[PlannedStep, ...]

    def with_settings(self, step: str, **updates: Any) -> Playbook:
        """A copy with settings changed on every step called ``step`` (CLI overrides)."""
        steps = tuple(
            PlannedStep(s.name, s.settings.model_copy(update=updates)) if s.name == step else s for s in self.steps
        )
        return Playbook(self.name, self.description, self.path, steps)


def playbook_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("DEPLOYCTL_PLAYBOOKS"):
        dirs.append(Path(os.environ["DEPLOYCTL_PLAYBOOKS"]))
    dirs.append(Path(__file__).resolve().parents[1] / "playbooks")  # source checkout / editable install
    dirs.append(Path(sys.prefix) / "share" / "deployctl" / "playbooks")  # wheel install (data-files)
    return dirs


def find_playbook(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not candidate.is_file():
            raise ConfigError(f"{candidate}: playbook file not found")
        return candidate
    for directory in playbook_dirs():
        path = directory / f"{name_or_path}.yaml"
        if path.is_file():
            return path
    raise ConfigError(f"playbook {name_or_path!r} not found in {', '.join(map(str, playbook_dirs()))}")


def load_playbook(name_or_path: str) -> Playbook:
    path = find_playbook(name_or_path)
    root, data = compose_yaml(path)
    try:
        document = _PlaybookFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc, root, data)) from None
    steps = []
    problems = []
    for i, entry in enumerate(document.steps):
        name = entry.get("step")
        if name not in REGISTRY:
            node = locate_node(root, ("steps", i, "step"))
            line = f":{node.start_mark.line + 1}" if node is not None else ""
            problems.append(
                f"  {path}{line}: steps[{i}].step: unknown step {name!r}; expected one of {', '.join(REGISTRY)}"
            )
            continue
        try:
            settings = REGISTRY[name].Settings.model_validate(entry)
        except ValidationError as exc:
            text = format_validation_error(path, exc, locate_node(root, ("steps", i)), entry)
            problems.extend(
                line.replace(": ", f": steps[{i}] ({name}).", 1) if line.startswith("  ") else line
                for line in text.splitlines()[1:]
            )
            continue
        steps.append(PlannedStep(name, settings))
    if problems:
        raise ConfigError(f"{path}: invalid playbook ({len(problems)} problem(s))\n" + "\n".join(problems))
    return Playbook(document.name, document.description, path, tuple(steps))


def dump_playbook(playbook: Playbook) -> str:
    return yaml.safe_dump({"name": playbook.name, "steps": [s.settings.model_dump() for s in playbook.steps]})
