"""Facts ensure-helper reads: the host python's version and the sha256 of the installed helpers."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.shell import quote, quote_path

#: the host-side helpers are Python 3.8+ stdlib only
MIN_PYTHON = (3, 8)


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
