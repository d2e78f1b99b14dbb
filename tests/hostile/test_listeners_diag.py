"""deploy/remote/listeners.py: the kernel's socket diagnostics (netlink) give exactly /proc/net/tcp{,6}'s
listeners, over generated sets of real sockets; any answer not as expected (cut, foreign, an error, another
family or state, too large) falls back to /proc and gives its answer, never a wrong list or an exception."""

from __future__ import annotations

import random
import socket
import struct

import pytest

from deploy.remote import listeners as L


def proc_answer(port: int) -> tuple[list, list]:
    found: list = []
    errors: list = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        L._proc_listeners(table, port, found, errors)
    return found, errors


def key(found: list) -> list:
    return sorted((f["address"], f["inode"], f["uid"]) for f in found)


def _socket(family: int, reuse_port: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return sock


def generated_sockets(rng: random.Random, keep: list) -> int:
    """A port with a random mix on it: listeners on loopback v4 addresses and ::1, sockets only bound,
    a reuseport pair, a connected pair (a client's and an accepted socket, neither listening)."""
    first = _socket(socket.AF_INET)
    first.bind((f"127.{rng.randrange(1, 200)}.{rng.randrange(256)}.{rng.randrange(1, 255)}", 0))
    port = first.getsockname()[1]
    keep.append(first)
    if rng.random() < 0.8:
        first.listen()
    for _ in range(rng.randrange(0, 6)):
        family = socket.AF_INET6 if rng.random() < 0.25 else socket.AF_INET
        address = "::1" if family == socket.AF_INET6 else f"127.{rng.randrange(200, 255)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        pair = 2 if rng.random() < 0.2 else 1
        for _ in range(pair):
            sock = _socket(family, reuse_port=pair == 2)
            try:
                sock.bind((address, port))
            except OSError:  # ::1 taken by an earlier case of this port: nothing to add
                sock.close()
                continue
            keep.append(sock)
            if rng.random() < 0.7:
                sock.listen()
    if rng.random() < 0.3 and any(s.family == socket.AF_INET for s in keep):
        server = next(s for s in keep if s.family == socket.AF_INET)
        if server.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            client = socket.create_connection(server.getsockname(), timeout=5)
            keep.append(client)
            keep.append(server.accept()[0])
    return port


@pytest.mark.parametrize("seed", range(40))
def test_netlink_lists_what_proc_lists(seed):
    rng = random.Random(seed)
    keep: list = []
    try:
        port = generated_sockets(rng, keep)
        found, errors = L.listeners(port)
        want, want_errors = proc_answer(port)
        assert errors == want_errors == []
        assert key(found) == key(want), (seed, found, want)
        assert L._diag_listeners(socket.AF_INET, port) + L._diag_listeners(socket.AF_INET6, port) == found
    finally:
        for sock in keep:
            sock.close()


def test_a_port_nobody_listens_on_is_empty_both_ways():
    sock = _socket(socket.AF_INET)
    sock.bind(("127.0.0.1", 0))  # bound, never listening: the port is ours and quiet
    try:
        port = sock.getsockname()[1]
        assert L.listeners(port) == ([], []) == proc_answer(port)
    finally:
        sock.close()


class _Recorder:
    """A netlink socket that answers with ``chunks`` (bytes each recv), as the kernel would."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = list(chunks)

    def settimeout(self, _):
        pass

    def sendto(self, data, _):
        return len(data)

    def recv(self, _):
        if not self.chunks:
            raise socket.timeout("timed out")
        return self.chunks.pop(0)

    def close(self):
        pass


def real_dump(family: int) -> list[bytes]:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, L._NETLINK_SOCK_DIAG)
    try:
        sock.sendto(L._dump_request(family, 1), (0, 0))
        chunks = []
        while True:
            data = sock.recv(1 << 16)
            chunks.append(data)
            if L._NLMSG_HEADER.unpack_from(data, len(data) - 20)[1] == L._NLMSG_DONE:
                return chunks
    finally:
        sock.close()


def mutations(chunks: list[bytes], rng: random.Random):
    data = b"".join(chunks)
    header = L._NLMSG_HEADER.size
    yield "cut", [data[: rng.randrange(0, len(data))]]
    yield "no-done", [data[: len(data) - 20]]
    yield "empty", [b""]
    yield "seq", [data[:8] + struct.pack("=I", 7) + data[12:]]
    yield "error", [struct.pack("=IHHII", header + 4, L._NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -2)]
    yield "length-short", [struct.pack("=I", 8) + data[4:]]
    yield "length-long", [struct.pack("=I", len(data) + 64) + data[4:]]
    yield "family", [data[:header] + bytes([99]) + data[header + 1:]]
    yield "state", [data[:header + 1] + bytes([1]) + data[header + 2:]]
    yield "type", [data[:4] + struct.pack("=H", 77) + data[6:]]
    yield "oversized", [data[: len(data) - 20] or data[:header]] * 200  # never DONE, always more


@pytest.mark.parametrize("seed", range(12))
def test_any_answer_not_as_expected_falls_back_to_proc(monkeypatch, seed):
    rng = random.Random(seed)
    keep: list = []
    try:
        port = generated_sockets(rng, keep)
        if not any(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) for s in keep):
            keep[0].listen()
        want = proc_answer(port)
        dumps = {family: real_dump(family) for family in (socket.AF_INET, socket.AF_INET6)}
        monkeypatch.setattr(L, "_DIAG_MAX_BYTES", 64 << 10)
        for family in (socket.AF_INET, socket.AF_INET6):
            for name, answer in mutations(dumps[family], rng):
                if not answer[0] and name != "empty":
                    continue

                calls = []

                class FakeSocketModule:
                    AF_NETLINK = socket.AF_NETLINK
                    SOCK_RAW = socket.SOCK_RAW
                    AF_INET, AF_INET6, IPPROTO_TCP = socket.AF_INET, socket.AF_INET6, socket.IPPROTO_TCP
                    inet_ntop = staticmethod(socket.inet_ntop)
                    timeout = socket.timeout

                    @staticmethod
                    def socket(af, kind, proto, _answer=answer, _family=family):
                        # the mutated answer for the family under test, the kernel's for the other
                        calls.append(af)
                        return _Recorder(_answer if len(calls) == (1 if _family == socket.AF_INET else 2)
                                         else dumps[socket.AF_INET if _family == socket.AF_INET6 else socket.AF_INET6])

                monkeypatch.setattr(L, "socket", FakeSocketModule)
                try:
                    found, errors = L.listeners(port)
                finally:
                    monkeypatch.setattr(L, "socket", socket)
                assert errors == [] and key(found) == key(want[0]), (seed, name, family, found, want)
    finally:
        for sock in keep:
            sock.close()


def test_no_netlink_at_all_reads_proc(monkeypatch):
    class NoNetlink:
        AF_INET, AF_INET6 = socket.AF_INET, socket.AF_INET6
        inet_ntop = staticmethod(socket.inet_ntop)

    sock = _socket(socket.AF_INET)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    try:
        port = sock.getsockname()[1]
        want = proc_answer(port)
        monkeypatch.setattr(L, "socket", NoNetlink)  # no AF_NETLINK (another OS, a seccomp'd sandbox)
        assert L.listeners(port) == want and len(want[0]) == 1
    finally:
        sock.close()
