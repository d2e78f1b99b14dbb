"""Benchmark: `deployctl status` wall time and remote commands per host, on the sandbox.

    .venv/bin/python tests/benchmarks/bench_status.py [--hosts 1 3] [--repeat 5]

Starts the test sandbox (real sshd, SIMULATED GPUs and SGLang; takes the same machine-wide lock
as the test suite), deploys on every host (`up`), then runs `deployctl status --json` REPEAT times
per host count and window (and once per repeat with `--probe`), in-process, and prints the median
wall time and the remote commands each host ran (counted at the transport). The window is the
time between the two reads of the server's counters: the wall time is that plus SSH and parsing.
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
from collections import Counter
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.cli.main import main  # noqa: E402
from deploy.ssh.transport import HostConnection  # noqa: E402
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from sandbox.machine_lock import machine_lock  # noqa: E402
from tests.conftest import LOCK_WAIT_S, SANDBOX_ROOT  # noqa: E402

NAMES = ("sb1", "sb2", "sb3")


def counting_transport() -> Counter[str]:
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    original = HostConnection.run

    def run(self, command, *, timeout=None):
        result = original(self, command, timeout=timeout)
        with lock:
            counts[self.host.name] += 1
        return result

    HostConnection.run = run  # type: ignore[method-assign]
    return counts


def once(argv: list[str]) -> tuple[float, int, dict]:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return time.perf_counter() - started, code, json.loads(out.getvalue())


def main_bench() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with machine_lock(LOCK_WAIT_S, poll_s=0.5):
        sandbox = start_sandbox(SANDBOX_ROOT, NAMES[:max(args.hosts)], gpus=8, stop_at_exit=True)
        try:
            base = yaml.safe_load(Path(sandbox.config_path).read_text())
            everyone = SANDBOX_ROOT / "bench-status-all.yaml"
            everyone.write_text(yaml.safe_dump(dict(base, runs=[dict(base["runs"][0], group=None,
                                                                     hosts=list(NAMES[:max(args.hosts)]))])))
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["-c", str(everyone), "up", "--json"]) == 0, "up failed"
            counts = counting_transport()
            print("| hosts | flags | wall time (median) | min | remote commands per host | verdicts |")
            print("|---:|---|---:|---:|---:|---|")
            for n in args.hosts:
                path = SANDBOX_ROOT / f"bench-status-{n}.yaml"
                path.write_text(yaml.safe_dump(dict(base, runs=[dict(base["runs"][0], group=None,
                                                                     hosts=list(NAMES[:n]))])))
                for flags in (["--window", "2"], ["--window", "0.2"], ["--window", "0.2", "--probe"]):
                    walls, verdicts = [], set()
                    for _ in range(args.repeat):
                        counts.clear()
                        wall, code, doc = once(["-c", str(path), "status", "--json", "--check", *flags])
                        assert code == 0, json.dumps(doc)[:2000]
                        assert set(counts.values()) == {1} and len(counts) == n, counts
                        walls.append(wall)
                        verdicts |= {h["verdict"] for h in doc["hosts"]}
                    print(f"| {n} | {' '.join(flags)} | {statistics.median(walls):.2f} s | {min(walls):.2f} s | 1 "
                          f"| {', '.join(sorted(verdicts))} |")
        finally:
            stop_sandbox(SANDBOX_ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
