"""Issue 39: deploying as root, free-gpus SIGKILLed another user's (uid 65534) process that held a GPU. It now
kills only the deploy user's holders unless the run says so (free-gpus' ``kill_other_users``), and names each
holder it leaves alone. Real processes on this machine, a file standing in for a GPU device, the real fuser."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from deploy.facts.fuser import kill_command, parse_kill_result

pytestmark = pytest.mark.skipif(shutil.which("fuser") is None or os.geteuid() != 0,
                                reason="needs psmisc's fuser and root (a process of another user: uid 65534)")


def holder(device, user: int | None):
    """A process holding ``device`` open (as uid ``user``, or as this user)."""
    program = f"import time; f = open({str(device)!r}); time.sleep(60)"
    kwargs = {"user": user, "group": user} if user is not None else {}
    proc = subprocess.Popen(["python3", "-c", program], **kwargs)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if any(os.path.realpath(f"/proc/{proc.pid}/fd/{fd}") == str(device)
                   for fd in os.listdir(f"/proc/{proc.pid}/fd")):
                return proc
        except OSError:  # a file the starting interpreter closed between the listing and realpath's readlink
            pass
        time.sleep(0.02)
    raise AssertionError("the holder never opened the device")


@pytest.mark.parametrize("kill_other_users", [False, True])
def test_free_gpus_kills_another_users_holder_only_when_told(kill_other_users):
    # a folder uid 65534 can reach (pytest's tmp_path is under a 0700 folder of root's)
    tmp_path = Path(tempfile.mkdtemp(prefix="deployctl-gpus-"))
    tmp_path.chmod(0o755)
    device = tmp_path / "nvidia0"
    device.write_text("")
    device.chmod(0o666)
    mine, theirs = holder(device, None), holder(device, 65534)
    try:
        out = subprocess.run(["sh", "-c", kill_command(str(tmp_path / "nvidia*"), kill_other_users)],
                             capture_output=True, text=True, timeout=30)
        killed = parse_kill_result(out.returncode, out.stdout, out.stderr, "h", str(tmp_path / "nvidia*"))
        mine.wait(timeout=10)
        if kill_other_users:
            theirs.wait(timeout=10)
            assert set(killed.pids) == {mine.pid, theirs.pid} and killed.other_users == []
        else:
            time.sleep(0.2)
            assert theirs.poll() is None, "another user's process was killed"
            assert killed.pids == [mine.pid]
            [line] = killed.other_users
            assert f"process {theirs.pid} of uid 65534" in line and "time.sleep(60)" in line
    finally:
        for proc in (mine, theirs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_nothing_held_is_not_an_error(tmp_path):
    (tmp_path / "nvidia0").write_text("")
    out = subprocess.run(["sh", "-c", kill_command(str(tmp_path / "nvidia*"))], capture_output=True, text=True,
                         timeout=30)
    assert parse_kill_result(out.returncode, out.stdout, out.stderr, "h", "x").pids == []
