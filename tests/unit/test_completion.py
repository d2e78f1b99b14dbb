"""Issue 42: shell completion, as the README documents it (click's own: ``_DEPLOYCTL_COMPLETE``),
prints a script from the installed ``deployctl``, and bash completes a verb with it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
#: the console script of the environment running the tests (.venv/bin/deployctl)
DEPLOYCTL = Path(sys.executable).parent / "deployctl"


def documented() -> str:
    """The completion line of the README's command block: eval "$(_DEPLOYCTL_COMPLETE=bash_source deployctl)"."""
    [line] = re.findall(r'^\s*(eval "\$\(_DEPLOYCTL_COMPLETE=bash_source deployctl\)")', README, re.M)
    return line


def _script(shell: str) -> subprocess.CompletedProcess:
    if not DEPLOYCTL.is_file():
        pytest.skip(f"no console script at {DEPLOYCTL} (deployctl is not installed in this environment)")
    env = {k: v for k, v in os.environ.items() if k != "DEPLOYCTL_CONFIG"} | {"_DEPLOYCTL_COMPLETE": f"{shell}_source"}
    return subprocess.run([str(DEPLOYCTL)], env=env, capture_output=True, text=True, timeout=60)


def test_the_readme_documents_completion_in_its_command_block():
    block = next(b for b in re.findall(r"```sh\n(.*?)```", README, re.S) if "deployctl doctor" in b)
    assert documented() in block


@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F _deployctl_completion deployctl"),
                                           ("zsh", "#compdef deployctl"),
                                           ("fish", "complete --no-files --command deployctl")])
def test_the_documented_variable_prints_a_completion_script(shell, marker):
    documented()
    out = _script(shell)
    assert out.returncode == 0, out.stderr
    assert marker in out.stdout and "_DEPLOYCTL_COMPLETE" in out.stdout
    assert out.stderr == ""


def test_bash_completes_a_verb_and_an_option_with_it():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    line = documented()
    program = (f"{line}\n"
               "COMP_WORDS=(deployctl gpu); COMP_CWORD=1; COMPREPLY=(); _deployctl_completion deployctl; "
               "echo \"${COMPREPLY[*]}\"\n"
               "COMP_WORDS=(deployctl logs --js); COMP_CWORD=2; COMPREPLY=(); _deployctl_completion deployctl; "
               "echo \"${COMPREPLY[*]}\"\n")
    if not DEPLOYCTL.is_file():
        pytest.skip(f"no console script at {DEPLOYCTL}")
    env = os.environ | {"PATH": f"{DEPLOYCTL.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run([bash, "--norc", "--noprofile", "-c", program], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["gpu-status", "--json"], out.stdout + out.stderr
