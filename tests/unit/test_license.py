"""Issue 42: deployctl is Apache-2.0, said in a LICENSE file with the full text and in the package
metadata (the wheel ships both: tests/unit/test_wheel_install.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_declares_apache_2_and_names_the_license_file():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    # an SPDX `license` next to a "License ::" classifier is refused by setuptools 77+ (PEP 639)
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]


def test_the_license_file_holds_the_whole_apache_2_text():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    # the whole text: the nine sections and the appendix, not a one-line notice
    for heading in ("1. Definitions.", "4. Redistribution.", "9. Accepting Warranty or Additional Liability.",
                    "END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."):
        assert heading in text, heading
    assert len(text.split()) > 1500


def test_setup_py_carries_no_license_metadata_of_its_own():
    """setup.py lists only what the wheel ships; a `license=` there would compete with pyproject's."""
    assert "license" not in (REPO / "setup.py").read_text().lower()
