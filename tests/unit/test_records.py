"""The typed records (deploy/host/records.py, issue 37): records as deployctl's main wrote them are read, what
the host helpers write validates against the controller's models, and any other shape is refused naming
the file and the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy.base.errors import RemoteOutputError
from deploy.host import records
from deploy.host.records import (BenchMeasurement, CanaryMark, ControlMeasurement, DeploymentRecord, GateVerdict,
                                 LastGood, QuarantineRecord, record_of)

#: records as the main branch before issue 37 wrote them (no schema_version), one file each
ON_DISK = Path(__file__).resolve().parents[1] / "records"
MODEL_OF = {"deployment": DeploymentRecord, "last-good": LastGood, "quarantine": QuarantineRecord,
            "canary": CanaryMark}


def _valid() -> dict[type[records.Record], dict[str, Any]]:
    from deploy.local.same_night import judge

    rounds = [1000.0 + i for i in range(12)]
    bench = {"successful_requests": 16, "duration_s": 20.5, "output_tokens": 4096, "output_tok_s": 560.0,
             "output_tok_s_rounds": [560.0]}
    return {DeploymentRecord: {"argv": []}, LastGood: {"argv": []}, QuarantineRecord: {"entries": {}},
            BenchMeasurement: bench, ControlMeasurement: {"output_tok_s_rounds": rounds},
            GateVerdict: judge(rounds, rounds, 0.9).verdict().document(),
            CanaryMark: {"run": "r", "since": 10.0, "until": 670.0, "pid": 4242, "others": ["b"]}}


VALID = _valid()


def _model(path: Path) -> type[records.Record]:
    return MODEL_OF[path.name.split(".")[0]]


@pytest.mark.parametrize("path", sorted(ON_DISK.glob("*.json")), ids=lambda p: p.name)
def test_a_record_as_main_wrote_it_is_read_and_written_back_in_the_same_layout(path):
    document = json.loads(path.read_text())
    record = record_of(_model(path), document, f"kimi-a: {path.name}")
    assert record.schema_version == 1
    # the same keys and values, plus the version (the quarantine record's old "schema" key is its old spelling)
    written = record.document()
    assert written.pop("schema_version") == 1
    assert written == {k: v for k, v in document.items() if k != "schema"}


def test_every_record_has_a_valid_example_and_a_migration():
    assert set(VALID) == set(records.MIGRATIONS) == {m for m in vars(records).values()
                                                     if isinstance(m, type) and issubclass(m, records.Record)
                                                     and m is not records.Record}
    for model, document in VALID.items():
        assert record_of(model, document, "f").document()["schema_version"] == model.SCHEMA


def test_a_newer_schema_version_is_refused_naming_the_file():
    with pytest.raises(RemoteOutputError, match=r"kimi-a: ~/s/last-good.json: not a last good record: schema_version 2; "
                                                r"this deployctl reads schema_version 1"):
        record_of(LastGood, {"schema_version": 2, "argv": []}, "kimi-a: ~/s/last-good.json")


# -- generated bad shapes: each field of each record given a value of another type -------------------------


def _wrong(value: Any) -> list[Any]:
    """Values of another JSON type than ``value``'s (a string where a number was, ...)."""
    candidates = ["12", 12, 1.5, True, [], {}, None]
    return [c for c in candidates if type(c) is not type(value) and not (isinstance(value, float) and type(c) is int)]


def _cases():
    for path in sorted(ON_DISK.glob("*.json")):
        document = json.loads(path.read_text())
        model = _model(path)
        for key, value in document.items():
            for bad in _wrong(value):
                candidate = document | {key: bad}
                try:
                    model.model_validate(records.MIGRATIONS[model](candidate))
                except Exception:
                    yield pytest.param(model, candidate, key, id=f"{path.name}-{key}-{type(bad).__name__}")


@pytest.mark.parametrize("model, document, field", list(_cases()))
def test_a_field_of_another_type_is_refused_naming_the_file_and_the_field(model, document, field):
    with pytest.raises(RemoteOutputError) as refused:
        record_of(model, document, "kimi-a: ~/s/record.json")
    text = str(refused.value)
    if field == "schema":  # the quarantine record's old spelling of its version
        assert text.startswith(f"kimi-a: ~/s/record.json: not a {model.WHAT}: schema_version ")
    else:
        assert text.startswith(f"kimi-a: ~/s/record.json: not a {model.WHAT}: {field}")


@pytest.mark.parametrize("model", sorted(records.MIGRATIONS, key=lambda m: m.__name__))
def test_an_unknown_field_or_a_document_of_another_type_is_refused(model):
    with pytest.raises(RemoteOutputError, match=r"f: not a .*: surprise: Extra inputs are not permitted"):
        record_of(model, VALID[model] | {"surprise": 1}, "f")
    for other in ([], "x", None, 3):
        with pytest.raises(RemoteOutputError, match=r"^f: not a .*a JSON object expected"):
            record_of(model, other, "f")


def test_a_number_is_never_read_from_a_string():
    with pytest.raises(RemoteOutputError, match=r"metrics.draft_tokens: Input should be a valid integer"):
        record_of(LastGood, {"argv": [], "metrics": {"draft_tokens": "16"}}, "f")
    with pytest.raises(RemoteOutputError, match=r"entries.ab.exit_code"):
        record_of(QuarantineRecord, {"entries": {"ab": {"failed_at": "t", "exit_code": "11"}}}, "f")


# -- the host side writes what the controller reads ---------------------------------------------------------


def test_the_host_quarantine_helpers_record_validates_against_the_controllers_model(tmp_path):
    from deploy.facts import quarantine as facts

    entry = json.loads((ON_DISK / "quarantine.json").read_text())["entries"]["ab" * 32]
    proc = subprocess.run([sys.executable, "-c", facts.update_program(), facts.MARK, str(tmp_path / "q.json"), "add",
                           "ab" * 32, json.dumps(entry)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    document = json.loads((tmp_path / "q.json").read_text())
    assert document["schema_version"] == QuarantineRecord.SCHEMA
    assert record_of(QuarantineRecord, document, "q.json").entries["ab" * 32].exit_code == 11


def test_the_launch_scripts_record_with_its_pid_filled_in_validates(tmp_path):
    """The launch sends the record on stdin with a PID mark; the host's sed fills the PID in (steps/launch.py)."""
    from deploy.facts.server import PID_MARK, record_stdin

    record = json.loads((ON_DISK / "deployment.launch.json").read_text())
    sent = record_stdin({k: v for k, v in record.items() if k != "pid"}, "kimi-a", "the deployment record",
                        pid_mark=True)
    filled = subprocess.run(["sed", f's/"{PID_MARK}"/4242/g'], input=sent, capture_output=True, timeout=30).stdout
    assert record_of(DeploymentRecord, json.loads(filled), "deployment.json").pid == 4242
