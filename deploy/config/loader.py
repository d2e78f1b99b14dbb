"""Read a deployctl YAML file into a validated Config, with errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import re

import yaml
from pydantic import BaseModel, ValidationError

from deploy.config.models import Config, NonDecimalNumber
from deploy.base.errors import ConfigError
from deploy.base.limits import MAX_YAML_BYTES, MAX_YAML_DEPTH, InputTooLarge, check_yaml_graph, read_bounded


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML keeps the last one silently)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"found a {type(key).__name__} as a key (expected a name)", key_node.start_mark,
            ) from None
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

#: what a number field accepts: decimal digits, optionally signed (no leading zero, 0x, 0b, _ or :)
_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")


def _construct_int(loader: _StrictLoader, node: yaml.ScalarNode):
    # YAML 1.1 (PyYAML) reads 02222 as octal, 0x.. as hex, 1_000 as 1000 and 37:02 as base 60;
    # the text is kept so a number field can refuse it by name (models.NonDecimalNumber).
    text = loader.construct_scalar(node)
    if _DECIMAL_INT.fullmatch(text):
        return int(text)
    return NonDecimalNumber(text)


def _construct_float(loader: _StrictLoader, node: yaml.ScalarNode):
    text = loader.construct_scalar(node)
    if _DECIMAL_FLOAT.fullmatch(text):
        return yaml.SafeLoader.construct_yaml_float(loader, node)
    return NonDecimalNumber(text)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


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


def compose_yaml(path: Path) -> tuple[yaml.Node | None, Any]:
    """Read ``path`` within the size limit and compose it; every failure is a ConfigError."""
    try:
        raw = read_bounded(path, MAX_YAML_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except InputTooLarge as exc:
        raise ConfigError(f"{path}: refused: {exc} (a deployctl YAML file is a few KB)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return compose_yaml_bytes(raw, str(path))


def compose_yaml_bytes(raw: bytes, display: str) -> tuple[yaml.Node | None, Any]:
    """Compose and construct YAML bytes with the depth, size and alias limits (ConfigError)."""
    if len(raw) > MAX_YAML_BYTES:
        raise ConfigError(f"{display}: refused: {len(raw)} bytes, over the limit of {MAX_YAML_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{display}: not UTF-8 text (byte {exc.start}): is this a YAML file?") from None
    if "\x00" in text:
        raise ConfigError(f"{display}: contains a NUL byte: is this a YAML file?")
    try:
        # PyYAML's Reader checks every character when it is made (a control character such as ESC
        # raised ReaderError from here: "internal error", exit 1, before 2026-12-07)
        loader = _StrictLoader(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(f"{display}:{line}: not valid YAML: unacceptable character #x{exc.character:04x}: "
                          f"{exc.reason}") from None
    try:
        root = loader.get_single_node()
        check_yaml_graph(root)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{display}:{mark.line + 1}" if mark else display
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{where}: not valid YAML: {problem}") from None
    except InputTooLarge as exc:
        raise ConfigError(f"{display}: refused: {exc}") from None
    except RecursionError:
        # PyYAML's composer recurses once per nesting level; the graph check never sees it.
        raise ConfigError(
            f"{display}: refused: nested more than {MAX_YAML_DEPTH} levels deep (the parser ran out of stack)"
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(f"{display}: expected a YAML mapping at the top level, got {type(data).__name__}")
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
    return resolve_local_paths(config, path)


def resolve_local_paths(config: Config, path: Path) -> Config:
    """Relative local paths (known_hosts, identity files) are relative to the config file's directory.

    Not to the current directory: cron and systemd start deployctl elsewhere, and a relative
    known_hosts resolved against the wrong directory is a missing file (every host refused) or,
    worse with accept-new, a new file that trusts whatever key answers.
    """
    base = path.resolve().parent

    def anchored(value: str) -> str:
        if value.startswith("~") or value.startswith("/"):
            return value
        return str(base / value)

    # Only a value the YAML wrote: model_copy(update=) marks the field as set, and a set
    # known_hosts wins over ssh_config's UserKnownHostsFile (deploy/ssh/config.py).
    ssh = config.ssh
    if "known_hosts" in ssh.model_fields_set:
        ssh = ssh.model_copy(update={"known_hosts": anchored(ssh.known_hosts)})
    hosts = [h.model_copy(update={"identity_file": anchored(h.identity_file)}) if h.identity_file else h
             for h in config.hosts]
    return config.model_copy(update={"ssh": ssh, "hosts": hosts})
