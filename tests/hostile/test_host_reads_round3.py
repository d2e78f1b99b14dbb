"""Round 3 (issue 31): the host-side reads are bounded and type-checked like the local ones.

The state program (deploy/facts/helpers.py) hashes the helpers and the datasets in the state dir:
each hostile kind of file planted there is named in a problem, never read, within a second.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from deploy.base.errors import ExitCode, RemoteCommandFailed
from deploy.facts import helpers


def _fifo(path: str) -> None:
    os.mkfifo(path)


def _dev_zero_link(path: str) -> None:
    os.symlink("/dev/zero", path)


def _link_out(path: str) -> None:
    outside = os.path.join(os.path.dirname(os.path.dirname(path)), "outside.json")
    with open(outside, "w") as handle:
        handle.write("[]")
    os.symlink(outside, path)


def _dangling_link(path: str) -> None:
    os.symlink(path + ".missing", path)


def _directory(path: str) -> None:
    os.mkdir(path)


def _socket(path: str) -> None:
    # AF_UNIX paths are at most 108 bytes: bind the name relative to its directory
    cwd = os.getcwd()
    os.chdir(os.path.dirname(path))
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(os.path.basename(path))
        sock.close()
    finally:
        os.chdir(cwd)


def _oversize(path: str) -> None:
    with open(path, "wb") as handle:
        handle.write(b"x" * 4097)


PLANTED = {"fifo": (_fifo, "not a regular file"), "link-to-dev-zero": (_dev_zero_link, "symbolic link"),
           "link-out-of-state-dir": (_link_out, "symbolic link"), "dangling-link": (_dangling_link, "symbolic link"),
           "directory": (_directory, "not a regular file"), "socket": (_socket, "not a regular file"),
           "oversize": (_oversize, "over the limit of 4096")}


def run_state(paths: list[str], max_bytes: int = 4096) -> subprocess.CompletedProcess:
    command = helpers.helper_state_command(sys.executable, paths, max_bytes)
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_planted_dataset_is_named_and_never_read(tmp_path, kind):
    datasets = tmp_path / "state" / "datasets"
    datasets.mkdir(parents=True)
    name = "0" * 64 + ".json"
    target = str(datasets / name)
    plant, fragment = PLANTED[kind]
    plant(target)
    good = datasets / "good.json"
    good.write_bytes(b"[]")
    started = time.monotonic()
    result = run_state([target, str(good)])
    assert time.monotonic() - started < 5
    assert result.returncode == 0, result.stderr
    with pytest.raises(RemoteCommandFailed) as caught:
        helpers.parse_helper_state(result.returncode, result.stdout, result.stderr, sys.executable,
                                   [name, "good.json"], "gpu-a")
    assert caught.value.exit_code == ExitCode.IO
    assert target in str(caught.value) and fragment in str(caught.value)


def test_regular_files_are_hashed_in_chunks_and_absent_ones_are_none(tmp_path):
    import hashlib

    big = tmp_path / "big.json"
    data = os.urandom(3 << 20)  # three chunks and a bit
    big.write_bytes(data + b"tail")
    result = run_state([str(big), str(tmp_path / "absent.json")], max_bytes=4 << 20)
    state = helpers.parse_helper_state(result.returncode, result.stdout, result.stderr, sys.executable,
                                       ["big.json", "absent.json"], "gpu-a")
    assert state.files == {"big.json": hashlib.sha256(data + b"tail").hexdigest(), "absent.json": None}
    assert state.problems == {}


def test_problems_for_files_not_asked_about_are_a_remote_output_error():
    from deploy.base.errors import RemoteOutputError

    stdout = '{"python": "3.11.0", "files": {"a": null}, "problems": {"b": "x"}}'
    with pytest.raises(RemoteOutputError):
        helpers.parse_helper_state(0, stdout, "", "python3", ["a"], "gpu-a")
