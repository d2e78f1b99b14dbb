"""Round 3 (issue 31): every file deployctl writes, locally and on hosts, is written one safe way.

A temporary name created exclusively, renamed over a target that is a regular file or absent;
anything else at the target (device, FIFO, directory, socket) is refused naming the path, and
left exactly as it was.
"""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from deploy.verbs import status
from deploy.facts import quarantine as quarantine_facts
from deploy.local.state import LocalStateError
from deploy.remote import host_ops
from deploy.remote import quarantine as quarantine_helper


def _socket(path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(path.parent)  # AF_UNIX paths are at most 108 bytes
    try:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path.name)
        sock.close()
    finally:
        os.chdir(cwd)


def _char_device(path: Path) -> None:
    try:  # the /dev/null of a scratch dir (major 1, minor 3); needs CAP_MKNOD
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")


NOT_REGULAR = {"fifo": (os.mkfifo, "a FIFO"), "directory": (os.mkdir, "a directory"),
               "socket": (_socket, "a socket"), "char-device": (_char_device, "a character device")}


def _identity(path: Path) -> tuple:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_the_prom_file_never_replaces_what_is_not_a_regular_file(tmp_path, kind):
    make, words = NOT_REGULAR[kind]
    target = tmp_path / "deployctl.prom"
    make(target)
    before = _identity(target)
    with pytest.raises(LocalStateError) as caught:
        status.write_prom_file(target, "deployctl_status_up 1\n")
    assert str(target) in str(caught.value) and words in str(caught.value)
    assert caught.value.exit_code == 10
    assert _identity(target) == before and sorted(os.listdir(tmp_path)) == ["deployctl.prom"]


