"""Benchmark: restart after a drafter change, swapped into the running server vs a full reload.

    python tests/benchmarks/bench_drafter_swap.py [--load-s 20] [--rounds 1] [--concurrency 2]

Not collected by pytest (bench_*.py). Takes the test suite's machine-wide sandbox lock, starts the
SIMULATED GPU host sb1 (real sshd, stand-in SGLang 0.5.23 whose target load takes ``--load-s``, the
issue's 20 s), ``deployctl up``, then per round: a new checkpoint lands (a new safetensors header,
same names and shapes), ``restart --swap-drafter``; another new checkpoint, ``restart --reload``.
While each restart runs, a client streams requests at the server itself (no router) and a poller
reads ``/health`` every 50 ms: downtime is the longest stretch in which ``/health`` was not 200,
failed counts requests that did not complete. The stand-in's swap takes SGLANG_SIM_SWAP_SECONDS
(0.5 s): the real one's time (a few GiB through CUDA IPC, load_weights) is not measured here
(tests/device/swap_drafter_gpu.py measures it on a GPU machine).

What the ratio measures (issue 41): the wall time of deployctl's whole ``restart --swap-drafter``
(doctor, fix-keys, converge, inspect, the sender, the swap's own acceptance check, verify-acceptance,
record-good: mostly SSH round trips and Python start-ups, CPU-bound here) over the whole ``restart
--reload`` (the same steps plus stop, free, launch with the stand-in's ``--load-s`` target load, warm-up).
The reload's part is mostly the load's fixed sleep; the swap's is mostly CPU, so on a loaded machine
the ratio grows (0.14 quiet, 0.585 and 0.743 measured under other test runs): the machine's load
average and CPU count are printed with it. The goal stays at most 0.2 on a quiet machine. Also
printed: the swap step's ``held_s`` (how long SGLang's model-update lock could hold new requests)
and the longest request the client saw during each restart.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from sandbox.machine_lock import machine_lock  # noqa: E402
from tests.integration.fleet_client import StreamingClient  # noqa: E402
from tests.integration.test_drafter_swap import REWRITE  # noqa: E402

ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))


def deployctl(config: Path, *argv: str) -> tuple[int, float, dict]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deploy", "-c", str(config), *argv, "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - started
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"deployctl {' '.join(argv)} printed no report ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode, wall, doc


class HealthPoller(threading.Thread):
    def __init__(self, address: str, port: int) -> None:
        super().__init__(daemon=True)
        self.address, self.port = address, port
        self.stop = threading.Event()
        self.longest = 0.0
        self._down_since: float | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            ok = False
            try:
                conn = http.client.HTTPConnection(self.address, self.port, timeout=1)
                conn.request("GET", "/health")
                ok = conn.getresponse().status == 200
                conn.close()
            except OSError:
                pass
            now = time.monotonic()
            if ok and self._down_since is not None:
                self.longest = max(self.longest, now - self._down_since)
                self._down_since = None
            elif not ok and self._down_since is None:
                self._down_since = now
            self.stop.wait(0.05)
        if self._down_since is not None:
            self.longest = max(self.longest, time.monotonic() - self._down_since)


def measure(sandbox, config: Path, argv: list[str], step: int, concurrency: int) -> dict:
    weights = f"{sandbox.host('sb1').drafter_dir}/model.safetensors"
    assert sandbox.run("sb1", f"python3 -c {shlex.quote(REWRITE)} {weights} {step} 0").returncode == 0
    address = sandbox.host("sb1").address
    poller = HealthPoller(address, 30000)
    poller.start()
    with StreamingClient(address, 30000, concurrency=concurrency) as client:
        time.sleep(0.5)
        code, wall, doc = deployctl(config, "restart", *argv)
        time.sleep(0.5)
    poller.stop.set()
    poller.join()
    [host] = doc["hosts"]
    steps = {s["step"]: s for s in host["steps"]}
    swap = steps.get("swap-drafter", {})
    return {"command": "restart " + " ".join(argv), "exit": code, "wall_s": round(wall, 2),
            "downtime_s": round(poller.longest, 2), "requests_ok": client.stats.ok,
            "requests_failed": client.stats.failed, "path": (swap.get("data") or {}).get("path"),
            "held_s": ((swap.get("data") or {}).get("verified") or {}).get("held_s"),
            "longest_request_s": round(max((end - start for start, end, _ in client.stats.timeline), default=0.0), 2),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "pid": (swap.get("data") or {}).get("pid") or (steps.get("launch", {}).get("data") or {}).get("pid")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--load-s", type=float, default=20.0, help="the stand-in's target load time")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--lock-wait-s", type=float, default=2400)
    args = parser.parse_args()
    with machine_lock(args.lock_wait_s, poll_s=0.5):
        sandbox = start_sandbox(ROOT, ("sb1",), gpus=8, stop_at_exit=True)
        try:
            sandbox.set_sglang_version("sb1", "0.5.23")
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["XDG_STATE_HOME"] = tmp
                config = yaml.safe_load(Path(sandbox.config_path).read_text())
                config["hosts"] = [h for h in config["hosts"] if h["name"] == "sb1"]
                config["runs"][0].update({"group": None, "hosts": ["sb1"], "env": {
                    "SGLANG_SIM_LOAD_SECONDS": str(args.load_s), "SGLANG_SIM_TIME_SCALE": "0.05"}})
                path = Path(tmp) / "deployctl.yaml"
                path.write_text(yaml.safe_dump(config))
                code, wall, doc = deployctl(path, "up")
                if code != 0:
                    raise SystemExit(f"up failed ({code}): {json.dumps(doc)[:2000]}")
                print(f"stand-in target load {args.load_s:g} s; up: {wall:.2f} s; machine: {os.cpu_count()} CPUs, "
                      f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
                rows = []
                for i in range(args.rounds):
                    rows.append(measure(sandbox, path, ["--swap-drafter"], 2 * i + 2, args.concurrency))
                    rows.append(measure(sandbox, path, ["--reload"], 2 * i + 3, args.concurrency))
                for row in rows:
                    print(json.dumps(row))
                swaps = [r["wall_s"] for r in rows if r["path"] == "swap"]
                reloads = [r["wall_s"] for r in rows if r["path"] == "reload"]
                if swaps and reloads:
                    ratio = max(swaps) / min(reloads)
                    load = os.getloadavg()[0]
                    print(f"swap / reload wall time of the whole restart: {ratio:.3f} (goal: at most 0.2 on a quiet "
                          f"machine; load average {load:.2f} on {os.cpu_count()} CPUs now)")
        finally:
            stop_sandbox(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
