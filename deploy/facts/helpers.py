"""Facts ensure-helper reads and the bytes it ships: the host python's version, the sha256 of the
installed helpers, and the helpers themselves (host_ops.py, and the key fixer package as one zipapp)."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.shell import quote, quote_path

#: the host-side helpers are Python 3.8+ stdlib only
MIN_PYTHON = (3, 8)

REMOTE_DIR = Path(__file__).resolve().parents[1] / "remote"
FIXER_PACKAGE = REMOTE_DIR / "fixer"
#: the zipapp's top-level entry point: the package sits beside it as ``fixer``
FIXER_ENTRY = b"import sys\nfrom fixer.cli import main\nsys.exit(main())\n"
#: a fixed entry time, so the archive's bytes (and sha256) depend only on the sources
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class PythonVersion(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    major: int
    minor: int

    def as_tuple(self) -> tuple[int, int]:
        return (self.major, self.minor)


class HelperDigests(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    #: file name -> sha256 hex, or None when the file is missing
    files: dict[str, str | None]


def python_version_command(python: str) -> str:
    return f"{quote(python)} -c " + quote('import sys; sys.stdout.write("%d.%d" % sys.version_info[:2])')


def parse_python_version(exit_code: int, stdout: str, stderr: str, python: str, source: str) -> PythonVersion:
    text = stdout.strip()
    if exit_code != 0:
        detail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RemoteCommandFailed(f"{source}: cannot run the host's python {python!r}: {detail}")
    match = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not match:
        raise RemoteOutputError(f"{source}: {python} printed {text[:80]!r} for its version")
    version = PythonVersion(major=int(match.group(1)), minor=int(match.group(2)))
    if version.as_tuple() < MIN_PYTHON:
        raise RemoteCommandFailed(
            f"{source}: {python} is Python {text}; the host-side helpers need "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ (set hosts[].python to a newer interpreter)"
        )
    return version


def digest_command(paths: list[str]) -> str:
    files = " ".join(quote_path(p) for p in paths)
    # One line per file: "<sha256>  <name>" or "missing <name>"; never fails on a missing file.
    return (
        f"for f in {files}; do if [ -f \"$f\" ]; then sha256sum -- \"$f\"; "
        "else printf 'missing %s\\n' \"$f\"; fi; done"
    )


def parse_digests(output: str, expected_files: list[str], source: str) -> HelperDigests:
    found: dict[str, str | None] = {}
    for line in output.splitlines():
        if not line.strip():
            continue
        match = re.fullmatch(r"([0-9a-f]{64})  (.+)|missing (.+)", line)
        if not match:
            raise RemoteOutputError(f"{source}: unexpected sha256sum output line {line!r}")
        path = match.group(2) or match.group(3)
        found[path.rsplit("/", 1)[-1]] = match.group(1)
    if sorted(found) != sorted(expected_files):
        raise RemoteOutputError(f"{source}: sha256sum reported {sorted(found)}, expected {sorted(expected_files)}")
    return HelperDigests(files=found)


def fixer_zipapp() -> bytes:
    """The key fixer package as one zipapp (``python3 fixer.pyz ARGS``), byte-for-byte reproducible.

    Entries are stored uncompressed (zlib and zlib-ng compress the same input to different bytes,
    so a deflated archive's sha256 would differ between machines), in name order, with a fixed
    timestamp and mode: the same sources give the same sha256 on every machine, and ensure-helper
    uploads only when a source changed.
    """
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    entries = [("__main__.py", FIXER_ENTRY)]
    entries += [(f"fixer/{p.name}", p.read_bytes()) for p in sorted(FIXER_PACKAGE.glob("*.py"))]
    with zipfile.ZipFile(buffer, "a", compression=zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever machine builds it
            archive.writestr(info, data)
    return buffer.getvalue()


def helper_payloads() -> dict[str, bytes]:
    """What ensure-helper installs in ``<state_dir>/helpers``: file name -> exact bytes."""
    return {"host_ops.py": (REMOTE_DIR / "host_ops.py").read_bytes(), "fixer.pyz": fixer_zipapp()}


HELPER_FILES = ("host_ops.py", "fixer.pyz")
