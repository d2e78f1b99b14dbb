"""A host that accepts TCP but never speaks SSH (a network freeze): a clear message, one timeout, no retries
(issue 17: paramiko's "No existing session" after 44 s)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from deploy.config.models import Host, SSHSettings
from deploy.base.errors import ConnectionFailed
from deploy.ssh.hop import silent_server
from deploy.ssh.transport import HostConnection


@pytest.fixture
def frozen_port():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])  # held open, never a byte sent
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_silent_ssh_server_fails_once_with_a_clear_message(frozen_port, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = Host(name="frozen", address="127.0.0.1", port=frozen_port, state_dir="/var/lib/x")
    ssh = SSHSettings(config_file="none", known_hosts=str(known), connect_timeout_s=1, connect_retries=3)
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as failed:
        HostConnection(host, ssh).connect()
    elapsed = time.monotonic() - started
    assert elapsed < 4, elapsed  # one timeout, not 4 attempts and their back-off
    text = str(failed.value)
    assert text.startswith("frozen (root@127.0.0.1:") and "sent nothing within 1 s" in text and "not retried" in text
    assert "No existing session" not in text
    assert failed.value.exit_code == 4


@pytest.mark.parametrize("message,waited,expected", [
    ("No existing session", 10.0, True), ("Error reading SSH protocol banner", 9.5, True),
    ("No existing session", 0.2, False), ("Error reading SSH protocol banner[Errno 104] reset", 0.01, False),
    ("Authentication failed", 10.0, False), ("Incompatible ssh peer", 10.0, False),
])
def test_only_a_server_silent_for_the_whole_timeout_is_not_retried(message, waited, expected):
    assert silent_server(Exception(message), waited, 10.0) is expected
