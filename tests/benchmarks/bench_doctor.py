"""Benchmark: `deployctl doctor` wall time and remote commands per host, on the sandbox.

    .venv/bin/python tests/benchmarks/bench_doctor.py [--hosts 1 3] [--repeat 5]

Starts the test sandbox (real sshd, SIMULATED GPUs and SGLang; takes the same machine-wide lock
as the test suite), runs `deployctl doctor --json` REPEAT times per host count and prints the
median wall time, the remote commands each host ran (counted at the transport) and the time the
host-side part took. It also times, on a sandbox host, reading SGLang's version the way deployctl
does (package metadata) against `import sglang` (the stand-in sleeps like a real install does).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import threading
import time
import yaml
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.cli.main import main  # noqa: E402
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from deploy.ssh.transport import HostConnection  # noqa: E402
from sandbox.machine_lock import machine_lock  # noqa: E402
from tests.conftest import LOCK_WAIT_S, SANDBOX_ROOT  # noqa: E402

NAMES = ("sb1", "sb2", "sb3")


def counting_transport():
    counts: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    lock = threading.Lock()
    original = HostConnection.run

    def run(self, command, *, timeout=None):
        result = original(self, command, timeout=timeout)
        with lock:
            counts[self.host.name] += 1
            seconds[self.host.name] += result.duration_s
        return result

    HostConnection.run = run
    return counts, seconds


def doctor_once(config: Path) -> tuple[float, int, dict]:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["-c", str(config), "doctor", "--json"])
    return time.perf_counter() - started, code, json.loads(out.getvalue())


def main_bench() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with machine_lock(LOCK_WAIT_S, poll_s=0.5):
        sandbox = start_sandbox(SANDBOX_ROOT, NAMES[:max(args.hosts)], gpus=8, stop_at_exit=True)
        try:
            counts, seconds = counting_transport()
            base = json.loads(json.dumps(yaml.safe_load(Path(sandbox.config_path).read_text())))
            rows = []
            for n in args.hosts:
                config = dict(base, runs=[dict(base["runs"][0], group=None, hosts=list(NAMES[:n]))])
                path = SANDBOX_ROOT / f"bench-doctor-{n}.yaml"
                path.write_text(yaml.safe_dump(config))
                walls = []
                for _ in range(args.repeat):
                    counts.clear()
                    seconds.clear()
                    wall, code, doc = doctor_once(path)
                    assert code == 0, json.dumps(doc, indent=1)
                    walls.append(wall)
                    per_host = set(counts.values())
                rows.append((n, statistics.median(walls), min(walls), max(per_host),
                             statistics.median(seconds.values())))
            print("| hosts | doctor wall time (median) | min | remote commands per host | host-side time per host |")
            print("|---:|---:|---:|---:|---:|")
            for n, median, low, commands, remote in rows:
                print(f"| {n} | {median:.2f} s | {low:.2f} s | {commands} | {remote:.2f} s |")
            for label, program in (("importlib.metadata.version('sglang')",
                                    "import importlib.metadata as m; m.version('sglang')"),
                                   ("import sglang", "import sglang")):
                times = []
                for _ in range(3):
                    started = time.perf_counter()
                    result = sandbox.run("sb1", f"python3 -c \"{program}\"", timeout=60)
                    times.append(time.perf_counter() - started)
                    assert result.returncode == 0, result.stderr
                print(f"sandbox host, ssh + `{label}`: median {statistics.median(times):.2f} s")
        finally:
            stop_sandbox(SANDBOX_ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
