"""YAML's other scalars in number fields: every one a clean error (exit 3 in files, 2 on the command line).

YAML reads ``yes``/``no``/``on``/``off``/``true``/``false`` as booleans, and pydantic's lax mode turns
True into 1 (``gpus: yes`` deployed on one GPU, ``port: on`` dialled port 1); ``.nan`` and ``.inf`` pass
every range check that compares with them. The cases are generated from the models themselves, so a
field added later is covered without a new line here.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from deploy.cli.main import main
from deploy.config.models import Host, Run, SSHSettings, accepts_bool
from deploy.steps import REGISTRY
from tests.hostile.test_config_corpus import BASE, dump
from tests.hostile.cases import words_per_field
from tests.hostile.tree import assert_clean_failure, tree_state

BOOLEAN_WORDS = ("yes", "no", "on", "off", "true", "false")
NON_FINITE = (".nan", ".inf", "-.inf")


def _is_float(annotation) -> bool:
    return "float" in repr(annotation)


def _fields(model):
    return [(name, info.annotation) for name, info in model.model_fields.items()]


def _words(annotation) -> tuple[str, ...]:
    if accepts_bool(annotation):
        return ()
    return BOOLEAN_WORDS + (NON_FINITE if _is_float(annotation) else ())


def _config_cases():
    """Every non-boolean field of the config's models, every word on the first field of each type (cases.py)."""
    where = {"ssh": (SSHSettings, ("ssh",)), "host": (Host, ("hosts", 0)), "run": (Run, ("runs", 0))}
    return [(f"{label}.{name}={word}", path, name, word) for label, (model, path) in where.items()
            for name, word in words_per_field(_fields(model), _words)]


CONFIG_CASES = _config_cases()


def _yaml_with(path: tuple, field: str, word: str) -> bytes:
    document = copy.deepcopy(BASE)
    cursor = document
    for part in path:
        cursor = cursor[part]
    cursor[field] = "__PLACEHOLDER__"
    return dump(document).replace(b"'__PLACEHOLDER__'", word.encode()).replace(b"__PLACEHOLDER__", word.encode())


@pytest.mark.parametrize("name,path,field,word", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_scalar_of_the_wrong_kind(tmp_path, capsys, name, path, field, word):
    data = _yaml_with(path, field, word)
    parsed = yaml.safe_load(data)  # the case really holds a boolean or a non-finite float
    cursor = parsed
    for part in path:
        cursor = cursor[part]
    assert isinstance(cursor[field], (bool, float))
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(data)
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "plan"])
    captured = capsys.readouterr()
    assert_clean_failure(code, 3, captured.out, captured.err, ("deployctl.yaml", field), before, tree_state(tmp_path))


def _step_words(annotation) -> tuple[str, ...]:
    if accepts_bool(annotation):
        return ()
    return BOOLEAN_WORDS[:2] + (NON_FINITE if _is_float(annotation) else ())


def _step_cases():
    """Every non-boolean setting of every step; two boolean words (and the non-finite ones for a
    float) on the first setting of each type (cases.py)."""
    fields = [((step, name), annotation) for step, module in REGISTRY.items()
              for name, annotation in _fields(module.Settings) if name != "step"]
    return [(f"{step}.{name}={word}", step, name, word)
            for (step, name), word in words_per_field(fields, _step_words)]


STEP_CASES = _step_cases()


@pytest.mark.parametrize("name,step,field,word", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_playbook_setting_of_the_wrong_kind(tmp_path, capsys, name, step, field, word):
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE))
    playbook = tmp_path / "pb.yaml"
    playbook.write_text(f"name: mine\nsteps:\n  - step: {step}\n    {field}: {word}\n")
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "plan", str(playbook)])
    captured = capsys.readouterr()
    assert_clean_failure(code, 3, captured.out, captured.err, ("pb.yaml", field), before, tree_state(tmp_path))


def test_cases_cover_numbers_of_every_model():
    where = {"ssh": SSHSettings, "host": Host, "run": Run}
    fields = {f"{label}.{name}" for label, model in where.items() for name, a in _fields(model) if _words(a)}
    assert len(fields) >= 20 and {c[0].split("=")[0] for c in CONFIG_CASES} == fields
    assert {c[3] for c in CONFIG_CASES} == set(BOOLEAN_WORDS + NON_FINITE)
    settings = {f"{step}.{name}" for step, module in REGISTRY.items() for name, a in _fields(module.Settings)
                if name != "step" and _step_words(a)}
    assert len(settings) >= 20 and {c[0].split("=")[0] for c in STEP_CASES} == settings
    assert any(c[0].startswith("host.gpus=") for c in CONFIG_CASES)
    assert any(c[0].startswith("host.port=") for c in CONFIG_CASES)


@pytest.mark.parametrize("flag", ["--min-accept-fraction", "--min-throughput-fraction"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_command_line_override_not_finite(tmp_path: Path, capsys, flag, value):
    """A flag that overrides a playbook setting is validated like the playbook (no host is contacted)."""
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE))
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "nightly", flag, value])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "Traceback" not in captured.out + captured.err
    assert flag.lstrip("-").replace("-", "_") in captured.err or "range" in captured.err
    assert tree_state(tmp_path) == before
