"""Which sockets listen on a TCP port of this host, and which processes hold them (standard
library, Python 3.8+, imports nothing of deploy): the kernel's listening sockets, and the
/proc/*/fd socket inodes of the processes this user can read.

The listeners come from the kernel's socket diagnostics (NETLINK_SOCK_DIAG, the interface ``ss -ltn``
uses) asked for TCP_LISTEN only, so the kernel walks its listening hash alone. /proc/net/tcp{,6},
the fallback, walks every bucket of the established hash on each read, however few sockets there
are: 3.4 ms of CPU per file on a 2-core VM whose table has 262,144 buckets (Linux 6.18, 2026-12-07;
the table grows with memory, so a GPU host's is larger), read on every doctor run and every router
check. Any answer from netlink not exactly as expected (no netlink, a refused family, a short or
foreign message, a time or size bound) falls back to /proc for that family, which is what decides
"IPv6 disabled".

Used on the host by doctor_facts.py (the serve and dist-init ports) and fleet_ops.py (every port
the router binds), both sent inline with this module (deploy/facts/inline.py).
"""

import os
import socket
import struct
import time


def _error(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def _hex_address(text):
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    words = struct.unpack("<4I", raw)  # /proc/net/tcp6 prints each 32-bit word in host order
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h, net/tcp_states.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_TCP_LISTEN = 10
_NLMSG_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
# inet_diag_msg: family, state, timer, retrans, sockid (sport, dport: big-endian; src, dst; if; cookie),
# expires, rqueue, wqueue, uid, inode
_MESSAGE = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
#: bounds on one dump: a host with more listeners than this, or slower, is read from /proc
_DIAG_MAX_BYTES = 16 << 20
_DIAG_TIMEOUT_S = 5.0


class _DiagUnusable(Exception):
    """Netlink did not answer as expected: read /proc/net/tcp{,6} instead."""


def _dump_request(family, seq):
    """The netlink message asking for every TCP_LISTEN socket of ``family``."""
    request = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN, b"\0" * 48)
    return _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY,
                              _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0) + request


def _diag_listeners(family, port):
    """LISTEN sockets of ``family`` on ``port`` from one NETLINK_SOCK_DIAG dump of TCP_LISTEN."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    except (AttributeError, OSError) as exc:
        raise _DiagUnusable(exc)
    seq = 1
    width = 4 if family == socket.AF_INET else 16
    found = []
    try:
        deadline = time.monotonic() + _DIAG_TIMEOUT_S
        sock.settimeout(_DIAG_TIMEOUT_S)
        sock.sendto(_dump_request(family, seq), (0, 0))
        received = 0
        while True:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            data = sock.recv(1 << 16)
            received += len(data)
            if not data or received > _DIAG_MAX_BYTES:
                raise _DiagUnusable("empty or oversized answer")
            offset = 0
            while offset < len(data):
                if len(data) - offset < _NLMSG_HEADER.size:
                    raise _DiagUnusable("short message header")
                length, kind, _, got_seq, _ = _NLMSG_HEADER.unpack_from(data, offset)
                if length < _NLMSG_HEADER.size or offset + length > len(data) or got_seq != seq:
                    raise _DiagUnusable("malformed or foreign message")
                if kind == _NLMSG_DONE:
                    return found
                if kind != _SOCK_DIAG_BY_FAMILY or length < _NLMSG_HEADER.size + _MESSAGE.size:
                    raise _DiagUnusable("message type %d" % kind)  # NLMSG_ERROR included
                (got_family, state, _, _, sport, _, src, _, _, _, _, _, _, uid,
                 inode) = _MESSAGE.unpack_from(data, offset + _NLMSG_HEADER.size)
                if got_family != family or state != _TCP_LISTEN:
                    raise _DiagUnusable("family %d state %d" % (got_family, state))
                if int.from_bytes(sport, "big") == port:
                    found.append({"address": socket.inet_ntop(family, src[:width]), "inode": inode, "uid": uid})
                offset += (length + 3) & ~3  # NLMSG_ALIGN
    except (OSError, ValueError, struct.error) as exc:
        raise _DiagUnusable(exc)
    finally:
        sock.close()


def listeners(port):
    """Sockets in LISTEN on ``port``: address, inode and owner uid (socket diagnostics, else /proc)."""
    found, errors = [], []
    for family, table in ((socket.AF_INET, "/proc/net/tcp"), (socket.AF_INET6, "/proc/net/tcp6")):
        try:
            found.extend(_diag_listeners(family, port))
            continue
        except _DiagUnusable:
            pass
        _proc_listeners(table, port, found, errors)
    return found, errors


def _proc_listeners(table, port, found, errors):
    """The LISTEN (0A) rows of /proc/net/tcp or tcp6 on ``port``, into ``found``."""
    try:
        with open(table) as handle:
            lines = handle.read().splitlines()[1:]
    except OSError as exc:
        if table.endswith("6") and not os.path.exists(table):
            return  # IPv6 disabled
        errors.append("%s: %s" % (table, _error(exc)))
        return
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":
            continue
        address, _, port_hex = fields[1].rpartition(":")
        if int(port_hex, 16) != port:
            continue
        # the socket's owner (uid column): a holder this user cannot see in /proc is another user's
        # process, or one of this user's in another PID namespace (a container) when it is this uid
        found.append({"address": _hex_address(address), "inode": int(fields[9]), "uid": int(fields[7])})


def socket_owners(inodes):
    """pid -> inode for every process whose fds this user can read that hold one of ``inodes``."""
    wanted = dict(("socket:[%d]" % i, i) for i in inodes)
    owners = {}
    if not wanted:
        return owners
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir("/proc/%s/fd" % entry)
        except OSError:
            continue  # another user's process, or gone
        for fd in fds:
            try:
                inode = wanted.get(os.readlink("/proc/%s/fd/%s" % (entry, fd)))
            except OSError:
                continue
            if inode is not None:
                owners.setdefault(int(entry), set()).add(inode)
    return owners