def test_the_prom_file_at_a_link_is_refused_and_the_file_it_names_kept(tmp_path):
    """Issue 44 reverses round 3 here: a link at the prom file's name is never written through (it
    replaced /etc/passwd); tests/hostile/test_planted_links.py generates every kind of planted name."""
    real = tmp_path / "real.prom"
    real.write_text("old\n")
    link = tmp_path / "link.prom"
    link.symlink_to(real)
    with pytest.raises(LocalStateError, match="a symbolic link") as caught:
        status.write_prom_file(link, "new 1\n")
    assert caught.value.exit_code == 10
    assert link.is_symlink() and real.read_text() == "old\n"


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR) + ["link"])
def test_host_replace_file_refuses_what_is_not_a_regular_file(tmp_path, kind):
    target = tmp_path / "deployment.json"
    if kind == "link":
        (tmp_path / "elsewhere.json").write_text("{}")
        target.symlink_to(tmp_path / "elsewhere.json")
        words = "a symbolic link"
    else:
        make, words = NOT_REGULAR[kind]
        make(target)
    before = _identity(target)
    with pytest.raises(OSError) as caught:
        host_ops.replace_file(str(target), b"{}\n")
    assert str(target) in caught.value.strerror and words in caught.value.strerror
    assert _identity(target) == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_host_replace_file_never_writes_through_a_link_at_a_temporary_name(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    target = tmp_path / "quarantine.json"
    for name in (f"quarantine.json.{os.getpid()}.tmp", f"quarantine.json.{os.getpid()}.0.tmp"):
        (tmp_path / name).symlink_to(outside)
    host_ops.replace_file(str(target), b"new\n")
    assert outside.read_text() == "precious\n" and target.read_text() == "new\n"
    assert not target.is_symlink() and oct(target.stat().st_mode & 0o777) == "0o600"


def _quarantine(path: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = quarantine_helper.main([quarantine_helper.MARK, str(path), *args])
    return code, out.getvalue(), err.getvalue()


ENTRY = json.dumps({"failed_at": "2026-12-01T00:00:00+00:00", "verb": "nightly"})


def test_quarantine_update_with_a_link_planted_at_its_old_temporary_name(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("precious\n")
    record = tmp_path / "quarantine.json"
    (tmp_path / f"quarantine.json.{os.getpid()}.tmp").symlink_to(outside)  # round 2's temporary name
    (tmp_path / f"quarantine.json.{os.getpid()}.0.tmp").symlink_to(outside)  # and this round's first
    code, out, err = _quarantine(record, "add", "fp1", ENTRY)
    assert code == 0, err
    assert outside.read_text() == "precious\n"
    assert list(json.loads(record.read_text())["entries"]) == ["fp1"]


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket"])
@pytest.mark.parametrize("op", ["add", "remove"])
def test_quarantine_record_that_is_not_a_regular_file_is_named_quickly_without_a_traceback(tmp_path, kind, op):
    make, _ = NOT_REGULAR[kind]
    record = tmp_path / "quarantine.json"
    make(record)
    before = _identity(record)
    started = time.monotonic()
    code, out, err = _quarantine(record, op, "fp1", *([ENTRY] if op == "add" else []))
    assert time.monotonic() - started < 2
    assert code == 1 and out == "" and str(record) in err and "Traceback" not in err
    assert _identity(record) == before


@pytest.mark.parametrize("depth", [62, 63, 100_000])
def test_a_deep_quarantine_record_is_replaced_on_add_and_named_on_remove(tmp_path, depth):
    record = tmp_path / "quarantine.json"
    record.write_text('{"entries": {"x": ' + "[" * depth + "]" * depth + "}}")
    code, _, err = _quarantine(record, "remove", "fp1")
    if depth + 2 <= host_ops.MAX_JSON_DEPTH:
        assert code == 0, err
    else:
        assert code == 1 and "levels deep" in err and "Traceback" not in err
    # the local reader refuses the same depth as exit 5 naming the file
    from deploy.base.errors import RemoteOutputError

    if depth + 2 > host_ops.MAX_JSON_DEPTH:
        with pytest.raises(RemoteOutputError, match="levels deep"):
            quarantine_facts.parse_quarantine(record.read_text(), "gpu-a", str(record))


def test_the_inline_quarantine_program_runs_standalone(tmp_path):
    record = tmp_path / "quarantine.json"
    os.mkfifo(record)
    proc = subprocess.run([sys.executable, "-c", quarantine_facts.update_program(), quarantine_facts.MARK,
                           str(record), "add", "fp1", ENTRY], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 1 and str(record) in proc.stderr and "Traceback" not in proc.stderr
    os.unlink(record)
    proc = subprocess.run([sys.executable, "-c", quarantine_facts.update_program(), quarantine_facts.MARK,
                           str(record), "add", "fp1", ENTRY], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0 and quarantine_facts.parse_update(proc.stdout, "h") == 1


@pytest.mark.parametrize("kind", ["fifo", "directory", "absent", "regular"])
def test_host_ops_write_file_is_what_launch_and_record_good_write_with(tmp_path, kind):
    target = tmp_path / "last-good.json"
    if kind == "regular":
        target.write_text("old\n")
    elif kind != "absent":
        NOT_REGULAR[kind][0](target)
    from deploy.facts.helpers import helper_payloads

    helper = tmp_path / "helpers" / "host_ops.py"  # exactly what ensure-helper installs
    helper.parent.mkdir()
    helper.write_bytes(helper_payloads()["host_ops.py"])
    proc = subprocess.run([sys.executable, "-I", "-S", str(helper), "write-file", str(target)],
                          input=b'{"argv": []}\n', capture_output=True, timeout=20)
    if kind in ("absent", "regular"):
        assert proc.returncode == 0 and proc.stdout == b"" and target.read_bytes() == b'{"argv": []}\n'
    else:
        assert proc.returncode == 1 and str(target).encode() in proc.stderr and b"Traceback" not in proc.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_the_host_lock_owner_file_that_is_not_a_regular_file_is_exit_10_naming_it(tmp_path, kind):
    from deploy.engine.locks import WRITE_FAILURE, host_lock_program

    lock = tmp_path / "deployctl.lock"
    owner = tmp_path / "deployctl.lock.owner.json"
    NOT_REGULAR[kind][0](owner)
    before = _identity(owner)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", host_lock_program(), "deployctl-host-lock", str(lock), "{}"],
                          input="release\n", capture_output=True, text=True, timeout=20)
    assert time.monotonic() - started < 10 and proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert str(owner) in last and WRITE_FAILURE.search(last)
    assert _identity(owner) == before
