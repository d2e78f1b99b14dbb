"""Read a deployctl YAML file into a validated Config, with errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from deploy.config.models import Config
from deploy.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def locate_node(node: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The deepest YAML node along a pydantic error location, for its line number."""
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == part:
                    node = value_node
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return node
            node = node.value[part]
        else:
            return node
    return node


def _key_line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Line of an unknown key itself (pydantic's loc ends with the offending key)."""
    parent = locate_node(node, loc[:-1])
    if isinstance(parent, yaml.MappingNode):
        for key_node, _ in parent.value:
            if key_node.value == loc[-1]:
                return key_node.start_mark.line + 1
    target = locate_node(node, loc)
    return target.start_mark.line + 1 if target is not None else None


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    parts: list[str] = []
    cursor = data
    for part in loc:
        if isinstance(part, int):
            label = ""
            if isinstance(cursor, list) and part < len(cursor):
                item = cursor[part]
                if isinstance(item, dict) and isinstance(item.get("name"), str):
                    label = f" ({item['name']})"
                cursor = item
            else:
                cursor = None
            parts.append(f"[{part}]{label}")
        else:
            cursor = cursor.get(part) if isinstance(cursor, dict) else None
            parts.append(("." if parts else "") + str(part))
    return "".join(parts) or "(top level)"


def format_validation_error(path: Path, err: ValidationError, root: yaml.Node | None, data: Any) -> str:
    lines = [f"{path}: invalid configuration ({err.error_count()} problem(s))"]
    for item in err.errors():
        loc = tuple(p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        if item["type"] == "extra_forbidden":
            line = _key_line(root, loc)
            msg = "unknown key (not a setting deployctl knows; check the spelling)"
        else:
            target = locate_node(root, loc)
            line = target.start_mark.line + 1 if target is not None else None
            msg = item["msg"].removeprefix("Value error, ")
            if item["type"] == "missing":
                msg = "required field is missing"
        where = f"{path}:{line}" if line else str(path)
        lines.append(f"  {where}: {_field_path(loc, data)}: {msg}")
    return "\n".join(lines)


def parse_yaml(path: Path, model: type[BaseModel]) -> BaseModel:
    """Parse ``path`` as YAML and validate it into ``model``; every failure is a ConfigError."""
    root, data = compose_yaml(path)
    return _validate(path, model, root, data)


def compose_yaml(path: Path) -> tuple[yaml.Node | None, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        root = yaml.compose(text, Loader=_StrictLoader)
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return root, data


def _validate(path: Path, model: type[BaseModel], root: yaml.Node | None, data: Any) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc, root, data)) from None


def load_config(path: str | Path) -> Config:
    path = Path(path)
    text_root, data = compose_yaml(path)
    config = _validate(path, Config, text_root, data)
    assert isinstance(config, Config)
    problems = config.reference_problems()
    if problems:
        lines = [f"{path}: invalid configuration ({len(problems)} problem(s))"]
        for loc, msg in problems:
            node = locate_node(text_root, loc)
            where = f"{path}:{node.start_mark.line + 1}" if node is not None else str(path)
            lines.append(f"  {where}: {_field_path(loc, data)}: {msg}")
        raise ConfigError("\n".join(lines))
    return config
