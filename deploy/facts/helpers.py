"""Facts ensure-helper reads and the bytes it ships: the host python's version, the sha256 of the
installed helpers, and the helpers themselves (host_ops.py, and the key fixer package as one zipapp)."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from deploy.base.errors import ExitCode, RemoteCommandFailed, RemoteOutputError
from deploy.base.shell import quote, quote_path
from deploy.base.once import built_once

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
#: the zipapp's entry module (fixer_main): the package is carried beside it as ``fixer``
#: host_verbs: ``store`` (the fix-keys step's host side) exists only here, never in ``deployctl fix-keys``
FIXER_ENTRY = b"import sys\nfrom fixer.cli import main\nsys.exit(main(host_verbs=True))\n"
#: a fixed entry time, so the archive's bytes (and sha256) depend only on the sources
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


class HelperState(BaseModel):
    """The host python's version and the installed helpers' sha256, read by one command."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    python: str
    files: dict[str, str | None]
    #: file name -> why it was not read (not a regular file, a link, over the limit), naming its path
    problems: dict[str, str] = {}


#: the largest file the state program hashes: a dataset is at most 128 MiB (deploy/local/datasets.py), a
#: helper a few hundred KB; a link to /dev/zero there grew the host's python to 24 GB (issue 31)
MAX_HASHED_BYTES = 128 << 20

#: runs on any python3 (no f-strings): an old interpreter must still answer with its version.
#: Each file is opened O_NOFOLLOW|O_NONBLOCK and fstat'ed before any byte is read (a FIFO planted at
#: <state_dir>/datasets/<sha256>.json held the check until its 120 s timeout), read in 1 MiB chunks
#: up to argv[1] bytes; anything else is a "problem" naming the file, never a hang or a crash.
_STATE_PROGRAM = (
    "import sys, json, hashlib, os, stat, errno\n"
    "limit = int(sys.argv[1])\n"
    "problems = {}\n"
    "def digest(p):\n"
    "    flags = os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0) | getattr(os, 'O_NOFOLLOW', 0)\n"
    "    try:\n"
    "        fd = os.open(p, flags)\n"
    "    except (IOError, OSError) as exc:\n"
    "        if exc.errno == errno.ENOENT:\n"
    "            return None\n"
    "        if exc.errno == errno.ELOOP:\n"
    "            return '%s is a symbolic link (deployctl writes regular files there); not read' % p\n"
    "        if exc.errno == errno.ENXIO:\n"
    "            return '%s is not a regular file (a socket); not read' % p\n"
    "        return '%s: cannot read: %s' % (p, exc.strerror or exc)\n"
    "    try:\n"
    "        st = os.fstat(fd)\n"
    "        if not stat.S_ISREG(st.st_mode):\n"
    "            return '%s is not a regular file (a FIFO, device, socket or directory); not read' % p\n"
    "        if st.st_size > limit:\n"
    "            return '%s is %d bytes, over the limit of %d; not read' % (p, st.st_size, limit)\n"
    "        h = hashlib.sha256()\n"
    "        total = 0\n"
    "        while True:\n"
    "            chunk = os.read(fd, 1 << 20)\n"
    "            if not chunk:\n"
    "                return h\n"
    "            total += len(chunk)\n"
    "            if total > limit:\n"
    "                return '%s grew over the limit of %d bytes while read; not read' % (p, limit)\n"
    "            h.update(chunk)\n"
    "    except (IOError, OSError) as exc:\n"
    "        return '%s: cannot read: %s' % (p, exc.strerror or exc)\n"
    "    finally:\n"
    "        os.close(fd)\n"
    "files = {}\n"
    "for p in sys.argv[2:]:\n"
    "    name = os.path.basename(p)\n"
    "    d = digest(p)\n"
    "    if d is None or hasattr(d, 'hexdigest'):\n"
    "        files[name] = d.hexdigest() if d is not None else None\n"
    "    else:\n"
    "        files[name] = None\n"
    "        problems[name] = d\n"
    "sys.stdout.write(json.dumps({'python': '%d.%d.%d' % tuple(sys.version_info[:3]), 'files': files,\n"
    "                             'problems': problems}) + '\\n')\n"
)


