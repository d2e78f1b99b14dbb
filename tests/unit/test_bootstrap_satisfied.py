"""tests/bootstrap_satisfied.py: when tests/bootstrap.sh may skip a pip call (every requirement met,
transitively, as pip decides it), over small installed trees written as *.dist-info directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "tests" / "bootstrap_satisfied.py"


def dist(site: Path, name: str, version: str, requires: tuple[str, ...] = (), direct_url: dict | None = None) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def check(site: Path, *args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, str(CHECK), "--path", str(site), *args], capture_output=True,
                          text=True, timeout=60)
    return done.returncode, done.stderr


def tree(site: Path) -> None:
    dist(site, "app", "1.0", ("lib>=2", "extra-only; extra == 'test'", "never; python_version < '3'"))
    dist(site, "lib", "2.5", ("base==1.*",))
    dist(site, "base", "1.4")


def test_a_tree_that_meets_everything_is_satisfied(tmp_path):
    tree(tmp_path)
    assert check(tmp_path, "app") == (0, "")
    assert check(tmp_path, "app>=1", "lib<3") == (0, "")


@pytest.mark.parametrize("change,expected", [
    (lambda s: None, "app[test]: not installed"),                           # the extra's requirement is missing
    (lambda s: dist(s, "extra-only", "0.1", ("gone",)), "gone: not installed"),  # ... and its own one
], ids=["extra", "extra-transitive"])
def test_an_extra_asks_for_its_own_requirements(tmp_path, change, expected):
    tree(tmp_path)
    change(tmp_path)
    code, err = check(tmp_path, "app[test]")
    assert code == 1 and expected.split(":")[-1].strip() in err, err


@pytest.mark.parametrize("requirement,broken,expected", [
    ("app", "base", "-> base==1.*: not installed"),   # a transitive requirement missing
    ("app", "lib", "-> lib>=2: not installed"),
    ("app==2", None, "app==2: 1.0 installed"),        # the wrong version at the top
    ("missing", None, "missing: not installed"),
])
def test_anything_missing_or_of_another_version_is_not_satisfied(tmp_path, requirement, broken, expected):
    tree(tmp_path)
    if broken:
        for info in tmp_path.glob(f"{broken}-*.dist-info"):
            (info / "METADATA").unlink()
            info.rmdir()
    code, err = check(tmp_path, requirement)
    assert code == 1 and expected in err, err


def test_a_transitive_version_conflict_is_not_satisfied(tmp_path):
    dist(tmp_path, "app", "1.0", ("lib>=2",))
    dist(tmp_path, "lib", "2.5", ("base==1.*",))
    dist(tmp_path, "base", "2.0")
    code, err = check(tmp_path, "app")
    assert code == 1 and "base==1.*: 2.0 installed" in err, err


def test_editable_only_from_this_directory(tmp_path):
    site, here = tmp_path / "site", tmp_path / "clone"
    here.mkdir()
    dist(site, "deployctl", "0.1.0", direct_url={"url": here.as_uri(), "dir_info": {"editable": True}})
    assert check(site, "--editable", f"deployctl={here}", "deployctl") == (0, "")
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    code, err = check(site, "--editable", f"deployctl={elsewhere}", "deployctl")
    assert code == 1 and "editable from" in err, err


@pytest.mark.parametrize("direct_url", [None, {"url": "file:///x", "dir_info": {}},
                                        {"url": "https://example.invalid/x.whl", "archive_info": {}}])
def test_a_plain_install_is_not_the_editable_one(tmp_path, direct_url):
    dist(tmp_path, "deployctl", "0.1.0", direct_url=direct_url)
    code, err = check(tmp_path, "--editable", "deployctl=/x", "deployctl")
    assert code == 1 and "not an editable install" in err, err


def test_metadata_it_cannot_parse_leaves_the_decision_to_pip(tmp_path):
    dist(tmp_path, "app", "1.0", ("lib >= >= 2",))
    code, err = check(tmp_path, "app")
    assert code == 1 and "cannot decide here" in err, err


def test_this_venv_is_what_bootstrap_installed():
    # the check the bootstrap runs for .venv, on the venv running these tests
    done = subprocess.run([sys.executable, str(CHECK), "--editable", f"deployctl={REPO}", "deployctl[test]"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
