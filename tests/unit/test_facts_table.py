"""Every fact against captured host output (pyinfra's habit): tests/facts/<fact>/<case>.json.

A case holds the product's command, what it printed for real (tests/facts/capture.py ran it) and
what it must parse to ("fact": the fields given must match) or the error it must raise ("error": a
fragment of the message). Adding a case is adding a file.
"""

from __future__ import annotations

import json
import shlex
import re
from pathlib import Path

import pytest

from deploy.base.errors import DeployError
from deploy.facts import bench, fixer, fuser, gpus, helpers, host_helper, status

CASES = Path(__file__).resolve().parents[1] / "facts"
SOURCE = "gpu-a"


def _model(value):
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _gpu_rows(c):
    gpus.check_nvidia_smi(c["exit_code"], c["stdout"], c["stderr"], SOURCE)
    return {"gpus": [r.to_dict() for r in gpus.parse_gpu_rows(c["stdout"], c["expected_gpus"], source=SOURCE)]}


def _compute_apps(c):
    gpus.check_nvidia_smi(c["exit_code"], c["stdout"], c["stderr"], SOURCE)
    return {"apps": [a.model_dump() for a in gpus.parse_compute_apps(c["stdout"], source=SOURCE)]}


def _gpu_status(c):
    tag = re.search(r"deployctl-gpu-status-([0-9a-f]+) gpus", c["command"])
    assert tag is not None and c["command"] == gpus.gpu_status_command(tag[1]), "not the product's command"
    return gpus.parse_gpu_status(c["exit_code"], c["stdout"], c["stderr"], tag[1], c["expected_gpus"], SOURCE)


def _status(c):
    fact = status.parse_status(c["exit_code"], c["stdout"], c["stderr"], SOURCE)
    return fact.model_dump(mode="json") | {f"live_{k}": v for k, v in fact.live.model_dump(mode="json").items()}


#: fact directory -> (exit_code, stdout, stderr) -> the parsed fact
PARSERS = {
    "fuser_kill": lambda c: fuser.parse_kill_result(c["exit_code"], c["stdout"], c["stderr"], SOURCE, "/dev/nvidia*"),
    "helper_state": lambda c: helpers.parse_helper_state(c["exit_code"], c["stdout"], c["stderr"],
                                                         shlex.split(c["command"])[0], ["host_ops.py", "fixer.pyz"],
                                                         SOURCE),
    "stop_processes": lambda c: host_helper.parse_stop_report(c["stdout"], SOURCE),
    "probe": lambda c: host_helper.parse_probe(c["stdout"], SOURCE),
    "accept_check": lambda c: host_helper.parse_accept_check(c["stdout"], SOURCE),
    "fixer_summary": lambda c: fixer.parse_fixer_summary(c["exit_code"], c["stdout"], c["stderr"], SOURCE),
    "sglang_version": lambda c: fixer.parse_sglang_version(c["exit_code"], c["stdout"], c["stderr"], SOURCE),
    "nvidia_smi_gpus": _gpu_rows,
    "nvidia_smi_apps": _compute_apps,
    "gpu_status": _gpu_status,
    "bench_serving": lambda c: bench.parse_bench_result(c["stdout"], source=SOURCE),
    "status": _status,
}

#: facts whose command prints free text before the part parsed (bench_serving's preamble): noise goes inside
FREE_PREAMBLE = {"bench_serving"}

CASE_FILES = sorted(p for d in PARSERS for p in (CASES / d).glob("*.json"))


def test_every_fact_has_captured_cases():
    assert {p.parent.name for p in CASE_FILES} == set(PARSERS)


@pytest.mark.parametrize("path", CASE_FILES, ids=[f"{p.parent.name}/{p.stem}" for p in CASE_FILES])
def test_captured_output_parses_to_the_expected_fact(path):
    case = json.loads(path.read_text())
    parse = PARSERS[path.parent.name]
    if "error" in case:
        with pytest.raises(DeployError) as exc:
            parse(case)
        assert case["error"] in str(exc.value) and SOURCE in str(exc.value)
        return
    fact = _model(parse(case))
    assert {k: fact[k] for k in case["fact"]} == case["fact"]


def _has_output_to_garble(path) -> bool:
    case = json.loads(path.read_text())
    return "error" not in case and bool(case["stdout"].strip())


#: the captured cases that parse to a fact from some output (an error case or no output has none to garble)
GARBLE_FILES = [p for p in CASE_FILES if _has_output_to_garble(p)]


@pytest.mark.parametrize("path", GARBLE_FILES, ids=[f"{p.parent.name}/{p.stem}" for p in GARBLE_FILES])
def test_cut_or_garbled_output_is_never_a_fact(path):
    """The same captured output cut in half, or with a line of noise in front, is an error or a
    different fact, never silently the same one (strict parsers)."""
    case = json.loads(path.read_text())
    parse = PARSERS[path.parent.name]
    noisy = "Warning: something\n" + case["stdout"]
    if path.parent.name in FREE_PREAMBLE:
        noisy = re.sub(r"(Serving Benchmark Result =+\s*\n)", r"\1a line that is not a row\n", case["stdout"], count=1)
    for garbled in (case["stdout"][: len(case["stdout"]) // 2], noisy):
        try:
            fact = _model(parse(case | {"stdout": garbled}))
        except DeployError as exc:
            assert SOURCE in str(exc)
            continue
        assert {k: fact[k] for k in case["fact"]} != case["fact"], garbled[:80]
