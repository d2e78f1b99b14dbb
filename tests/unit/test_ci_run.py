""".ci/run's handling of outcomes, over stand-in bootstrap/python scripts in a copy of the tree:
every failure (bootstrap, pytest's exit codes, mypy) fails CI, both checks report, and the
sandbox tests are required there (a skip would hide that they never ran)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_ci(tmp_path: Path, bootstrap: int, pytest_rc: int, mypy: int, make_venv: bool = True):
    shutil.copytree(REPO / ".ci", tmp_path / ".ci")
    (tmp_path / "tests").mkdir()
    log = tmp_path / "calls.log"
    venv = "mkdir -p .venv/bin && cp python-stub .venv/bin/python\n" if make_venv else ""
    (tmp_path / "tests" / "bootstrap.sh").write_text(f"echo bootstrap >> {log}\n{venv}exit {bootstrap}\n")
    stub = tmp_path / "python-stub"
    stub.write_text(f"#!/bin/sh\necho \"$* require=$DEPLOYCTL_TEST_REQUIRE_SANDBOX\" >> {log}\n"
                    f"case \"$2\" in pytest) exit {pytest_rc};; mypy) exit {mypy};; esac\nexit 99\n")
    stub.chmod(0o755)
    done = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done.returncode, calls


@pytest.mark.parametrize("pytest_rc", [1, 2, 3, 4, 5])
def test_a_failing_pytest_fails_ci_and_mypy_still_reports(tmp_path, pytest_rc):
    code, calls = run_ci(tmp_path, 0, pytest_rc, 0)
    assert code == pytest_rc
    assert calls == ["bootstrap", "-m pytest -q require=1", "-m mypy require=1"]


def test_everything_passing_passes(tmp_path):
    assert run_ci(tmp_path, 0, 0, 0) == (0, ["bootstrap", "-m pytest -q require=1", "-m mypy require=1"])


def test_a_failing_mypy_fails_ci(tmp_path):
    assert run_ci(tmp_path, 0, 0, 1)[0] == 1


def test_a_failing_bootstrap_fails_ci_even_when_mypy_passes(tmp_path):
    # `bootstrap && pytest` under set -e would not stop here: the failure is left of the &&
    assert run_ci(tmp_path, 1, 0, 0) == (1, ["bootstrap", "-m mypy require=1"])


def test_a_bootstrap_that_made_no_venv_fails_ci_with_its_own_code(tmp_path):
    assert run_ci(tmp_path, 7, 0, 0, make_venv=False) == (7, ["bootstrap"])
