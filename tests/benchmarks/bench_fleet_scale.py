"""Benchmark: deployctl's own CPU per extra host for `plan` (issue 37's fleet-scale goal: at most 5 ms).

    python tests/benchmarks/bench_fleet_scale.py [--hosts 1 12 100] [--repeat 3] [--fleet]

Not collected by pytest (bench_*.py). `plan` reads no host (ssh_config off here), so it needs no
sandbox: for each host count it writes a config of that many hosts in one group, runs
``deployctl plan`` (``--fleet``: behind a router on the first host, ``up --dry-run``: the run-level
phases too) in a fresh interpreter ``--repeat`` times and takes the median of the child's user+system
CPU (``resource.getrusage(RUSAGE_CHILDREN)``). Prints a Markdown table and the CPU per extra host
between the smallest and the largest count.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def config(n: int, fleet: bool) -> str:
    hosts = "\n".join(f"  - {{name: h{i}, address: 10.0.{i // 250}.{i % 250 + 1}, groups: [g]}}" for i in range(n))
    router = "    router: {host: h0}\n    serve_host: 0.0.0.0\n" if fleet else ""
    return (f"ssh:\n  config_file: none\nhosts:\n{hosts}\nruns:\n  - name: r\n    group: g\n"
            f"    base_model: /m\n    drafter: /d\n{router}")


def cpu_of(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=os.environ | {"COLUMNS": "120"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 12, 100])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fleet", action="store_true")
    args = parser.parse_args()
    deployctl = [sys.executable, "-m", "deploy"]
    verb = ["up", "--dry-run"] if args.fleet else ["plan"]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.hosts:
            path = Path(scratch) / f"c{n}.yaml"
            path.write_text(config(n, args.fleet))
            rows.append((n, statistics.median(cpu_of([*deployctl, "-c", str(path), *verb])
                                              for _ in range(args.repeat))))
    print(f"| hosts | `{' '.join(verb)}` CPU (median of {args.repeat}) |\n|---:|---:|")
    for n, cpu in rows:
        print(f"| {n} | {cpu * 1000:.0f} ms |")
    (n0, c0), (n1, c1) = rows[0], rows[-1]
    print(f"\nper extra host: {(c1 - c0) / (n1 - n0) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
