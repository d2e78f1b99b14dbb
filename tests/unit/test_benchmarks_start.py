"""Every benchmark script still starts: its imports resolve and its options parse (--help).

The benchmarks are not collected by pytest (bench_*.py) and need the sandbox's lock and minutes to
run, so a refactor can break one silently (bench_doctor.py imported a lock constant that had moved).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_imports_and_parses_its_options(path):
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
