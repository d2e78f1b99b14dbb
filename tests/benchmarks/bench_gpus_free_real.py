"""Benchmark on a REAL GPU machine: how soon wait-gpus-free's host-side loop sees the GPUs free.

    OUT=/some/dir python3 tests/benchmarks/bench_gpus_free_real.py [--rounds 5] [--interval 0.1]

Standard library only (a bare GPU host has no pydantic): it runs ``deploy/remote/host_ops.py
watch-gpus`` exactly as the step does (``python3 -I -S``, the product's two nvidia-smi queries,
spelled out here as in tests/facts/capture_gpu_host.py, whose strings a unit test pins to
deploy.facts.gpus's). Per round, a child process takes a CUDA context and 8 GiB on GPU 0 through the
driver API (ctypes: cuInit, cuCtxCreate, cuMemAlloc; no torch), the watch starts, the child is
SIGKILLed, and the time is taken from the kill until the first watch line in which every GPU reports
0 MiB used (the step's default threshold). Also: how long each nvidia-smi query takes on this driver
(the floor of one sample). Prints a Markdown table and writes bench-gpus-free-real.json under $OUT.
The sandbox version of this measurement is bench_gpus_free_reaction.py (simulated nvidia-smi).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOST_OPS = REPO / "deploy" / "remote" / "host_ops.py"
GPU_QUERY = "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
APPS_QUERY = "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv,noheader,nounits"
HOLD = """import ctypes, sys
c = ctypes.CDLL("libcuda.so.1"); c.cuInit(0); d = ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d), 0)
x = ctypes.c_void_p(); c.cuCtxCreate_v2(ctypes.byref(x), 0, d); p = ctypes.c_uint64()
print(c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(8 << 30)), flush=True); sys.stdin.read()"""


def query_ms(command: str, n: int = 10) -> float:
    times = []
    for _ in range(n):
        started = time.monotonic()
        subprocess.run(["sh", "-c", command], capture_output=True, timeout=30, check=True)
        times.append(time.monotonic() - started)
    return statistics.median(times) * 1000


def all_free(line: str) -> bool:
    document = json.loads(line)
    rows = [r for r in document["gpus"]["stdout"].splitlines() if r.strip()]
    return document["gpus"]["exit_code"] == 0 and bool(rows) and all(int(r.split(",")[2]) <= 0 for r in rows)


def one_round(interval: float) -> dict:
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    said = holder.stdout.readline().strip()
    if said != "0":
        holder.kill()
        raise SystemExit(f"cuMemAlloc failed: {said!r}")
    for _ in range(100):  # bounded: until the driver reports the memory held
        used = subprocess.run(["sh", "-c", GPU_QUERY], capture_output=True, text=True, timeout=30).stdout
        if any(int(r.split(",")[2]) > 0 for r in used.splitlines() if r.strip()):
            break
        time.sleep(0.1)
    watch = subprocess.Popen([sys.executable, "-I", "-S", str(HOST_OPS), "watch-gpus", "--gpu-query", GPU_QUERY,
                              "--apps-query", APPS_QUERY, "--interval", str(interval), "--every", "1", "--for", "60",
                              "--until-stdin-eof"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert watch.stdout is not None and watch.stdin is not None
    first = watch.stdout.readline()  # the loop runs: its first sample shows the GPU busy
    assert first and not all_free(first), first
    seen = {}
    done = threading.Event()

    def read() -> None:
        assert watch.stdout is not None
        for line in watch.stdout:
            if all_free(line):
                seen["free_at"] = time.monotonic()
                done.set()
                return
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed_at = time.monotonic()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    done.wait(60)
    watch.stdin.close()  # the step's EOF: the loop ends
    watch.wait(timeout=30)
    if "free_at" not in seen:
        raise SystemExit("the GPU never showed free within 60 s")
    return {"noticed_s": round(seen["free_at"] - killed_at, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    result = {"machine": platform.node(), "driver": driver, "python": platform.python_version(),
              "interval_s": args.interval, "gpu_query_ms": round(query_ms(GPU_QUERY), 1),
              "apps_query_ms": round(query_ms(APPS_QUERY), 1), "rounds": []}
    for _ in range(args.rounds):
        result["rounds"].append(one_round(args.interval))
    noticed = [r["noticed_s"] for r in result["rounds"]]
    result["median_s"], result["max_s"], result["min_s"] = statistics.median(noticed), max(noticed), min(noticed)
    print(f"| GPU (driver) | GPU query | apps query | GPUs free noticed after SIGKILL, {args.rounds} rounds |")
    print("|---|---:|---:|---:|")
    print(f"| {'; '.join(driver)} | {result['gpu_query_ms']} ms | {result['apps_query_ms']} ms | median "
          f"{result['median_s']:.3f} s, min {result['min_s']:.3f} s, max {result['max_s']:.3f} s |")
    out = os.environ.get("OUT")
    if out:
        Path(out, "bench-gpus-free-real.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
