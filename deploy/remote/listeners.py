"""Which sockets listen on a TCP port of this host, and which processes hold them (standard
library, Python 3.8+, imports nothing of deploy): /proc/net/tcp{,6} LISTEN rows and the
/proc/*/fd socket inodes of the processes this user can read.

Used on the host by doctor_facts.py (the serve and dist-init ports) and fleet_ops.py (every port
the router binds), both sent inline with this module (deploy/facts/inline.py).
"""

import os
import socket
import struct


def _error(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def _hex_address(text):
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    words = struct.unpack("<4I", raw)  # /proc/net/tcp6 prints each 32-bit word in host order
    return socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))


def listeners(port):
    """Sockets in LISTEN (state 0A) on ``port``: address, inode and owner uid, from /proc/net/tcp{,6}."""
    found, errors = [], []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError as exc:
            if table.endswith("6") and not os.path.exists(table):
                continue  # IPv6 disabled
            errors.append("%s: %s" % (table, _error(exc)))
            continue
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
    return found, errors


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
