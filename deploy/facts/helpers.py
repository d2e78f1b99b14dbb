"""Facts ensure-helper reads and the bytes it ships: the host python's version, the sha256 of the
installed helpers, and the helpers themselves (host_ops.py, and the key fixer package as one zipapp)."""

from __future__ import annotations

import functools
import io
import re
import zipfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.shell import quote, quote_path

#: the host-side helpers are Python 3.8+ stdlib only
MIN_PYTHON = (3, 8)


def helper_python(python: str) -> str:
    """How the host's python starts a stdlib-only helper: ``-I`` ignores PYTHON* variables and the
    user site (a PYTHONPATH in the deploy user's profile cannot shadow a stdlib module the helper
    imports), ``-S`` skips ``site`` (its .pth processing costs 25 ms per start on a bare Debian
    python3, more in a conda environment with many packages; the helpers need none of them)."""
    return f"{quote(python)} -I -S"

REMOTE_DIR = Path(__file__).resolve().parents[1] / "remote"
FIXER_PACKAGE = REMOTE_DIR / "fixer"
#: the zipapp's top-level entry point: the package sits beside it as ``fixer``
#: host_verbs: ``store`` (the fix-keys step's host side) exists only here, never in ``deployctl fix-keys``
FIXER_ENTRY = b"import sys\nfrom fixer.cli import main\nsys.exit(main(host_verbs=True))\n"
#: a fixed entry time, so the archive's bytes (and sha256) depend only on the sources
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class HelperState(BaseModel):
    """The host python's version and the installed helpers' sha256, read by one command."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    python: str
    files: dict[str, str | None]


#: runs on any python3 (no f-strings): an old interpreter must still answer with its version
_STATE_PROGRAM = (
    "import sys, json, hashlib, os\n"
    "def digest(p):\n"
    "    try:\n"
    "        with open(p, 'rb') as h:\n"
    "            return hashlib.sha256(h.read()).hexdigest()\n"
    "    except (IOError, OSError):\n"
    "        return None\n"
    "files = dict((os.path.basename(p), digest(p)) for p in sys.argv[1:])\n"
    "sys.stdout.write(json.dumps({'python': '%d.%d.%d' % tuple(sys.version_info[:3]), 'files': files}) + '\\n')\n"
)


def helper_state_command(python: str, paths: list[str]) -> str:
    return f"{quote(python)} -c {quote(_STATE_PROGRAM)} " + " ".join(quote_path(p) for p in paths)


def parse_helper_state(exit_code: int, stdout: str, stderr: str, python: str, expected_files: list[str],
                       source: str) -> HelperState:
    if exit_code != 0:
        detail = (stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RemoteCommandFailed(f"{source}: cannot run the host's python {python!r}: {detail}")
    try:
        state = HelperState.model_validate_json(stdout.strip())
    except ValueError:
        raise RemoteOutputError(f"{source}: the helper check printed {stdout.strip()[:200]!r}") from None
    if sorted(state.files) != sorted(expected_files):
        raise RemoteOutputError(f"{source}: the helper check reported {sorted(state.files)}, expected {sorted(expected_files)}")
    if any(d is not None and not re.fullmatch(r"[0-9a-f]{64}", d) for d in state.files.values()):
        raise RemoteOutputError(f"{source}: the helper check printed a malformed sha256: {stdout.strip()[:200]!r}")
    require_python(state.python, python, source)
    return state


def require_python(version: str, python: str, source: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", version)
    if not match:
        raise RemoteOutputError(f"{source}: {python} reported {version[:80]!r} for its version")
    found = (int(match.group(1)), int(match.group(2)))
    if found < MIN_PYTHON:
        raise RemoteCommandFailed(
            f"{source}: {python} is Python {version}; the host-side helpers need "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}+ (set hosts[].python to a newer interpreter)"
        )
    return found


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


@functools.lru_cache(maxsize=1)
def helper_payloads() -> dict[str, bytes]:
    """What ensure-helper installs in ``<state_dir>/helpers``: file name -> exact bytes."""
    return {"host_ops.py": (REMOTE_DIR / "host_ops.py").read_bytes(), "fixer.pyz": fixer_zipapp(),
            # the drafter swap's inspector and sender (issue 29); run under the run's sglang_python
            "drafter_swap.py": (REMOTE_DIR / "drafter_swap.py").read_bytes()}


HELPER_FILES = ("host_ops.py", "fixer.pyz", "drafter_swap.py")