def helper_state_command(python: str, paths: list[str], max_bytes: int = MAX_HASHED_BYTES) -> str:
    return f"{quote(python)} -c {quote(_STATE_PROGRAM)} {max_bytes} " + " ".join(quote_path(p) for p in paths)


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
    if set(state.problems) - set(state.files):
        raise RemoteOutputError(f"{source}: the helper check reported problems for {sorted(state.problems)}, "
                                f"not among {sorted(expected_files)}")
    require_python(state.python, python, source)
    if state.problems:
        # deployctl writes only regular files there: whatever else sits at the path (a FIFO, a
        # device, a link) is not replaced (issue 31) but named, before anything is stopped or sent
        first = sorted(state.problems)[0]
        raise RemoteCommandFailed(f"{source}: {state.problems[first][:400]}; remove it and run again",
                                  exit_code=ExitCode.IO)
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

    Its one entry, ``__main__.py``, is the package as an installed inline program (deploy/facts/inline.py)
    that keeps its compiled code in ``__pycache__`` beside the archive: zipimport compiles every module
    of the package on every start (about 45 ms of a ``fixer.pyz`` call's 99 ms of CPU, Python 3.11,
    2026-12-05) and caches nothing.

    The entry is stored uncompressed (zlib and zlib-ng compress the same input to different bytes,
    so a deflated archive's sha256 would differ between machines), with a fixed timestamp and mode:
    the same sources give the same sha256 on every machine, and ensure-helper uploads only when a
    source changed.
    """
    from deploy.facts.inline import inline_program

    modules = [("fixer" if p.stem == "__init__" else f"fixer.{p.stem}", p.read_text())
               for p in sorted(FIXER_PACKAGE.glob("*.py")) if p.stem != "__main__"]
    entry = inline_program(modules + [("fixer_main", FIXER_ENTRY.decode())], "fixer_main", cache_as="fixer")
    buffer = io.BytesIO()
    buffer.write(b"#!/usr/bin/env python3\n")
    # the package's files ride along too, in name order: ``sys.path.insert(0, "fixer.pyz"); import fixer``
    # (the fault tests' driver) imports it from the archive
    entries = [("__main__.py", entry.encode("utf-8"))]
    entries += [(f"fixer/{p.name}", p.read_bytes()) for p in sorted(FIXER_PACKAGE.glob("*.py"))]
    with zipfile.ZipFile(buffer, "a", compression=zipfile.ZIP_STORED) as archive:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever machine builds it
            archive.writestr(info, data)
    return buffer.getvalue()


def remote_modules(*names: str) -> list[tuple[str, str]]:
    """(name, source) of deploy/remote's ``names``, in the order given (dependencies first), for inline_program."""
    return [(name, (REMOTE_DIR / f"{name}.py").read_text()) for name in names]


def host_ops_modules() -> list[tuple[str, str]]:
    """host_ops.py and the state_files.py (bounded reads and JSON, the one safe write), http_plain.py
    (its HTTP calls) and host_ops_args.py (its command line) it imports, dependencies first: what every
    inline program and the installed helper carry."""
    return remote_modules("http_plain", "state_files", "host_ops_args", "host_ops")


@built_once
def helper_payloads() -> dict[str, bytes]:
    """What ensure-helper installs in ``<state_dir>/helpers``: file name -> exact bytes. ``host_ops.py``
    is host_ops with state_files beside it, one file (deploy/facts/inline.py's loader): the helper
    runs as ``python3 -I -S host_ops.py`` (``-I``: no script directory on sys.path for a sibling)."""
    from deploy.facts.inline import inline_program

    bundled = "#!/usr/bin/env python3\n" + inline_program(host_ops_modules(), "host_ops", cache_as="host_ops")
    return {"host_ops.py": bundled.encode("utf-8"), "fixer.pyz": fixer_zipapp(),
            # the drafter swap's inspector and sender (issue 29); run under the run's sglang_python
            "drafter_swap.py": (REMOTE_DIR / "drafter_swap.py").read_bytes()}


HELPER_FILES = ("host_ops.py", "fixer.pyz", "drafter_swap.py")


def write_file_command(python: str, host_ops: str, path: str, mode: int = 0o600) -> str:
    """The host-side file write every state file takes (stdin -> ``path``): host_ops.py's
    replace_file, an exclusive temporary name renamed over a regular file or nothing; a FIFO,
    device, directory, socket or link at ``path`` is refused naming it (issue 31). ``path`` as the
    shell should see it (quote_path'ed by the caller, so ``~`` expands)."""
    return f"{helper_python(python)} {quote_path(host_ops)} write-file {path} --mode {mode:o}"
