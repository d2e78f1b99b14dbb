"""Every read bounded in bytes and time, and interruptible: remote answers (the transport's channel),
host-side loops (watch-gpus, doctor facts), ssh_config files and Includes, the ssh-agent.

Generated: each producer (endless stdout, endless stderr, one endless line, silence) against each
reader; each kind of non-regular file in each place a file is read. Ctrl-C (SIGINT) during a
blocked read ends it within a second.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.ssh import bounded_channel
from deploy.base.errors import ConnectionFailed, ExitCode, RemoteOutputError
from deploy.remote import doctor_facts, host_ops


class FakeChannel:
    """The paramiko Channel surface exec_bounded and _watch use; ``produce`` says what the host prints."""

    def __init__(self, produce: str, exit_after: int | None = None):
        self.produce = produce
        self.sent = 0
        self.exit_after = exit_after
        self.closed = False
        self.eof_received = False
        self.status_event = threading.Event()
        self.command = None
        # paramiko's BufferedPipe.set_event: this host's data is always ready (or never), so the
        # event is never waited on for it
        self.in_buffer = self.in_stderr_buffer = SimpleNamespace(set_event=lambda event: None)

    def settimeout(self, t):
        pass

    def exec_command(self, command):
        self.command = command

    def _chunk(self, stream):
        if self.exit_after is not None and self.sent >= self.exit_after:
            self.eof_received = True
            self.status_event.set()
            return b""
        if self.produce == "silence":
            return b""
        if (stream == "err") != (self.produce == "stderr"):
            return b""
        chunk = b"x" * 65536 if self.produce in ("stdout", "stderr", "line") else b"ok\n" * 1000
        self.sent += len(chunk)
        return chunk

    def recv_ready(self):
        return self.produce in ("stdout", "line", "lines") and not self.eof_received

    def recv_stderr_ready(self):
        return self.produce == "stderr" and not self.eof_received

    def recv(self, n):
        if self.produce == "silence":
            time.sleep(0.01)
            raise socket.timeout()
        return self._chunk("out")

    def recv_stderr(self, n):
        return self._chunk("err")

    def exit_status_ready(self):
        return self.status_event.is_set()

    def recv_exit_status(self):
        return 0

    def close(self):
        self.closed = True

    def shutdown_write(self):
        pass


@pytest.mark.parametrize("produce", ["stdout", "stderr"])
@pytest.mark.parametrize("limit", [1 << 10, 1 << 16, 1 << 20, bounded_channel.MAX_OUTPUT_BYTES])
def test_endless_answer_is_refused_past_the_limit(produce, limit):
    channel = FakeChannel(produce)
    started = time.monotonic()
    with pytest.raises(bounded_channel.OutputTooLarge) as caught:
        bounded_channel.exec_bounded(channel, "nvidia-smi", deadline=time.monotonic() + 60, limit=limit)
    assert caught.value.stream == produce
    assert channel.sent <= limit + (1 << 17)  # read at most a chunk past the limit
    assert time.monotonic() - started < 10


def test_silence_ends_at_the_deadline():
    channel = FakeChannel("silence")
    started = time.monotonic()
    with pytest.raises(bounded_channel.DeadlinePassed):
        bounded_channel.exec_bounded(channel, "sleep", deadline=time.monotonic() + 0.3)
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("size", [0, 3000, 1 << 20])
def test_normal_answer_is_whole(size):
    channel = FakeChannel("lines", exit_after=size)
    status, out, err = bounded_channel.exec_bounded(channel, "x", deadline=time.monotonic() + 30)
    assert status == 0 and len(out) >= size and err == b""


def _connection(channel):
    """A HostConnection whose SSH session hands out ``channel`` (the wire, faked; the logic real)."""
    from deploy.config.models import Host, SSHSettings
    from deploy.ssh.transport import HostConnection

    conn = HostConnection(Host(name="gpu-a", address="127.0.0.1"), SSHSettings(config_file="none"))
    session = type("T", (), {"open_session": lambda self, timeout=None: channel})()
    client = type("C", (), {"get_transport": lambda self: session})()
    conn._live = lambda: type("F", (), {"client": client})()  # type: ignore[method-assign]
    return conn


@pytest.mark.parametrize("produce", ["stdout", "stderr"])
def test_transport_run_maps_a_huge_answer_to_exit_5(produce):
    channel = FakeChannel(produce)
    with pytest.raises(RemoteOutputError) as caught:
        _connection(channel).run("nvidia-smi --query-gpu=index --format=csv", timeout=30)
    assert caught.value.exit_code == ExitCode.REMOTE_OUTPUT
    assert "gpu-a" in str(caught.value) and "nvidia-smi" in str(caught.value) and "bytes" in str(caught.value)
    assert channel.closed


def test_watch_refuses_an_endless_line():
    channel = FakeChannel("line")
    with pytest.raises(RemoteOutputError) as caught:
        _connection(channel).watch("loop", lambda line: False, timeout=30, cancelled=threading.Event())
    assert "line of more than" in str(caught.value) and channel.closed


def _interrupt_after(seconds: float):
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt in this process for the test, whatever it inherited: a pytest
    started in the background by a non-interactive shell (`bash script &`) has SIGINT ignored, Python
    keeps an inherited SIG_IGN, and these tests then waited out their commands' timeouts (610 s and
    30 s in one fresh-clone run) instead of testing the interrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_ends_a_silent_remote_command_within_a_second(sigint_raises):
    channel = FakeChannel("silence")
    timer = _interrupt_after(0.3)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _connection(channel).run("sleep 600", timeout=20)  # a missed interrupt fails in 30 s, not 610
    timer.cancel()
    assert time.monotonic() - started < 1.3 and channel.closed


# --- host side: the watch loop's queries, doctor's files ------------------------------------------
@pytest.mark.parametrize("script,code,fragment", [
    ("head -c 100000000 /dev/zero", 125, "more than"),
    ("head -c 100000000 /dev/zero >&2", 125, "more than"),
    ("yes", 125, "more than"),
    ("sleep 30", 124, "did not answer"),
    ("exec 1>&-; sleep 30", 124, "did not answer"),
    ("echo fine; exit 0", 0, ""),
    ("echo failed >&2; exit 9", 9, "failed"),
])
def test_host_side_query_bounded(script, code, fragment):
    started = time.monotonic()
    done = host_ops.run_bounded(["sh", "-c", script], 1.0, limit=1 << 20)
    assert time.monotonic() - started < 8
    assert done["exit_code"] == code and fragment in done["stderr"] + done["stdout"]
    assert len(done["stdout"]) <= 1 << 20


def _fifo(path: Path):
    os.mkfifo(path)


def _dir(path: Path):
    path.mkdir()


def _zero(path: Path):
    path.symlink_to("/dev/zero")


def _sock(path: Path):
    # bound by its name from its directory: an AF_UNIX path is at most 107 bytes, and an xdist
    # worker's tmp_path alone can come close
    s, cwd = socket.socket(socket.AF_UNIX), os.getcwd()
    os.chdir(path.parent)
    try:
        s.bind(path.name)
    finally:
        os.chdir(cwd)
        s.close()


NOT_REGULAR = {"fifo": _fifo, "directory": _dir, "dev-zero": _zero, "socket": _sock}


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "model.safetensors.index.json"])
def test_doctor_facts_drafter_file_not_regular(tmp_path, kind, name):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    NOT_REGULAR[kind](drafter / name)
    started = time.monotonic()
    facts = doctor_facts.model_dir(str(drafter), tensors=True)
    assert time.monotonic() - started < 5
    if name == "config.json":
        assert "regular file" in (facts["config_error"] or "") or "directory" in (facts["config_error"] or "")
    elif name == "model.safetensors":
        assert facts["files"].get(name) is None and name in (facts["files_error"] or "")
        assert str(drafter / name) in facts["files_error"] or "regular" in facts["files_error"]


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_doctor_facts_records_not_regular(tmp_path, kind):
    path = tmp_path / "last-good.json"
    NOT_REGULAR[kind](path)
    started = time.monotonic()
    text = doctor_facts.read_record(str(path))
    assert doctor_facts.sha256_of(str(path)) is None
    assert doctor_facts.read_pid(str(path))["pid"] is None
    assert time.monotonic() - started < 5
    assert text is None or "not a regular file" in text


@pytest.mark.parametrize("depth", [1000, 100_000])
@pytest.mark.parametrize("shape", ["list", "object"])
def test_remote_last_good_nested_deep_is_exit_5(depth, shape):
    from deploy.facts.server import parse_record

    text = "[" * depth + "]" * depth if shape == "list" else '{"a":' * depth + "1" + "}" * depth
    with pytest.raises(RemoteOutputError) as caught:
        parse_record(text, "gpu-a", "/srv/d/last-good.json")
    assert "gpu-a" in str(caught.value) and "last-good.json" in str(caught.value)


def test_remote_record_command_is_bounded_and_regular_only():
    from deploy.facts.server import MAX_RECORD_BYTES, read_record_command

    command = read_record_command("/srv/d/last-good.json")
    assert f"head -c {MAX_RECORD_BYTES + 1}" in command and "[ -f " in command and "cat" not in command


# --- ssh_config and Include ---------------------------------------------------------------------
def _sparse(path: Path):
    with open(path, "wb") as handle:
        handle.truncate(8 << 20)


def _latin1(path: Path):
    path.write_bytes(b"Host caf\xe9\n  HostName 10.0.0.1\n")


def _nul_in_a_line(path: Path):
    # OpenSSH would read "HostName 10.0.0.1" and drop the rest of the line (issue 31)
    path.write_bytes(b"Host gpu-a\n  HostName 10.0.0.1\0.evil.example\n")


def _nul_only(path: Path):
    path.write_bytes(b"\0")


SSH_CONFIG_FILES = dict(NOT_REGULAR, **{"sparse-8m": _sparse, "not-utf8": _latin1, "nul-in-a-line": _nul_in_a_line,
                                        "nul-only": _nul_only})


#: an Include that names or globs a directory is skipped, as OpenSSH's readconf.c does (issue 27:
#: test_include_of_a_directory_is_skipped); as the config file itself a directory is refused
SSH_CONFIG_CASES = [(kind, where) for kind in sorted(SSH_CONFIG_FILES)
                    for where in ("config_file", "include-absolute", "include-glob")
                    if not (kind == "directory" and where != "config_file")]


@pytest.mark.parametrize("kind, where", SSH_CONFIG_CASES)
def test_ssh_config_file_or_include_unreadable_is_exit_3(tmp_path, capsys, kind, where):
    from deploy.cli.main import main
    from tests.hostile.test_config_corpus import BASE, dump

    bad = tmp_path / "ssh" / "bad.conf"
    bad.parent.mkdir()
    SSH_CONFIG_FILES[kind](bad)
    document = dict(BASE)
    if where == "config_file":
        document = BASE | {"ssh": BASE["ssh"] | {"config_file": str(bad)}}
    else:
        main_config = tmp_path / "ssh_config"
        target = str(bad) if where == "include-absolute" else str(bad.parent / "*.conf")
        main_config.write_text(f"Include {target}\nHost *\n  User x\n")
        document = BASE | {"ssh": BASE["ssh"] | {"config_file": str(main_config)}}
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(document))
    started = time.monotonic()
    code = main(["-c", str(config), "plan"])
    captured = capsys.readouterr()
    assert time.monotonic() - started < 10
    text = captured.out + captured.err
    assert "Traceback" not in text
    assert code == ExitCode.CONFIG, text
    assert str(bad) in text


# --- the ssh-agent -------------------------------------------------------------------------------
class Agent:
    """A UNIX socket at SSH_AUTH_SOCK that accepts and then behaves as ``mode`` says."""

    def __init__(self, path: Path, mode: str):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.mode = mode
        self.conns: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            if self.mode == "close":
                conn.close()
            elif self.mode == "garbage":
                conn.sendall(b"\x00\x00\x00\x05\x63hello")
            elif self.mode == "half":
                conn.sendall(b"\x00\x00")

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("mode", ["silent", "close", "garbage", "half"])
def test_agent_that_does_not_answer_is_a_clear_exit_4(tmp_path, monkeypatch, mode):
    from deploy.ssh import agent as ssh_agent

    path = tmp_path / "agent.sock"
    agent = Agent(path, mode)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(path))
    monkeypatch.setattr(ssh_agent, "AGENT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(ssh_agent, "_agent_checked", {})
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionFailed) as caught:
            ssh_agent.check_agent_answers()
    finally:
        agent.close()
    assert time.monotonic() - started < 3
    assert str(path) in str(caught.value) and caught.value.exit_code == ExitCode.CONNECTION


def test_dangling_agent_socket_is_no_agent(tmp_path, monkeypatch):
    from deploy.ssh import agent as ssh_agent

    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "gone.sock"))
    monkeypatch.setattr(ssh_agent, "_agent_checked", {})
    ssh_agent.check_agent_answers()  # no error: OpenSSH and paramiko treat it as no agent


def test_ctrl_c_during_a_silent_agent_within_a_second(tmp_path, monkeypatch, sigint_raises):
    from deploy.ssh import agent as ssh_agent

    path = tmp_path / "agent.sock"
    agent = Agent(path, "silent")
    monkeypatch.setenv("SSH_AUTH_SOCK", str(path))
    monkeypatch.setattr(ssh_agent, "AGENT_TIMEOUT_S", 30.0)
    monkeypatch.setattr(ssh_agent, "_agent_checked", {})
    timer = _interrupt_after(0.3)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            ssh_agent.check_agent_answers()
    finally:
        timer.cancel()
        agent.close()
    assert time.monotonic() - started < 1.3


@pytest.mark.parametrize("where", ["include-absolute", "include-glob"])
def test_include_of_a_directory_is_skipped(tmp_path, capsys, where):
    """readconf.c globs an Include's argument and skips what is a directory (issue 27: deployctl refused
    what ssh accepts); the rest of the file still applies."""
    from deploy.cli.main import main
    from tests.hostile.test_config_corpus import BASE, dump

    bad = tmp_path / "inc" / "a.conf"
    bad.parent.mkdir()
    bad.mkdir()
    main_config = tmp_path / "ssh_config"
    target = str(bad) if where == "include-absolute" else str(bad.parent / "*.conf")
    main_config.write_text(f"Include {target}\nHost *\n  User x\n")
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE | {"ssh": BASE["ssh"] | {"config_file": str(main_config)}}))
    code = main(["-c", str(config), "plan"])
    text = "".join(capsys.readouterr())
    assert code == 0 and "Traceback" not in text, text


def test_a_silent_command_is_not_polled_every_few_milliseconds():
    """Issue 37: at 0.02 s polls a `status` read (2.5 s of silence on each host) cost 6 ms of deployctl's
    CPU per host; a command that prints nothing waits for output, EOF or its deadline instead."""
    channel = FakeChannel("silence")
    looks = 0
    original = channel.recv_ready

    def recv_ready():
        nonlocal looks
        looks += 1
        return original()

    channel.recv_ready = recv_ready  # type: ignore[method-assign]
    with pytest.raises(bounded_channel.DeadlinePassed):
        bounded_channel.exec_bounded(channel, "sleep 1", deadline=time.monotonic() + 0.5)
    assert looks <= 4, f"{looks} looks at a silent channel in 0.5 s"
