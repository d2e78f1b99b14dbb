"""Write the nvidia-smi cases: tests/facts/{nvidia_smi_gpus,nvidia_smi_apps,gpu_status}/<case>.json.

    .venv/bin/python tests/facts/write_nvidia_smi_cases.py

Two kinds of case, each saying where it comes from ("source"):

- captured: the answers of a real NVIDIA H200 (driver 580.159.04) to the product's own commands,
  stored verbatim in tests/facts/captured/nvidia-smi-h200-580.159.04.json by capture_gpu_host.py.
  The expected facts below were read off those raw answers by a person.
- shaped: hosts we have no capture of (8x H200, 8x H100 under SGLang TP8, a dead driver, an old
  driver). Each row has exactly the captured row's shape (", " separators, no units, no header,
  one row per line, trailing newline); the values are public ones (H200 memory.total 143771 MiB as
  captured; H100 80GB HBM3 81559 MiB and 72790 MiB in use under a model, driver 550.90.07, as
  shown in github.com/wilicc/gpu-burn/issues/114), the failure texts are nvidia-smi's own
  (exit 9 "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver...",
  exit 6 "No devices were found" as captured). Expected facts come from the values written here,
  never from the parser.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
RAW = json.loads((HERE / "captured" / "nvidia-smi-h200-580.159.04.json").read_text())
CAPTURED = "captured: 1x NVIDIA H200, driver 580.159.04 (tests/facts/captured/nvidia-smi-h200-580.159.04.json)"
SHAPED = "shaped: the captured row format with public values (see tests/facts/write_nvidia_smi_cases.py)"

GPU_QUERY = RAW["idle_gpus"]["command"]
APPS_QUERY = RAW["idle_apps"]["command"]
TAG = "0123456789abcdef"
STATUS = RAW["idle_status"]["command"]
H200_UUID = "GPU-11ce01e2-3032-803d-e914-e89fa347f951"
DRIVER_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                 "Make sure that the latest NVIDIA driver is installed and running.\n")


def uuids(seed: int, n: int = 8) -> list[str]:
    rng = random.Random(seed)
    h = lambda k: "".join(rng.choice("0123456789abcdef") for _ in range(k))  # noqa: E731
    return [f"GPU-{h(8)}-{h(4)}-{h(4)}-{h(4)}-{h(12)}" for _ in range(n)]


def row(index, uuid, used, total, util, holders=()) -> dict:
    return {"index": index, "uuid": uuid, "used_mib": used, "total_mib": total, "utilization_pct": util,
            "holders": list(holders)}


def app(uuid, pid, used, name) -> dict:
    return {"gpu_uuid": uuid, "pid": pid, "used_mib": used, "process_name": name}


def status_stdout(gpus_exit: int, gpus_out: str, apps_exit: int, apps_out: str) -> str:
    return (f"{gpus_out}\ndeployctl-gpu-status-{TAG} gpus exit {gpus_exit}\n"
            f"{apps_out}\ndeployctl-gpu-status-{TAG} apps exit {apps_exit}\n")


def save(fact: str, case: str, source: str, answer: dict, expect: dict, expected_gpus: int | None = None) -> None:
    data = {"source": source, "command": answer["command"], "exit_code": answer["exit_code"],
            "stdout": answer["stdout"], "stderr": answer["stderr"], **expect}
    if expected_gpus is not None:
        data["expected_gpus"] = expected_gpus
    (HERE / fact).mkdir(exist_ok=True)
    (HERE / fact / f"{case}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def answer(command: str, stdout: str, exit_code: int = 0, stderr: str = "") -> dict:
    return {"command": command, "exit_code": exit_code, "stdout": stdout, "stderr": stderr}


def main() -> None:
    busy_app = app(H200_UUID, RAW["holder_pid"], 8710, "/opt/torch/.venv/bin/python3")

    # -- the GPU query alone ------------------------------------------------------------------------
    g = "nvidia_smi_gpus"
    save(g, "h200_idle", CAPTURED, RAW["idle_gpus"], {"fact": {"gpus": [row(0, H200_UUID, 0, 143771, 0)]}}, 1)
    save(g, "h200_busy", CAPTURED, RAW["busy_gpus"], {"fact": {"gpus": [row(0, H200_UUID, 8719, 143771, 0)]}}, 1)
    save(g, "h200_no_such_gpu", CAPTURED, RAW["no_such_index"], {"error": "No devices were found"}, 1)
    save(g, "h200_with_units", CAPTURED, RAW["with_units"], {"error": "memory.used is '0 MiB'"}, 1)
    save(g, "h200_with_header", CAPTURED, RAW["with_header"], {"error": "index is 'index'"}, 1)
    save(g, "h200_fewer_than_configured", CAPTURED, RAW["idle_gpus"],
         {"error": "fewer than configured: missing [1, 2, 3, 4, 5, 6, 7]"}, 8)
    u = uuids(200)
    save(g, "h200_8gpu_idle", SHAPED, answer(GPU_QUERY, "".join(f"{i}, {u[i]}, 0, 143771, 0\n" for i in range(8))),
         {"fact": {"gpus": [row(i, u[i], 0, 143771, 0) for i in range(8)]}}, 8)
    save(g, "h200_8gpu_more_than_configured", SHAPED,
         answer(GPU_QUERY, "".join(f"{i}, {u[i]}, 0, 143771, 0\n" for i in range(8))),
         {"error": "more than configured (hosts[].gpus), extra indices [4, 5, 6, 7]"}, 4)
    h = uuids(100)
    util = [0, 4, 0, 0, 3, 0, 1, 0]
    save(g, "h100_8gpu_serving", SHAPED,
         answer(GPU_QUERY, "".join(f"{i}, {h[i]}, 72790, 81559, {util[i]}\n" for i in range(8))),
         {"fact": {"gpus": [row(i, h[i], 72790, 81559, util[i]) for i in range(8)]}}, 8)
    save(g, "driver_failed", SHAPED, answer(GPU_QUERY, DRIVER_FAILED, 9),
         {"error": "exit code 9): NVIDIA-SMI has failed because it couldn't communicate"}, 8)
    save(g, "mig_utilization_not_available", SHAPED, answer(GPU_QUERY, f"0, {h[0]}, 6, 81559, [N/A]\n"),
         {"fact": {"gpus": [row(0, h[0], 6, 81559, None)]}}, 1)
    save(g, "old_driver_utilization_not_supported", SHAPED,
         answer(GPU_QUERY, f"0, {h[0]}, 6, 81559, [Not Supported]\n"),
         {"fact": {"gpus": [row(0, h[0], 6, 81559, None)]}}, 1)
    save(g, "memory_not_available", SHAPED, answer(GPU_QUERY, f"0, {h[0]}, [N/A], 81559, 0\n"),
         {"error": "reports memory.used as '[N/A]'"}, 1)
    # fuser -k /dev/nvidia*; nvidia-smi ... in one command: fuser's PIDs (stdout, no newline) glued to row 0
    save(g, "fuser_pids_glued_to_row_0", SHAPED,
         answer("fuser -k /dev/nvidia*; " + GPU_QUERY,
                "88882 88882 88882" + "".join(f"{i}, {u[i]}, 0, 143771, 0\n" for i in range(8)),
                stderr="/dev/nvidia0:\n/dev/nvidia1:\n"),
         {"error": "index is '88882 88882 888820'"}, 8)

    # -- the compute-apps query alone ---------------------------------------------------------------
    a = "nvidia_smi_apps"
    save(a, "h200_idle", CAPTURED, RAW["idle_apps"], {"fact": {"apps": []}})
    save(a, "h200_busy", CAPTURED, RAW["busy_apps"], {"fact": {"apps": [busy_app]}})
    pids = list(range(41233, 41241))
    save(a, "h100_8gpu_sglang_tp8", SHAPED,
         answer(APPS_QUERY, "".join(f"{h[i]}, {pids[i]}, 72780, /usr/bin/python3\n" for i in range(8))),
         {"fact": {"apps": [app(h[i], pids[i], 72780, "/usr/bin/python3") for i in range(8)]}})
    save(a, "container_memory_not_available_comma_in_name", SHAPED,
         answer(APPS_QUERY, f"{h[0]}, 12, [N/A], /opt/my, odd/python3\n"),
         {"fact": {"apps": [app(h[0], 12, None, "/opt/my, odd/python3")]}})
    save(a, "driver_failed", SHAPED, answer(APPS_QUERY, DRIVER_FAILED, 9), {"error": "couldn't communicate"})

    # -- gpu-status: both queries in one command ----------------------------------------------------
    s = "gpu_status"
    save(s, "h200_idle", CAPTURED, RAW["idle_status"], {"fact": {"gpus": [row(0, H200_UUID, 0, 143771, 0)]}}, 1)
    save(s, "h200_busy", CAPTURED, RAW["busy_status"],
         {"fact": {"gpus": [row(0, H200_UUID, 8719, 143771, 2, [busy_app])]}}, 1)
    save(s, "h100_8gpu_sglang_tp8", SHAPED, answer(STATUS, status_stdout(
        0, "".join(f"{i}, {h[i]}, 72790, 81559, {util[i]}\n" for i in range(8)),
        0, "".join(f"{h[i]}, {pids[i]}, 72780, /usr/bin/python3\n" for i in range(8)))),
        {"fact": {"gpus": [row(i, h[i], 72790, 81559, util[i], [app(h[i], pids[i], 72780, "/usr/bin/python3")])
                           for i in range(8)]}}, 8)
    save(s, "driver_failed", SHAPED, answer(STATUS, status_stdout(9, DRIVER_FAILED, 9, DRIVER_FAILED)),
         {"error": "GPU query (--query-gpu) failed (exit code 9): NVIDIA-SMI has failed"}, 8)
    save(s, "apps_query_failed", SHAPED, answer(STATUS, status_stdout(
        0, "".join(f"{i}, {h[i]}, 0, 81559, 0\n" for i in range(8)),
        15, "Unable to determine the device handle for GPU 00000000:3B:00.0: Unknown Error\n")),
        {"error": "compute-apps query (--query-compute-apps) failed (exit code 15): Unable to determine"}, 8)
    save(s, "nvidia_smi_not_installed", SHAPED, answer(STATUS, status_stdout(
        127, "sh: 1: nvidia-smi: not found\n", 127, "sh: 1: nvidia-smi: not found\n")),
        {"error": "(nvidia-smi is not installed or not on PATH)"}, 8)
    cut = RAW["idle_status"]["stdout"].split(f"deployctl-gpu-status-{TAG} apps")[0]
    save(s, "cut_after_the_gpu_query", CAPTURED, answer(STATUS, cut, 124, "timeout: sending signal TERM\n"),
         {"error": "saw the GPU query's end"}, 1)
    save(s, "holder_on_an_unlisted_gpu", SHAPED, answer(STATUS, status_stdout(
        0, f"0, {h[0]}, 0, 81559, 0\n", 0, f"{h[1]}, 4242, 512, /usr/bin/python3\n")),
        {"error": "compute app pid 4242 is on GPU " + h[1]}, 1)


if __name__ == "__main__":
    main()
