"""A hop's channel on the shared jump connection: its CLOSE never overtakes its data, and a connection
that died under a host does not turn the host's finished work into "internal error: EOFError".

The race (2026-12-06, tests/integration/test_proxyjump.py under load): paramiko sends a channel's DATA
and its CLOSE after releasing the channel's lock; the hop's transport thread was sending (its reply to
the target's CLOSE of the last command) while the host's thread closed the hop, the CLOSE went first,
and OpenSSH's sshd on the jump host dropped the whole bastion connection ("data packet referred to
nonexistent channel"), failing the other hosts behind it. The fake channel below records what reaches
the wire, and holds a send between building its message and sending it, where paramiko releases the lock.
"""

from __future__ import annotations

import threading

import pytest

from deploy.config.models import Host, SSHSettings
from deploy.ssh.hop import JumpConnections, OrderedChannel
from deploy.ssh.transport import HostConnection


class WireChannel:
    """Records the messages in the order they reach the wire; ``send`` waits at paramiko's gap."""

    def __init__(self):
        self.wire: list[str] = []
        self.in_gap = threading.Event()
        self.leave_gap = threading.Event()
        self.timeout = None

    def send(self, data: bytes) -> int:
        self.in_gap.set()  # the message is built, the channel's lock released
        assert self.leave_gap.wait(10)
        self.wire.append("DATA")
        return len(data)

    def close(self) -> None:
        self.wire.append("CLOSE")

    def settimeout(self, timeout):
        self.timeout = timeout


def race(channel) -> tuple[list[str], bool]:
    """A send caught in its gap, a close from another thread; whether the close waited for it."""
    raw = channel._channel if isinstance(channel, OrderedChannel) else channel
    sender = threading.Thread(target=channel.send, args=(b"x",))
    sender.start()
    assert raw.in_gap.wait(10)
    closer = threading.Thread(target=channel.close)
    closer.start()
    closer.join(0.3)  # bounded: a close that does not wait is done at once
    waited = closer.is_alive()
    raw.leave_gap.set()
    sender.join(10)
    closer.join(10)
    return raw.wire, waited


def test_a_bare_channel_lets_the_close_overtake_the_data():
    """The fault itself (what paramiko's channel does), so the next test is known to test something."""
    wire, waited = race(WireChannel())
    assert wire == ["CLOSE", "DATA"] and not waited


def test_the_hop_channel_sends_its_close_after_the_data_in_flight():
    wire, waited = race(OrderedChannel(WireChannel()))
    assert wire == ["DATA", "CLOSE"] and waited


def test_the_hop_channel_is_otherwise_the_channel():
    raw = WireChannel()
    ordered = OrderedChannel(raw)
    ordered.settimeout(0.1)
    assert raw.timeout == 0.1


class DeadConnection:
    def __init__(self, error: BaseException):
        self.error, self.closed = error, False

    def close(self):
        self.closed = True
        raise self.error


@pytest.mark.parametrize("error", [EOFError(), OSError("Socket is closed"), ConnectionResetError()],
                         ids=["eof", "oserror", "reset"])
def test_closing_a_connection_that_died_under_the_host_is_quiet(error):
    conn = HostConnection(Host(name="h1", address="127.0.0.1", user="u"), SSHSettings())
    dead = DeadConnection(error)
    conn._conn = dead
    conn.close()
    assert dead.closed and conn._conn is None


def test_closing_the_jump_hops_goes_on_past_a_dead_one():
    jumps = JumpConnections()
    inner, outer = DeadConnection(EOFError()), DeadConnection(EOFError())
    jumps._conns = {"outer": outer, "inner": inner}
    jumps._order = ["outer", "inner"]
    jumps.close()
    assert inner.closed and outer.closed and not jumps._conns
