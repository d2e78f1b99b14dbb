"""A host state_dir that is read-only, full or not writable: exit 10 (IO) naming host and path, as
documented, not 5 ("unexpected output") or 1. The host lock helper runs for real against a
read-only / full tmpfs; its failure goes through deployctl's own mapping.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config.models import Host
from deploy.base.errors import DeployError, ExitCode, RemoteOutputError
from deploy.engine.locks import HOST_LOCK_SOURCE, acquire_host_lock


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def mount(options: str) -> Path:
        target = tmp_path / f"fs{len(mounted)}"
        target.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in reversed(mounted):
        subprocess.run(["umount", "-l", str(target)], capture_output=True)


class FakeHeld:
    def __init__(self, exit_code, stderr, first_line=""):
        self.exit_code, self.stderr, self.first_line = exit_code, stderr, first_line

    def close(self):
        pass


class Conn:
    def __init__(self, held):
        self.held = held

    def hold(self, command, timeout=None):
        return self.held


def _run_lock_helper(state_dir: Path) -> FakeHeld:
    out = subprocess.run([sys.executable, str(HOST_LOCK_SOURCE), "deployctl-host-lock", str(state_dir / "deployctl.lock"),
                          '{"pid": 1}'], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    return FakeHeld(out.returncode, out.stderr, out.stdout.splitlines()[0] if out.stdout else "")


def _fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for block in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", ["read-only", "full-inodes", "full"])
def test_host_lock_in_an_unwritable_state_dir_is_exit_10(tmpfs, how):
    if how == "read-only":
        state = tmpfs("size=1m,ro")
    elif how == "full-inodes":
        state = tmpfs("size=1m,nr_inodes=1")  # the root inode is the only one: no file can be created
    else:
        state = tmpfs("size=64k")
        _fill(state)
    held = _run_lock_helper(state)
    # under /tmp only in the test (pytest's tmp_path); model_copy skips the persistent-dir rule
    host = Host(name="gpu-a", address="10.0.0.1").model_copy(update={"state_dir": str(state)})
    if held.exit_code == 0 and how == "full":
        pytest.skip("tmpfs still had room for the lock file's inode and owner file")
    with pytest.raises(DeployError) as caught:
        acquire_host_lock(Conn(held), host, {"pid": 1})
    assert caught.value.exit_code == ExitCode.IO, str(caught.value)
    assert "gpu-a" in str(caught.value) and str(state) in str(caught.value)


@pytest.mark.parametrize("line,code", [
    ("OSError: [Errno 30] Read-only file system: '/s/deployctl.lock'", ExitCode.IO),
    ("OSError: [Errno 28] No space left on device", ExitCode.IO),
    ("PermissionError: [Errno 13] Permission denied: '/s/deployctl.lock'", ExitCode.IO),
    ("OSError: [Errno 122] Disk quota exceeded", ExitCode.IO),
    ("Segmentation fault", ExitCode.REMOTE_OUTPUT),
    ("", ExitCode.REMOTE_OUTPUT),
])
def test_host_lock_failure_mapping(line, code):
    host = Host(name="gpu-a", address="10.0.0.1", state_dir="/s")
    with pytest.raises(DeployError) as caught:
        acquire_host_lock(Conn(FakeHeld(1, "Traceback...\n" + line)), host, {"pid": 1})
    assert caught.value.exit_code == code
    if code == ExitCode.REMOTE_OUTPUT:
        assert isinstance(caught.value, RemoteOutputError)


@pytest.mark.parametrize("exc,code", [
    (OSError(errno.EROFS, "Read-only file system"), ExitCode.IO),
    (OSError(errno.ENOSPC, "No space left on device"), ExitCode.IO),
    (PermissionError(errno.EACCES, "Permission denied"), ExitCode.IO),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), ExitCode.IO),
    (OSError("Failure"), ExitCode.IO),  # what paramiko's SFTP raises for ENOSPC (SSH_FX_FAILURE)
    (OSError(errno.ECONNRESET, "reset"), ExitCode.FAILED),
])
def test_helper_upload_failure_mapping(exc, code):
    from deploy.ssh.transport import Transport

    class Failing(Transport):
        def _upload(self, directory, files):
            raise exc

    host = Host(name="gpu-a", address="10.0.0.1", state_dir="/srv/d")
    with pytest.raises(DeployError) as caught:
        Failing(host).upload("/srv/d/helpers", [(b"x", "/srv/d/helpers/host_ops.py", 0o600)])
    assert caught.value.exit_code == code and "host_ops.py" in str(caught.value)


@pytest.mark.parametrize("how", ["full-inodes", "full"])
def test_a_full_state_dir_says_the_disk_is_full_which_path_and_what_is_free(tmpfs, how):
    """Issue 39: the lock on a full disk was exit 10 with a traceback's last line, and the host's headline said
    "another deployctl may be changing the host"."""
    from deploy.engine.session import lock_refused_why

    state = tmpfs("size=1m,nr_inodes=1") if how == "full-inodes" else tmpfs("size=64k")
    if how == "full":
        _fill(state)
    held = _run_lock_helper(state)
    if held.exit_code == 0:
        pytest.skip("tmpfs still had room for the lock file's inode and owner file")
    assert "Traceback" not in held.stderr
    host = Host(name="gpu-a", address="10.0.0.1").model_copy(update={"state_dir": str(state)})
    with pytest.raises(DeployError) as caught:
        acquire_host_lock(Conn(held), host, {"pid": 1})
    text = str(caught.value)
    assert caught.value.exit_code == ExitCode.IO
    assert f"the disk of state_dir {state} is full" in text and "MiB and" in text and "inodes free" in text, text
    assert "another deployctl" not in lock_refused_why(caught.value)
    assert "could not be written" in lock_refused_why(caught.value)


def test_only_a_held_lock_is_blamed_on_another_deployctl():
    from deploy.base.errors import LockHeld
    from deploy.engine.session import lock_refused_why

    assert "another deployctl" in lock_refused_why(LockHeld("locked by ..."))
    assert "another deployctl" not in lock_refused_why(RemoteOutputError("the host lock helper printed 'x'"))
