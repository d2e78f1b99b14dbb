"""SIMULATION (TEST DOUBLE): each sandbox host's own network stack, for its python processes.

Installed as ``~/pylib/sitecustomize.py`` of every simulated host (on its PYTHONPATH), so every
python3 process of that host's user loads it: the stand-in SGLang, deployctl's host-side helpers,
the router's Python launcher. The sandbox hosts share this machine's one network stack; a real GPU
host has its own. Two real hosts can both bind 0.0.0.0:30000 and each answers on 127.0.0.1; here
they would collide, and host B's 127.0.0.1 would be host A's. So, for this host's processes only:

- a bind to a wildcard (0.0.0.0, "", ::) or to 127.0.0.1 binds this host's own address (what a
  real host's wildcard bind answers on from the network: its address);
- a connection to 127.0.0.1 / localhost goes to this host's own address (its loopback).

Processes that do not load this (the router's Rust core, ssh, curl) see the shared stack as it
is: a worker URL naming 127.0.0.1 reaches no replica from the router, as on a real network.
The address comes from ``$SGLANG_SIM_CONFIG`` (``address``); without it nothing changes.
"""

import json
import os
import socket

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_WILDCARD = ("0.0.0.0", "", "::")


def _own_address():
    try:
        with open(os.environ["SGLANG_SIM_CONFIG"]) as handle:
            address = json.load(handle).get("address")
    except (KeyError, OSError, ValueError):
        return None
    return address if isinstance(address, str) and address.startswith("127.") else None


def _install(own):
    original_bind, original_connect, original_connect_ex = (socket.socket.bind, socket.socket.connect,
                                                            socket.socket.connect_ex)

    def mapped(sock, address, names):
        if not isinstance(address, tuple) or address[0] not in names:
            return address
        if sock.family == socket.AF_INET6:
            return ("::ffff:" + own,) + tuple(address[1:])  # a v4-mapped address on a dual-stack socket
        return (own,) + tuple(address[1:])

    def bind(self, address):
        return original_bind(self, mapped(self, address, _WILDCARD + _LOOPBACK))

    def connect(self, address):
        return original_connect(self, mapped(self, address, _LOOPBACK))

    def connect_ex(self, address):
        return original_connect_ex(self, mapped(self, address, _LOOPBACK))

    socket.socket.bind, socket.socket.connect, socket.socket.connect_ex = bind, connect, connect_ex
    original_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        # "localhost" resolves here to this host's own loopback, i.e. its address
        return original_getaddrinfo(own if host in ("localhost",) else host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


_OWN = _own_address()
if _OWN is not None:
    _install(_OWN)
