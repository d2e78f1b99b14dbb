"""YAML 1.1's other ways of writing a number, in every number field: each a clean error (exit 3).

PyYAML's SafeLoader reads ``port: 02222`` as octal (1170), ``0x8ae`` as hex, ``1_000`` as 1000 and
``37:02`` as base 60 (2222): a port or GPU count nobody wrote. Number fields take plain decimal only;
the message names file:line and the field. The cases are generated from the models' own fields
(config and every playbook step), so a number field added later is covered without a new line here.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from deploy.cli.main import main
from deploy.config.models import Host, Run, SSHSettings, accepts_number
from deploy.steps import REGISTRY
from tests.hostile.test_config_corpus import BASE, dump
from tests.hostile.cases import words_per_field
from tests.hostile.tree import assert_clean_failure, tree_state

#: each reads as a number in YAML 1.1 (checked below), none as the decimal digits it shows
LITERALS = ("02222", "010", "00", "-010", "0x10", "0x1f", "-0x2", "0b101", "1_000", "2_2", "37:02", "1:00:00",
            "1_0.5", "1:30.5", "+0x1")


def _fields(model):
    return [(name, info.annotation) for name, info in model.model_fields.items() if accepts_number(info.annotation)]


def _config_cases():
    """Every field of the config's models, every literal on the first field of each type (cases.py)."""
    where = {"ssh": (SSHSettings, ("ssh",)), "host": (Host, ("hosts", 0)), "run": (Run, ("runs", 0))}
    return [(f"{label}.{name}={word}", path, name, word) for label, (model, path) in where.items()
            for name, word in words_per_field(_fields(model), lambda _: LITERALS)]


CONFIG_CASES = _config_cases()


def _yaml_with(path: tuple, field: str, word: str) -> bytes:
    document = copy.deepcopy(BASE)
    cursor = document
    for part in path:
        cursor = cursor[part]
    cursor[field] = "__PLACEHOLDER__"
    return dump(document).replace(b"'__PLACEHOLDER__'", word.encode()).replace(b"__PLACEHOLDER__", word.encode())


@pytest.mark.parametrize("word", LITERALS)
def test_each_literal_is_a_number_in_yaml_1_1(word):
    value = yaml.safe_load(f"v: {word}")["v"]
    assert isinstance(value, (int, float)) and not isinstance(value, bool), (word, value)
    assert str(value) != word.lstrip("+")


@pytest.mark.parametrize("name,path,field,word", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_number_not_decimal(tmp_path, capsys, name, path, field, word):
    config = tmp_path / "deployctl.yaml"
    data = _yaml_with(path, field, word)
    config.write_bytes(data)
    line = next(i for i, text in enumerate(data.decode().splitlines(), 1) if f"{field}: {word}" in text)
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "plan"])
    captured = capsys.readouterr()
    assert_clean_failure(code, 3, captured.out, captured.err,
                         (f"deployctl.yaml:{line}", field, "decimal", repr(word)), before, tree_state(tmp_path))


def _step_cases():
    """Every number setting of every step; a third of the literals on the first setting of each type."""
    fields = [((step, name), annotation) for step, module in REGISTRY.items()
              for name, annotation in _fields(module.Settings) if name != "step"]
    return [(f"{step}.{name}={word}", step, name, word)
            for (step, name), word in words_per_field(fields, lambda _: LITERALS[::3])]


STEP_CASES = _step_cases()


@pytest.mark.parametrize("name,step,field,word", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_playbook_number_not_decimal(tmp_path, capsys, name, step, field, word):
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE))
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(f"name: mine\nsteps:\n  - step: {step}\n    {field}: {word}\n")
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "plan", str(playbook)])
    captured = capsys.readouterr()
    assert_clean_failure(code, 3, captured.out, captured.err, ("pb.yaml:4", field, "decimal"), before,
                         tree_state(tmp_path))


