"""Issue 27: pyproject's dependency floors are past the releases with published vulnerabilities, and
the resolver can satisfy them (the versions installed here meet every declared floor)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DECLARED = [Requirement(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]

#: the first fixed release of each advisory
FIXED = {
    "filelock": ("3.20.1", "CVE-2025-68146, UnixFileLock"),
    "paramiko": ("5.0.0", "CVE-2026-44405"),
    # paramiko's dependency, declared directly so the floor is ours (issue 42)
    "cryptography": ("48.0.1", "CVE-2026-26007, GHSA-537c-gmf6-5ccf"),
    "click": ("8.3.3", "CVE-2026-7246"),
}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_the_floor_excludes_the_vulnerable_releases(name):
    [requirement] = [r for r in DECLARED if r.name == name]
    fixed, advisory = FIXED[name]
    floors = [Version(s.version) for s in requirement.specifier if s.operator in (">=", "==", "~=")]
    assert floors and min(floors) >= Version(fixed), f"{requirement} admits a release before {fixed} ({advisory})"
    assert Version(fixed) in requirement.specifier


@pytest.mark.parametrize("requirement", DECLARED, ids=lambda r: r.name)
def test_the_installed_version_satisfies_the_declared_floor(requirement):
    installed = importlib.metadata.version(requirement.name)
    assert requirement.specifier.contains(installed, prereleases=True), f"{requirement.name} {installed} vs {requirement}"
