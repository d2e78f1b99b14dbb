"""Benchmark: requests through SGLang's router during a redeploy of three replicas.

    python tests/benchmarks/bench_rolling_restart.py [--router smg|sglang-router] [--concurrency 4] [--load-s 2]

Not collected by pytest (bench_*.py). Takes the test suite's machine-wide sandbox lock, starts
the three SIMULATED GPU hosts sb1-sb3 (real sshd, stand-in SGLang), runs the real router on sb1
(``--router``: smg 1.13.0 from .smg-venv, the default, or sglang-router 0.3.2 from .router-venv; see
tests/bootstrap.sh) and ``deployctl up``. Then, twice, a new
drafter lands on every host and a client streams requests through the router without pause
(``/generate`` with ``stream: true``; a request fails on a non-200 answer, a broken connection or
a stream without ``data: [DONE]``) while deployctl redeploys:

1. ``restart --serial 1``: one replica at a time out of the router, drained, redeployed, back in;
2. ``restart --serial 3 --allow-downtime``: all replicas at once (what ``up`` did before fleets).

It reports requests ok / failed (goal for 1: 0 failed), the failure reasons, the restart's wall
time and each replica's out-of-rotation window.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sandbox.machine_lock import machine_lock
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from tests.integration.fleet_client import StreamingClient  # noqa: E402

ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))
ROUTER_PYTHONS = {"smg": REPO / ".smg-venv" / "bin" / "python",
                  "sglang-router": REPO / ".router-venv" / "bin" / "python"}
HOSTS = ("sb1", "sb2", "sb3")
PORT = 30080


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


def new_checkpoint(sandbox, host: str) -> None:
    weights = f"{sandbox.host(host).drafter_dir}/model.safetensors"
    command = (f"size=$(stat -c %s {weights}) && head -c 64 /dev/urandom | "
               f"dd of={weights} bs=1 seek=$((size - 64)) conv=notrunc status=none && "
               f"touch -d '+{int(time.time()) % 1000 + 1} seconds' {weights}")
    assert sandbox.run(host, command).returncode == 0


def measure(sandbox, config: Path, label: str, argv: list[str], concurrency: int) -> dict:
    for host in HOSTS:
        new_checkpoint(sandbox, host)
    with StreamingClient(sandbox.host("sb1").address, PORT, concurrency=concurrency) as client:
        time.sleep(1.0)
        code, wall, doc = deployctl(config, "restart", *argv)
        time.sleep(1.0)
    stats = client.stats
    reasons = collections.Counter(e.split(":")[0][:80] for e in stats.errors)
    rotation = {h: (doc.get("fleet") or {}).get("rotation", {}).get(h, {}).get("out_of_rotation_s") for h in HOSTS}
    return {"mode": label, "exit": code, "restart_wall_s": round(wall, 2), "ok": stats.ok, "failed": stats.failed,
            "reasons": dict(reasons), "out_of_rotation_s": rotation}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--router", choices=sorted(ROUTER_PYTHONS), default="smg")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--load-s", type=float, default=2.0, help="the stand-in's model load time")
    parser.add_argument("--lock-wait-s", type=float, default=2400)
    args = parser.parse_args()
    ROUTER_PYTHON = ROUTER_PYTHONS[args.router]
    if not ROUTER_PYTHON.is_file():
        raise SystemExit(f"{ROUTER_PYTHON} missing: run tests/bootstrap.sh")
    with machine_lock(args.lock_wait_s, poll_s=0.5):
        sandbox = start_sandbox(ROOT, HOSTS, gpus=8, stop_at_exit=True)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["XDG_STATE_HOME"] = tmp
                config = yaml.safe_load(Path(sandbox.config_path).read_text())
                config["runs"][0].update({
                    "env": {"SGLANG_SIM_LOAD_SECONDS": str(args.load_s), "SGLANG_SIM_TIME_SCALE": "0.05"},
                    "router": {"host": "sb1", "port": PORT, "policy": "round_robin", "python": str(ROUTER_PYTHON)}})
                path = Path(tmp) / "deployctl.yaml"
                path.write_text(yaml.safe_dump(config))
                code, wall, doc = deployctl(path, "up")
                if code != 0:
                    raise SystemExit(f"up failed ({code}): {json.dumps(doc.get('fleet'))[:2000]}")
                print(f"router: {args.router}; up (3 replicas + router, one at a time): {wall:.2f} s")
                rows = [measure(sandbox, path, "restart --serial 1", ["--serial", "1"], args.concurrency),
                        measure(sandbox, path, "restart --serial 3 --allow-downtime (all at once)",
                                ["--serial", "3", "--allow-downtime"], args.concurrency)]
                for row in rows:
                    print(json.dumps(row))
        finally:
            stop_sandbox(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
