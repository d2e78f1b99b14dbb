"""Benchmark: one SSH command's round trip, with Nagle's algorithm on (paramiko's default) and off.

    python tests/benchmarks/bench_command_latency.py [-c .sandbox/deployctl.yaml] [--commands 50] [--repeat 3]

Not collected by pytest (bench_*.py). Run it after the README's demo: it connects to the demo's
sandbox host (the first host of CONFIG; it changes nothing there) and, per round, runs ``true``
``--commands`` times on one connection through deployctl's transport (``HostConnection.run``: one
exec channel each, bounded on the host by coreutils ``timeout``), once with TCP_NODELAY as
``deploy/ssh/hop.py`` sets it and once with it cleared. Prints a Markdown table: the median and
min per command over ``--repeat`` rounds, and the CPU this process spent per command.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.config import load_config  # noqa: E402
from deploy.ssh.transport import HostConnection  # noqa: E402


def one_round(config, nodelay: bool, commands: int) -> tuple[float, float]:
    """(wall seconds per command, this process's CPU seconds per command)."""
    host = config.hosts[0]
    with HostConnection(host, config.ssh) as conn:
        conn.connect()
        sock = conn._live().client.get_transport().sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if nodelay else 0)
        conn.run("true")  # warm: the first channel pays the session's set-up
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        started = time.monotonic()
        for _ in range(commands):
            conn.run("true")
        wall = (time.monotonic() - started) / commands
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return wall, (usage.ru_utime + usage.ru_stime - cpu) / commands


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", default=str(REPO / ".sandbox" / "deployctl.yaml"))
    parser.add_argument("--commands", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = load_config(Path(args.config))
    print("| TCP_NODELAY | per command, median | min | deployctl's CPU per command |")
    print("|---|---:|---:|---:|")
    for nodelay in (False, True):
        rounds = [one_round(config, nodelay, args.commands) for _ in range(args.repeat)]
        walls = [w for w, _ in rounds]
        print(f"| {'on (deploy/ssh/hop.py)' if nodelay else 'off (paramiko default)'} | "
              f"{statistics.median(walls) * 1000:.1f} ms | {min(walls) * 1000:.1f} ms | "
              f"{statistics.median(c for _, c in rounds) * 1000:.1f} ms |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
