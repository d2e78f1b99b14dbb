"""Round 3 (issue 31): the launch environment is checked before anything is stopped.

A run's ``env`` is written literally (quoted) into the launch's env file: a value that looks like a
shell expansion is refused at config load naming the field; the doctor runs the launch script's
own preamble lookup under the run's env without starting anything.
"""

from __future__ import annotations

import os
import sys

import pytest

from deploy.cli.main import main
from deploy.config.models import Run, shell_expansion
from deploy.remote import doctor_facts
from tests.hostile.test_config_corpus import BASE, dump
from tests.hostile.tree import assert_clean_failure, tree_state

EXPANSIONS = {
    "PATH": ("/usr/local/cuda/bin:$PATH", "$PATH"),
    "LD_LIBRARY_PATH": ("${CUDA_HOME}/lib64", "${"),
    "HF_HOME": ("~/hf", "~"),
    "PYTHONPATH": ("/opt/x:~/lib", ":~"),
    "SGLANG_OPT": ("$(cat /etc/flags)", "$("),
    "CUDA_VISIBLE_DEVICES": ("`nvidia-smi -L | wc -l`", "`"),
    "HOME_COPY": ("$HOME", "$HOME"),
}


@pytest.mark.parametrize("name", sorted(EXPANSIONS))
def test_an_env_value_that_looks_like_a_shell_expansion_is_exit_3_naming_the_field(tmp_path, capsys, name):
    value, found = EXPANSIONS[name]
    document = {**BASE, "runs": [dict(BASE["runs"][0], env={name: value})]}
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(document))
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "plan"])
    captured = capsys.readouterr()
    assert_clean_failure(code, 3, captured.out, captured.err, (f"env.{name}", "shell expansion", repr(found)),
                         before, tree_state(tmp_path))


@pytest.mark.parametrize("value", ["/usr/local/cuda/bin:/usr/bin:/bin", "a~b", "price$", "100%", "x=$", "/opt/~x",
                                   "0.5", ""])
def test_literal_values_stay_accepted(value):
    assert shell_expansion(value) is None
    Run(name="r", hosts=["h"], base_model="/m", drafter="/d", env={"V": value})


def test_the_doctor_tries_the_launch_preamble_under_the_run_env(tmp_path):
    # the literal "$PATH" left the launch unable to find its own commands
    facts = doctor_facts.launch_env({"env": {"PATH": "/usr/local/cuda/bin:$PATH"},
                                     "commands": ["setsid", "nohup", "python3"]})
    assert facts == {"names": ["PATH"], "missing": ["setsid", "nohup", "python3"], "error": None}
    ok = doctor_facts.launch_env({"env": {"PATH": os.environ["PATH"]}, "commands": ["setsid", "nohup", sys.executable]})
    assert ok["missing"] == [] and ok["error"] is None
    # nothing was started: only the shell's own lookup ran
    marker = tmp_path / "started"
    facts = doctor_facts.launch_env({"env": {}, "commands": [f"touch {marker}"]})
    assert facts["missing"] == [f"touch {marker}"] and not marker.exists()


def test_the_launch_env_check_fails_before_the_stop_and_names_what_is_missing():
    from types import SimpleNamespace

    from deploy.doctor.checks import check_launch_env
    from deploy.facts.doctor import LaunchEnvFacts

    run = SimpleNamespace(sglang_python="/opt/venv/bin/python3")
    bad = SimpleNamespace(facts=SimpleNamespace(launch_env=LaunchEnvFacts(names=["PATH"], missing=["setsid"])), run=run)
    check = check_launch_env(bad)  # type: ignore[arg-type]
    assert check.status == "fail" and "setsid" in check.reason and "PATH" in check.reason
    good = SimpleNamespace(facts=SimpleNamespace(launch_env=LaunchEnvFacts(names=[], missing=[])), run=run)
    assert check_launch_env(good).status == "pass"  # type: ignore[arg-type]
