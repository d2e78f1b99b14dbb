"""A wheel install (not editable) works: every verb's --help, and `plan` with every built-in playbook.

`pip install .` once shipped without playbooks/bench.yaml (`deployctl bench`: "playbook 'bench' not
found"). The wheel is built from a copy of the tracked files, installed with --no-deps --no-index
into a fresh virtual environment whose only other path is the dev environment's site-packages for
the dependencies (fabric, paramiko, ...; no network). Commands run outside the checkout, so
nothing can come from the source tree.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from deploy.engine.playbook import BUILTIN

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git is needed to list the tracked files")
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if not (REPO / name).is_file():
            continue
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, src / name)
    for name in ("playbooks/up.yaml", "playbooks/bench.yaml", "setup.py"):
        assert (src / name).is_file(), name
    dist = root / "dist"
    # isolated build: pip fetches setuptools and wheel from the configured index, as `pip install .` does
    # -v: the build backend's own warnings, kept for test_the_build_ignores_no_package
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(dist), str(src)],
                           timeout=600, capture_output=True, text=True)
    (root / "build.log").write_text(built.stdout + built.stderr)
    if built.returncode != 0 and "Could not find a version that satisfies" in built.stderr:
        pytest.skip("no package index reachable for the build backend (setuptools, wheel)")
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(dist.glob("deployctl-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(glob.glob(str(venv / "lib" / "python*" / "site-packages"))[0])
    (site / "dev-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, timeout=300, capture_output=True)
    work = root / "work"
    work.mkdir()
    (work / "deployctl.yaml").write_text((REPO / "configs" / "two-hosts.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEPLOYCTL_PLAYBOOKS", "DEPLOYCTL_CONFIG")}
    return venv, work, env


def _run(installed, *argv):
    venv, work, env = installed
    return subprocess.run([str(venv / "bin" / "deployctl"), *argv], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)


def _run_together(installed, argvs: dict) -> dict:
    """Each argv a run of the installed console script, all started at once (one at a time they
    were most of this file's time after the build); bounded like _run."""
    venv, work, env = installed
    procs = {key: subprocess.Popen([str(venv / "bin" / "deployctl"), *argv], cwd=work, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for key, argv in argvs.items()}
    results = {}
    for key, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        results[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    venv, work, env = installed
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import deploy; print(deploy.__file__)"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(venv)), out.stdout


def test_the_builtin_playbooks_come_from_the_wheel(installed):
    """playbooks/ at the top of the clone is shipped as deploy.playbooks; the installed deployctl
    reads it from there (the checkout's playbooks/ is not next to the installed package)."""
    venv, work, env = installed
    code = "from deploy.engine.playbook import BUILTIN, builtin_playbook; print(*(builtin_playbook(n) for n in BUILTIN))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=work, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    paths = out.stdout.split()
    assert len(paths) == len(BUILTIN) and all(p.startswith(str(venv)) and "/deploy/playbooks/" in p for p in paths), paths
    assert all(Path(p).is_file() for p in paths), paths


def test_every_verb_has_help(installed):
    from deploy.cli.main import cli

    verbs = sorted(cli.commands)
    assert {"up", "restart", "down", "plan", "logs", "bench", "gpu-status", "fix-keys"} <= set(verbs)
    results = _run_together(installed, {verb: [*([verb] if verb else []), "--help"] for verb in [None, *verbs]})
    for verb, result in results.items():
        assert result.returncode == 0, (verb, result.stderr)
        assert "Traceback" not in result.stderr
        assert "usage" in (result.stdout + result.stderr).lower(), verb


@pytest.fixture(scope="module")
def plans(installed):
    """`deployctl plan NAME` for every built-in playbook, each its own run of the installed script."""
    return _run_together(installed, {name: ["plan", name] for name in BUILTIN})


@pytest.mark.parametrize("playbook", BUILTIN)
def test_plan_with_every_builtin_playbook(plans, playbook):
    result = plans[playbook]
    assert result.returncode == 0, result.stderr
    assert f"{playbook} on h200-a" in result.stdout or "on h200-a" in result.stdout
    assert "Traceback" not in result.stderr


def test_the_sandbox_test_double_is_not_in_the_wheel(installed):
    """The simulated hosts and stand-in SGLang live in sandbox/ at the top of the clone; the
    wheel has only the deploy package, and no product verb reaches the sandbox."""
    venv, work, env = installed
    site = Path(glob.glob(str(venv / "lib" / "python*" / "site-packages"))[0])
    shipped = [p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()]
    # no stand-in: nothing of sandbox/, no simulator, no sglang package outside deploy/ that would shadow the
    # real one (deploy/'s own modules about SGLang are pure rules and readers of its source)
    assert [p for p in shipped if "sandbox" in p or "sim_" in p
            or ("sglang" in p and not p.startswith(("deploy/", "deployctl-")))] == []
    assert any(p.startswith("deploy/") for p in shipped)
    code = "import importlib.util as u; print(u.find_spec('sandbox'), u.find_spec('deploy.sandbox'))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=work, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["None", "None"], out.stdout + out.stderr
    assert _run(installed, "sandbox", "--help").returncode != 0


def test_the_builtin_prompt_set_ships_in_the_wheel(installed):
    """bench and verify-acceptance read deploy/data/prompts.json as package data."""
    from deploy.local import datasets

    result = _run(installed, "plan", "bench")
    assert result.returncode == 0, result.stderr
    assert f"datasets/{datasets.builtin().sha256}.json" in result.stdout


def test_the_build_ignores_no_package(installed):
    """Issue 27: setuptools warned that deploy.data (the prompt set, no __init__.py) "would be ignored"."""
    _, work, _ = installed
    log = (work.parent / "build.log").read_text()
    assert "would be ignored" not in log and "is absent from the `packages` configuration" not in log, log[-3000:]


def test_the_wheel_ships_the_license(installed):
    """Issue 42: the wheel's metadata says Apache-2.0 and carries the LICENSE text (PEP 639's
    dist-info/licenses/)."""
    venv, _, _ = installed
    site = Path(glob.glob(str(venv / "lib" / "python*" / "site-packages"))[0])
    [info] = site.glob("deployctl-*.dist-info")
    metadata = (info / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata.splitlines(), metadata[:2000]
    assert "License-File: LICENSE" in metadata.splitlines()
    assert (info / "licenses" / "LICENSE").read_text() == (REPO / "LICENSE").read_text()
