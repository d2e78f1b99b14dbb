"""Benchmark: N targets behind one bastion, one shared bastion connection vs one per target.

    python tests/benchmarks/bench_jump_connect.py [--targets 8] [--repeat 3]

Not collected by pytest (bench_*.py). Needs root and openssh-server (the sandbox's needs); takes
the test suite's machine-wide sandbox lock and starts the jump sandbox (bastion + two SIMULATED
GPU hosts on 127.0.0.30-32, the test suite's addresses). ``--targets`` host entries alternate
between the two targets (distinct names, so each is its own connection, as N GPU hosts would be).
For each mode it connects every target in parallel (max_parallel 8), runs ``true`` on each, and
closes: "shared" is what deployctl does (one JumpConnections per run); "per-target" gives each
HostConnection its own bastion connection (what one connection per host without sharing costs).
Prints wall time (median of --repeat) and the bastion logins counted in its sshd log.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.config.models import Host, SSHSettings  # noqa: E402
from deploy.engine.fanout import for_each_host  # noqa: E402
from sandbox.machine_lock import machine_lock
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from deploy.ssh.config import load_ssh_config  # noqa: E402
from deploy.ssh.transport import HostConnection, JumpConnections  # noqa: E402

ROOT = Path("/var/tmp/deployctl-test-sandbox-jump")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with machine_lock(1800, poll_s=0.5):
        sb = start_sandbox(ROOT, ("jump", "jt1", "jt2"), gpus=1, address_base=30, log_level="DEBUG")
        try:
            return run(sb, args.targets, args.repeat)
        finally:
            stop_sandbox(ROOT)


def run(sb, n: int, repeat: int) -> int:
    j = sb.host("jump")
    lines = [f"Host bastion\n  HostName {j.address}\n  Port {j.port}\n  User {j.user}\n"
             f"  IdentityFile {j.identity_file}\n  IdentitiesOnly yes\n"]
    for name in ("jt1", "jt2"):
        t = sb.host(name)
        lines.append(f"Host {name}\n  HostName {t.address}\n  Port {t.port}\n  User {t.user}\n"
                     f"  IdentityFile {t.identity_file}\n  IdentitiesOnly yes\n  ProxyJump bastion\n")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "ssh_config"
        cfg.write_text("".join(lines))
        ssh = SSHSettings(config_file=str(cfg), known_hosts=str(sb.known_hosts), connect_retries=0)
        source = load_ssh_config(ssh)
        hosts = [Host(name=f"gpu{i}", address=("jt1", "jt2")[i % 2]) for i in range(n)]
        rows = []
        for mode in ("shared", "per-target"):
            times, logins = [], []
            for _ in range(repeat):
                mark = sb.sshd_log("jump").stat().st_size
                started = time.monotonic()
                shared = JumpConnections() if mode == "shared" else None

                def work(host):
                    with HostConnection(host, ssh, shared, ssh_config=source) as conn:
                        return conn.check("true").exit_code

                outcomes = for_each_host(hosts, work, 8)
                if shared is not None:
                    shared.close()
                times.append(time.monotonic() - started)
                failed = [o.error for o in outcomes if o.error is not None]
                if failed:
                    print(f"{mode}: {failed[0]}", file=sys.stderr)
                    return 1
                with open(sb.sshd_log("jump"), "rb") as f:
                    f.seek(mark)
                    logins.append(f.read().decode(errors="replace").count("Accepted publickey"))
            rows.append((mode, statistics.median(times), statistics.median(logins)))
    print(f"| mode ({n} targets, one bastion) | wall time (median of {repeat}) | bastion logins |")
    print("|---|---:|---:|")
    for mode, seconds, login_count in rows:
        print(f"| {mode} | {seconds:.2f} s | {login_count:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
