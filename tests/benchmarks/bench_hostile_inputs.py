"""How fast and how lean bad inputs are refused: wall time and peak RSS of `deployctl -c FILE plan`
(a fresh process each, as a user runs it), and of the key fixer on hostile checkpoints.

    python tests/benchmarks/bench_hostile_inputs.py

Before the limits, a 50 MB config took 124 s and 2.7 GB (the hostile-input pass behind issue 10).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def measure(argv: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit code) of one child process."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.chdir(REPO)
        os.execv(sys.executable, [sys.executable, *argv])
    _, status, usage = os.wait4(pid, 0)
    return time.monotonic() - started, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    cases = {}
    big = work / "50mb.yaml"
    with open(big, "w") as handle:
        handle.write("hosts:\n")
        line = "  - {name: h, address: 10.0.0.1}\n"
        handle.write(line * ((50 << 20) // len(line)))
    cases["config 50 MB"] = ["-m", "deploy", "-c", str(big), "plan"]
    under = work / "1mib.yaml"
    lines = ["hosts:\n"]
    size = 7
    i = 0
    while True:
        entry = f"  - {{name: h{i}, address: 10.0.{i // 250 % 250}.{i % 250 + 1}}}\n"
        if size + len(entry) > (1 << 20):
            break
        lines.append(entry)
        size += len(entry)
        i += 1
    under.write_text("".join(lines))
    cases[f"config just under 1 MiB ({i} hosts, valid YAML)"] = ["-m", "deploy", "-c", str(under), "plan"]
    deep = work / "deep.yaml"
    deep.write_text("hosts: " + "[" * 500000 + "]" * 500000 + "\n")
    cases["config nested 500k deep (1 MB)"] = ["-m", "deploy", "-c", str(deep), "plan"]
    bomb = work / "bomb.yaml"
    bomb.write_text("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9)) + "hosts: *a8\n")
    cases["config alias bomb (10^9 nodes expanded)"] = ["-m", "deploy", "-c", str(bomb), "plan"]
    ckpt = work / "ckpt"
    ckpt.mkdir()
    header = b"[" * 50_000_000 + b"]" * 50_000_000
    with open(ckpt / "model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
    cases["safetensors header nested 50M deep (100 MB)"] = ["-m", "deploy", "fix-keys", "--check", str(ckpt)]
    print("| input | exit | wall time | peak RSS |")
    print("|---|---:|---:|---:|")
    for name, argv in cases.items():
        wall, rss, code = measure(argv)
        print(f"| {name} | {code} | {wall:.2f} s | {rss:.0f} MiB |")


if __name__ == "__main__":
    main()
