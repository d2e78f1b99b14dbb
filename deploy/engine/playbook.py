"""Playbooks: ordered named steps with per-step settings, read from YAML and validated strictly."""

from __future__ import annotations

import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.config.loader import compose_yaml, compose_yaml_bytes, format_validation_error, locate_node
from deploy.base.errors import ConfigError, UsageError
from deploy.steps import REGISTRY
from deploy.steps.base import StepSettings

#: the top-level playbooks/ directory of the repository; the wheel ships it as the package data of
#: `deploy.playbooks` (setup.py maps that package to playbooks/; they once were data-files that
#: `pip install .` left out), read with importlib.resources.
BUILTIN = ("up", "restart", "down", "bench", "nightly")
#: playbooks/ next to the package in a source checkout (and an editable install, whose finder maps
#: only packages with an __init__.py, so `deploy.playbooks` is not importable there)
_SOURCE_PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


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
        """A copy with settings changed on every step called ``step`` (CLI overrides).

        Validated like the playbook file itself (model_copy would skip it: a NaN threshold from a
        flag would pass every comparison); a bad value is a usage error naming the step and setting.
        """
        def changed(settings: StepSettings) -> StepSettings:
            try:
                return type(settings).model_validate({**settings.model_dump(), **updates})
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                raise UsageError(f"playbook {self.name!r}, step {step!r}: {problems}") from None

        steps = tuple(PlannedStep(s.name, changed(s.settings)) if s.name == step else s for s in self.steps)
        return Playbook(self.name, self.description, self.path, tuple(_control_measures_the_benchmark_load(list(steps))))


def builtin_playbook(name: str):
    """The packaged playbook ``name`` (an importlib.resources Traversable), or None."""
    if name not in BUILTIN:
        return None
    try:
        shipped = importlib.resources.files("deploy.playbooks") / f"{name}.yaml"
    except ModuleNotFoundError:  # a source checkout: no deploy.playbooks package, playbooks/ beside deploy/
        return _SOURCE_PLAYBOOKS / f"{name}.yaml"
    return shipped if shipped.is_file() else _SOURCE_PLAYBOOKS / f"{name}.yaml"


def find_playbook(name_or_path: str):
    """A Path for a file or a $DEPLOYCTL_PLAYBOOKS playbook, else the packaged resource."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not candidate.is_file():
            raise ConfigError(f"{candidate}: playbook file not found")
        return candidate
    override = os.environ.get("DEPLOYCTL_PLAYBOOKS")
    if override and (Path(override) / f"{name_or_path}.yaml").is_file():
        return Path(override) / f"{name_or_path}.yaml"
    resource = builtin_playbook(name_or_path)
    if resource is not None and resource.is_file():
        return resource
    where = f"$DEPLOYCTL_PLAYBOOKS ({override}) or " if override else ""
    raise ConfigError(
        f"playbook {name_or_path!r} not found in {where}the built-in playbooks ({', '.join(BUILTIN)}); "
        "pass a YAML file with --playbook FILE"
    )


def load_playbook(name_or_path: str) -> Playbook:
    found = find_playbook(name_or_path)
    if isinstance(found, Path):
        path = found
        root, data = compose_yaml(path)
    else:
        path = Path(str(found))
        root, data = compose_yaml_bytes(found.read_bytes(), str(found))
    try:
        document = _PlaybookFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc, root, data)) from None
    steps = []
    problems = []
    for i, entry in enumerate(document.steps):
        name = entry.get("step")
        if not isinstance(name, str) or name not in REGISTRY:
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
    return Playbook(document.name, document.description, path,
                    tuple(_control_measures_the_benchmark_load(_doctor_knows_whose_holders_die(
                        _doctor_knows_the_wait(steps)))))


#: what the benchmark's throughput depends on: same-night-control measures with exactly these (issue 39)
LOAD_SETTINGS = ("num_prompts", "input_len", "output_len", "max_concurrency", "dataset", "rounds")


def _control_measures_the_benchmark_load(steps: list[PlannedStep]) -> list[PlannedStep]:
    """same-night-control benchmarks the last good deployment with the benchmark step's own load (its
    prompts, lengths, concurrency, dataset and rounds, ``--dataset`` included): a control under another
    load would compare nothing. Without a benchmark step it controls nothing and is disabled."""
    bench = next((s for s in steps if s.name == "benchmark" and s.settings.enabled), None)
    out = []
    for s in steps:
        if s.name == "same-night-control":
            update = {key: getattr(bench.settings, key) for key in LOAD_SETTINGS} if bench is not None else \
                {"enabled": False}
            s = PlannedStep(s.name, s.settings.model_copy(update=update))
        out.append(s)
    return out


def _doctor_knows_the_wait(steps: list[PlannedStep]) -> list[PlannedStep]:
    """The doctor judges the GPU memory the stop leaves against the playbook's own wait-gpus-free
    threshold (unless the doctor's gpu_threshold_mib says otherwise)."""
    wait = next((s for s in steps if s.name == "wait-gpus-free" and s.settings.enabled), None)
    if wait is None:
        return steps
    threshold = getattr(wait.settings, "threshold_mib", 0)
    return [PlannedStep(s.name, s.settings.model_copy(update={"gpu_threshold_mib": threshold}))
            if s.name == "doctor" and getattr(s.settings, "gpu_threshold_mib", 0) is None else s for s in steps]


def _doctor_knows_whose_holders_die(steps: list[PlannedStep]) -> list[PlannedStep]:
    """The doctor names the GPU holders free-gpus would kill: only the deploy user's, unless free-gpus'
    ``kill_other_users`` says otherwise (issue 39)."""
    free = next((s for s in steps if s.name == "free-gpus" and s.settings.enabled), None)
    if free is None or not getattr(free.settings, "kill_other_users", False):
        return steps
    return [PlannedStep(s.name, s.settings.model_copy(update={"kill_other_users": True})) if s.name == "doctor" else s
            for s in steps]
