"""sandbox/sim_network.c: a sandbox host's own network stack hides the other hosts' sockets from the
kernel's socket diagnostics (netlink, what deploy/remote/listeners.py asks first) exactly as it hides
them from /proc/net/tcp{,6}; the same listeners either way, over generated sets of real listeners."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.hosts import _build_network_shim

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, socket, sys
sys.path.insert(0, sys.argv[1])
import listeners as L
out = {}
for port in map(int, sys.argv[2:]):
    found, errors = [], []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        L._proc_listeners(table, port, found, errors)
    diag = L._diag_listeners(socket.AF_INET, port) + L._diag_listeners(socket.AF_INET6, port)
    out[port] = [sorted((f["address"], f["inode"]) for f in diag), sorted((f["address"], f["inode"]) for f in found)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    built = _build_network_shim(tmp_path_factory.mktemp("shim"))
    if built is None:
        if os.environ.get("DEPLOYCTL_TEST_REQUIRE_SANDBOX") == "1":
            pytest.fail("no C compiler: run tests/bootstrap.sh")
        pytest.skip("no C compiler")
    return built


def listen(address: str, port: int, family: int = socket.AF_INET) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.bind((address, port))
    sock.listen()
    return sock


@pytest.mark.parametrize("seed", range(6))
def test_a_host_sees_its_own_and_the_wildcard_listeners_both_ways(shim, seed):
    rng = random.Random(seed)
    own = f"127.{rng.randrange(100, 200)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    keep = [listen(own, 0)]
    port = keep[0].getsockname()[1]
    expected = {own}
    try:
        for _ in range(rng.randrange(1, 5)):  # other hosts on the same port: hidden
            keep.append(listen(f"127.{rng.randrange(200, 250)}.{rng.randrange(256)}.{rng.randrange(1, 255)}", port))
        wildcard = None
        if rng.random() < 0.5:  # a process outside the sandbox on every address: a real host shares it
            try:
                wildcard = listen("0.0.0.0", 0)
                keep.append(wildcard)
            except OSError:
                pass
        # enough other listeners that the dump spans several reads, some holding nobody of this host
        for _ in range(rng.randrange(50, 400)):
            keep.append(listen(f"127.{rng.randrange(200, 250)}.{rng.randrange(256)}.{rng.randrange(1, 255)}", 0))
        ports = [port] + ([wildcard.getsockname()[1]] if wildcard else [])
        env = {**os.environ, "LD_PRELOAD": str(shim), "SANDBOX_OWN_ADDRESS": own}
        done = subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM, str(REPO / "deploy" / "remote"),
                               *map(str, ports)], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        diag, proc = answer[str(port)]
        assert diag == proc and {address for address, _ in diag} == expected, answer
        if wildcard:
            diag, proc = answer[str(ports[1])]
            assert diag == proc and [address for address, _ in diag] == ["0.0.0.0"], answer
    finally:
        for sock in keep:
            sock.close()
