"""Issue 39: a signal during a host-side command stops its process group before the call returns (so before
the host lock is released); closing the channel alone left the fix-keys store running 7.3 s after the lock was
released, and watch-gpus up to 25 s after deployctl exited.

The "host" here is this machine: each channel runs its command as sshd does (``sh -c``, a session of its own,
pipes, no pty), so the coreutils ``timeout`` wrapper, its process group and the stop command are the real ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest

from deploy.base.errors import Interrupted
from deploy.config.models import SSHSettings
from deploy.ssh.process_group import split_group_mark, stop_group_command
from deploy.ssh.transport import HostConnection

from tests.fixtures import LOOPBACK_HOST as HOST  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")


class StreamBuffer:
    """paramiko's BufferedPipe as exec_bounded uses it: ``set_event`` names the event set when data arrives or
    the stream closes."""

    def __init__(self):
        self.event: threading.Event | None = None

    def set_event(self, event: threading.Event) -> None:
        self.event = event

    def fed(self) -> None:
        if self.event is not None:
            self.event.set()


class LocalChannel:
    """The paramiko Channel surface HostConnection uses, over a local ``sh -c`` in a session of its own."""

    def __init__(self):
        self.status_event = threading.Event()
        self.in_buffer, self.in_stderr_buffer = StreamBuffer(), StreamBuffer()
        self.closed = self.eof_received = False
        self.proc: subprocess.Popen | None = None
        self.out, self.err = bytearray(), bytearray()
        self.lock = threading.Lock()

    def settimeout(self, t):
        self.timeout = t

    def exec_command(self, command):
        self.proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        for stream, buf, fed in ((self.proc.stdout, self.out, self.in_buffer),
                                 (self.proc.stderr, self.err, self.in_stderr_buffer)):
            threading.Thread(target=self._pump, args=(stream, buf, fed), daemon=True).start()
        threading.Thread(target=self._reap, daemon=True).start()

    def _pump(self, stream, buf, fed):
        for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):
            with self.lock:
                buf.extend(chunk)
            fed.fed()

    def _reap(self):
        assert self.proc is not None
        self.proc.wait()
        time.sleep(0.05)  # the pumps drain what is left
        self.eof_received = True
        self.in_buffer.fed()  # paramiko closes both buffers at the EOF, which sets their event
        self.in_stderr_buffer.fed()
        self.status_event.set()

    def _take(self, buf, n):
        with self.lock:
            data = bytes(buf[:n])
            del buf[:n]
        return data

    def recv_ready(self):
        return bool(self.out)

    def recv_stderr_ready(self):
        return bool(self.err)

    def recv(self, n):
        deadline = time.monotonic() + getattr(self, "timeout", 0.1)
        while not self.out and not self.status_event.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.out and not self.status_event.is_set():
            import socket
            raise socket.timeout()
        return self._take(self.out, n)

    def recv_stderr(self, n):
        return self._take(self.err, n)

    def exit_status_ready(self):
        return self.status_event.is_set()

    def recv_exit_status(self):
        assert self.proc is not None
        return self.proc.returncode

    def shutdown_write(self):
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self):
        # sshd closes the session's pipes; nothing signals the command
        self.closed = True
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            self.shutdown_write()


class LocalSSH:
    def __init__(self):
        self.channels: list[LocalChannel] = []
        self.client = SimpleNamespace(get_transport=lambda: self)

    def open_session(self, timeout=None):
        channel = LocalChannel()
        channel.get_transport = lambda: self  # type: ignore[attr-defined]
        self.channels.append(channel)
        return channel

    def is_active(self):
        return True


def connection(cancelled: threading.Event) -> tuple[HostConnection, LocalSSH]:
    conn = HostConnection(HOST, SSHSettings())
    ssh = LocalSSH()
    conn._live = lambda: ssh  # type: ignore[method-assign]
    conn.cancelled = cancelled
    return conn, ssh


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def spawn_family(pids_file) -> str:
    """A host-side command like the fix-keys store: a parent and a child, busy for a minute, silent, ignoring
    stdin's EOF."""
    return (f"python3 -c 'import os, time, subprocess; c = subprocess.Popen([\"sleep\", \"60\"]); "
            f"open(\"{pids_file}\", \"w\").write(\"%d %d\" % (os.getpid(), c.pid)); time.sleep(60)'")


def wait_for(path, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return [int(p) for p in path.read_text().split()]
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


@pytest.mark.parametrize("verb", ["run", "watch"])
def test_a_signal_stops_the_commands_whole_process_group_before_the_call_returns(tmp_path, verb):
    cancelled = threading.Event()
    conn, ssh = connection(cancelled)
    pids_file = tmp_path / "pids"
    command = spawn_family(pids_file)
    threading.Thread(target=lambda: (wait_for(pids_file), cancelled.set()), daemon=True).start()
    started = time.monotonic()
    with pytest.raises(Interrupted):
        if verb == "run":
            conn.run(command, timeout=120)
        else:
            conn.watch(command, lambda line: False, timeout=120, cancelled=cancelled)
    took = time.monotonic() - started
    pids = wait_for(pids_file)
    # the lock is released only after this returns: nothing of the command may be left by then
    assert [p for p in pids if alive(p)] == [], f"still running after the call returned: {pids}"
    assert took < 8, took
    assert len(ssh.channels) == 2  # the command's channel and the one that stopped its group


def test_an_answered_watch_leaves_no_poller_that_ignores_stdins_eof(tmp_path):
    cancelled = threading.Event()
    conn, _ = connection(cancelled)
    pids_file = tmp_path / "pids"
    command = ("python3 -c 'import os, sys, time; open(\"%s\", \"w\").write(str(os.getpid())); "
               "print(\"ready\", flush=True); time.sleep(60)'" % pids_file)
    conn.watch(command, lambda line: line == "ready", timeout=120, cancelled=cancelled)
    [pid] = wait_for(pids_file)
    assert not alive(pid)


def test_a_command_that_ends_keeps_its_stderr_without_the_mark():
    conn, ssh = connection(threading.Event())
    result = conn.run("echo out; echo err >&2; exit 3", timeout=30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert len(ssh.channels) == 1  # nothing was stopped: no second channel


@pytest.mark.parametrize("stderr,expected", [
    (b"deployctl-pgid 4242\nTraceback\n", (4242, b"Traceback\n")),
    (b"deployctl-pgid 4242\n", (4242, b"")),
    (b"deployctl-pgid 42", (None, b"deployctl-pgid 42")),     # not whole yet
    (b"deployctl-pgid 1\n", (None, b"")),                     # never init's group
    (b"deployctl-pgid x\nrest", (None, b"rest")),
    (b"motd from .bashrc\ndeployctl-pgid 4242\nerr\n", (4242, b"motd from .bashrc\nerr\n")),
    (b"err\n", (None, b"err\n")),
])
def test_the_group_mark_is_read_only_from_the_first_line(stderr, expected):
    assert split_group_mark(stderr) == expected


def test_the_stop_command_ends_a_group_that_ignores_sigterm(tmp_path):
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & wait"], start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped at once, as sshd reaps its session's child
    time.sleep(0.2)
    started = time.monotonic()
    done = subprocess.run(["sh", "-c", stop_group_command(proc.pid, term_wait_s=0.5)], timeout=30)
    proc.wait(timeout=5)
    assert done.returncode == 0 and time.monotonic() - started < 3
    assert subprocess.run(["sh", "-c", stop_group_command(proc.pid)], timeout=10).returncode == 0  # gone already
