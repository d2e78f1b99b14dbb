"""Benchmark: wall time of a no-op ``deployctl up`` (server already running as desired).

    python tests/benchmarks/bench_converge_noop.py [--repeat 10]

Not collected by pytest (bench_*.py). Takes the test suite's machine-wide sandbox lock (so it
never collides with a test session), starts ONE simulated GPU host (the test sandbox's sb1:
real sshd on 127.0.0.10, stand-in SGLang), deploys once, then runs ``deployctl up --json`` as
a fresh process --repeat times and reports the wall time of each (interpreter start-up, SSH
handshake, host lock, ensure-helper, fingerprint, converge, verify-acceptance, record-good,
history: everything a user waits for) and checks the server PID never changed. Goal: < 1.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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

ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))


def deployctl(config: Path, *argv: str) -> tuple[float, dict]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deploy", "-c", str(config), *argv, "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"deployctl {' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return wall, json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--lock-wait-s", type=float, default=2400)
    args = parser.parse_args()
    with machine_lock(args.lock_wait_s, poll_s=0.5):
        sandbox = start_sandbox(ROOT, ("sb1",), gpus=8, stop_at_exit=True)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["XDG_STATE_HOME"] = tmp  # history and local locks of this benchmark only
                config = yaml.safe_load(Path(sandbox.config_path).read_text())
                config["runs"][0].update({"group": None, "hosts": ["sb1"]})
                path = Path(tmp) / "deployctl.yaml"
                path.write_text(yaml.safe_dump(config))
                first_wall, doc = deployctl(path, "up")
                pid = next(s for s in doc["hosts"][0]["steps"] if s["step"] == "launch")["data"]["pid"]
                walls = []
                for _ in range(args.repeat):
                    wall, doc = deployctl(path, "up")
                    steps = {s["step"]: s for s in doc["hosts"][0]["steps"]}
                    assert steps["converge"]["data"]["converged"] is True, steps["converge"]
                    assert steps["converge"]["data"]["pid"] == pid, "the server was restarted"
                    walls.append(wall)
                    per_step = {n: s["duration_s"] for n, s in steps.items()}
                print("step times of the last no-op run (s):", json.dumps(per_step))
                print(f"first up (deploy): {first_wall:.2f} s")
                print(f"no-op up, {args.repeat} runs: median {statistics.median(walls):.2f} s, "
                      f"min {min(walls):.2f} s, max {max(walls):.2f} s; server PID {pid} unchanged")
        finally:
            stop_sandbox(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
