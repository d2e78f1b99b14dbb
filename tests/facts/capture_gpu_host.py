"""Capture real nvidia-smi answers on a GPU machine: tests/facts/captured/nvidia-smi-<gpu>-<driver>.json.

    OUT=/some/dir python3 tests/facts/capture_gpu_host.py

Standard library only (a bare GPU machine has no pydantic, so the product's command lines are
spelled out here; tests/unit/test_gpu_facts.py asserts they equal deploy.facts.gpus's, so they
cannot drift). Each command runs for real under ``sh -c``, as the transport runs it: with the GPUs
idle, and while a child process holds a CUDA context with 8 GiB on GPU 0 (driver API through
ctypes: cuInit, cuCtxCreate, cuMemAlloc; no torch needed). Also the shapes deployctl must refuse:
the GPU query for an index that does not exist, with units, and with a header. The expected facts
in the case files (tests/facts/write_nvidia_smi_cases.py) were written by reading these raw answers,
never by running the parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

GPU_QUERY = "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"
APPS_QUERY = "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory,process_name --format=csv,noheader,nounits"
TAG = "0123456789abcdef"


def marker(query: str) -> str:
    return "printf '\\ndeployctl-gpu-status-%s %s exit %%s\\n' \"$?\"" % (TAG, query)


STATUS = f"{GPU_QUERY} 2>&1; {marker('gpus')}; {APPS_QUERY} 2>&1; {marker('apps')}"

HOLD = """import ctypes, sys
c = ctypes.CDLL("libcuda.so.1"); c.cuInit(0); d = ctypes.c_int(); c.cuDeviceGet(ctypes.byref(d), 0)
x = ctypes.c_void_p(); c.cuCtxCreate_v2(ctypes.byref(x), 0, d); p = ctypes.c_uint64()
print(c.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(8 << 30)), flush=True); sys.stdin.read()"""


def run(command: str) -> dict:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    return {"command": command, "exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def main() -> int:
    raw = {"idle_gpus": run(GPU_QUERY), "idle_apps": run(APPS_QUERY), "idle_status": run(STATUS),
           "no_such_index": run(GPU_QUERY.replace("smi ", "smi -i 7 ", 1)),
           "with_units": run(GPU_QUERY.replace(",nounits", "")),
           "with_header": run(GPU_QUERY.replace("noheader,", "")),
           "drv": run("nvidia-smi --query-gpu=driver_version,name --format=csv,noheader")}
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdin is not None
    raw["said"], raw["pid"] = holder.stdout.readline(), holder.pid  # "0": cuMemAlloc succeeded
    for _ in range(100):  # bounded: until the driver lists the process
        raw["busy_apps"] = run(APPS_QUERY)
        if str(holder.pid) in raw["busy_apps"]["stdout"]:
            break
        time.sleep(0.2)
    raw["busy_gpus"], raw["busy_status"] = run(GPU_QUERY), run(STATUS)
    holder.stdin.close()
    holder.wait(timeout=30)
    with open(os.path.join(os.environ["OUT"], "raw.json"), "w") as f:
        json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
