"""deploy/facts/helpers.py helper_payloads(): what ensure-helper installs, byte-for-byte reproducible."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from io import BytesIO
from pathlib import Path

from deploy.facts import helpers


def test_payloads_are_host_ops_the_fixer_zipapp_and_the_drafter_sender():
    payloads = helpers.helper_payloads()
    assert sorted(payloads) == sorted(helpers.HELPER_FILES) == ["drafter_swap.py", "fixer.pyz", "host_ops.py"]
    assert payloads["drafter_swap.py"] == (helpers.REMOTE_DIR / "drafter_swap.py").read_bytes()
    # host_ops with the state_files it imports, one file run as `python3 -I -S host_ops.py`
    from deploy.facts.inline import inline_program

    assert payloads["host_ops.py"] == ("#!/usr/bin/env python3\n" + inline_program(
        helpers.host_ops_modules(), "host_ops", cache_as="host_ops")).encode()
    archive = zipfile.ZipFile(BytesIO(payloads["fixer.pyz"]))
    names = archive.namelist()
    assert names == ["__main__.py"] + [f"fixer/{p.name}" for p in sorted(helpers.FIXER_PACKAGE.glob("*.py"))]
    for name in names[1:]:
        assert archive.read(name) == (helpers.FIXER_PACKAGE / name[len("fixer/"):]).read_bytes()
    assert {i.date_time for i in archive.infolist()} == {helpers.ZIP_EPOCH}      # fixed timestamps
    assert {i.compress_type for i in archive.infolist()} == {zipfile.ZIP_STORED}
    package = sorted(p for p in helpers.FIXER_PACKAGE.glob("*.py") if p.name != "__main__.py")
    modules = [("fixer" if p.stem == "__init__" else f"fixer.{p.stem}", p.read_text()) for p in package]
    assert archive.read("__main__.py").decode() == inline_program(
        modules + [("fixer_main", helpers.FIXER_ENTRY.decode())], "fixer_main", cache_as="fixer")


def test_the_zipapp_sha256_depends_only_on_the_sources(tmp_path, monkeypatch):
    """Another checkout (other mtimes, modes, umask, directory) builds the very same bytes."""
    first = hashlib.sha256(helpers.fixer_zipapp()).hexdigest()
    copy = tmp_path / "elsewhere" / "fixer"
    shutil.copytree(helpers.FIXER_PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for i, path in enumerate(sorted(copy.iterdir())):
        os.utime(path, (1_000_000 + i, 2_000_000_000 - i))
        path.chmod(0o600 if i % 2 else 0o755)
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"not source")
    monkeypatch.setattr(helpers, "FIXER_PACKAGE", copy)
    old = os.umask(0o077)
    try:
        assert hashlib.sha256(helpers.fixer_zipapp()).hexdigest() == first
    finally:
        os.umask(old)
    (copy / "cli.py").write_text((copy / "cli.py").read_text() + "\n# changed\n")
    assert hashlib.sha256(helpers.fixer_zipapp()).hexdigest() != first           # a change is noticed


def test_the_zipapp_runs_alone_in_an_isolated_python(tmp_path):
    target = tmp_path / "helpers" / "fixer.pyz"
    target.parent.mkdir()
    target.write_bytes(helpers.helper_payloads()["fixer.pyz"])
    done = subprocess.run([sys.executable, "-I", "-S", str(target), "--help"], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path))
    assert done.returncode == 0 and "--hidden-states-from" in done.stdout, done.stderr
    assert "store" in subprocess.run([sys.executable, "-I", str(target), "store", "--help"], capture_output=True,
                                     text=True, timeout=60).stdout
    assert Path(target).read_bytes().startswith(b"#!/usr/bin/env python3\n")