@pytest.mark.parametrize("word,expected", [("2222", 2222), ("+22", 22), ("0", 0)])
def test_decimal_still_reads(tmp_path, word, expected):
    from deploy.config.loader import load_config

    config = tmp_path / "deployctl.yaml"
    config.write_bytes(_yaml_with(("hosts", 0), "min_free_mib", word))
    assert load_config(config).hosts[0].min_free_mib == expected


def test_text_field_keeps_the_digits_as_written(tmp_path):
    """A text field given 0777 gets "0777", not "511"."""
    from deploy.config.loader import load_config

    document = copy.deepcopy(BASE)
    document["hosts"][0]["name"] = "__N__"
    document["hosts"][0]["groups"] = ["__N__"]
    document["runs"][0]["group"] = "__N__"
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(document).replace(b"__N__", b"0777"))
    assert load_config(config).hosts[0].name == "0777"


def test_cases_cover_every_number_field():
    where = {"ssh": SSHSettings, "host": Host, "run": Run}
    fields = {f"{label}.{name}" for label, model in where.items() for name, _ in _fields(model)}
    assert len(fields) >= 12 and {c[0].split("=")[0] for c in CONFIG_CASES} == fields
    assert {c[3] for c in CONFIG_CASES} == set(LITERALS)
    settings = {f"{step}.{name}" for step, module in REGISTRY.items() for name, _ in _fields(module.Settings)
                if name != "step"}
    assert len(settings) >= 20 and {c[0].split("=")[0] for c in STEP_CASES} == settings
    assert any(c[0].startswith("host.port=02222") for c in CONFIG_CASES)


def _nested_models(model, path: tuple, seen=()) -> list:
    """(model, path in BASE) of every Strict model nested in ``model``'s fields: the schema walked, so a
    nested number field added later (a router's, a timeout's) is covered without a line here."""
    import typing

    from deploy.config.models import Strict

    found = []
    for name, info in model.model_fields.items():
        for arg in [info.annotation, *typing.get_args(info.annotation)]:
            if isinstance(arg, type) and issubclass(arg, Strict) and arg not in seen:
                found.append((arg, path + (name,)))
                found += _nested_models(arg, path + (name,), seen + (arg,))
    return found


#: what a nested model needs in BASE to be valid at all
NESTED_BASE = {("runs", 0, "router"): {"host": "gpu-a"}, ("runs", 0, "timeouts"): {}}
#: what the run around a nested model needs (a canary needs a router)
NESTED_RUN = {("runs", 0, "rollout", "canary"): {"router": {"host": "gpu-a"}}}


def _nested_cases():
    models = [m for top, path in ((SSHSettings, ("ssh",)), (Host, ("hosts", 0)), (Run, ("runs", 0)))
              for m in _nested_models(top, path)]
    return [(f"{'.'.join(map(str, path))}.{name}={word}", path, name, word)
            for model, path in models for name, _ in _fields(model) for word in ("02222", "0x10", "37:02")]


NESTED_CASES = _nested_cases()


def test_the_schema_walk_reaches_the_router_port():
    assert any(path == ("runs", 0, "router") and field == "port" for _, path, field, _ in NESTED_CASES)


@pytest.mark.parametrize("name,path,field,word", NESTED_CASES, ids=[c[0] for c in NESTED_CASES])
def test_nested_config_number_not_decimal(tmp_path, capsys, name, path, field, word):
    document = copy.deepcopy(BASE)
    document["runs"][0].update(NESTED_RUN.get(path, {}))
    cursor = document
    for part in path[:-1]:
        cursor = cursor[part] if isinstance(part, int) else cursor.setdefault(part, {})
    cursor[path[-1]] = dict(NESTED_BASE.get(path, {}), **{field: "__PLACEHOLDER__"})
    data = dump(document).replace(b"'__PLACEHOLDER__'", word.encode()).replace(b"__PLACEHOLDER__", word.encode())
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(data)
    line = next(i for i, text in enumerate(data.decode().splitlines(), 1) if f"{field}: {word}" in text)
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "plan"])
    captured = capsys.readouterr()
    assert_clean_failure(code, 3, captured.out, captured.err,
                         (f"deployctl.yaml:{line}", field, "decimal", repr(word)), before, tree_state(tmp_path))
