"""Benchmark: how soon wait-gpus-free notices that the GPUs are free (one sandbox host).

    python tests/benchmarks/bench_gpus_free_reaction.py [--rounds 10]

Not collected by pytest (bench_*.py). Takes the test suite's machine-wide sandbox lock, starts ONE
simulated GPU host (sb1: real sshd on 127.0.0.10, simulated nvidia-smi reading which real processes
hold its GPU device files). Each round: a real process on the host holds GPU 3; the wait-gpus-free
step runs (its default settings, the real SSH transport); one second later this process kills the
holder (SIGKILL, locally: the sandbox's users are local) and takes the time; the reaction is the
time from the kill until the step returned "ok". The issue's goal: within 0.2 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.config import load_config  # noqa: E402
from deploy.steps import ensure_helper, wait_gpus_free  # noqa: E402
from deploy.steps.base import StepContext  # noqa: E402
from deploy.ssh.transport import HostConnection  # noqa: E402
from sandbox.machine_lock import machine_lock
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from tests.integration.helpers import gpu_used, hold_gpu_program, start_stray  # noqa: E402

ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))


def context(module, host, run, conn, **settings) -> StepContext:
    return StepContext(host=host, run=run, settings=module.Settings(step=module.NAME, **settings), conn=conn,
                       launch_stamp="bench")


def one_round(sandbox, host, run, conn) -> float:
    holder = start_stray(sandbox, "sb1", hold_gpu_program(str(sandbox.host("sb1").home), 3))
    deadline = time.monotonic() + 20
    while gpu_used(sandbox, "sb1")[3] == 0:
        if time.monotonic() > deadline:
            raise SystemExit("the holder never showed on GPU 3")
        time.sleep(0.05)
    returned: dict = {}

    def wait() -> None:
        outcome = wait_gpus_free.run(context(wait_gpus_free, host, run, conn, timeout_s=60))
        returned["at"] = time.monotonic()
        returned["outcome"] = outcome

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(1.0)
    killed_at = time.monotonic()
    os.kill(holder, signal.SIGKILL)
    thread.join(70)
    if "at" not in returned or returned["outcome"].status != "ok":
        raise SystemExit(f"wait-gpus-free did not end ok: {returned}")
    return returned["at"] - killed_at


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--lock-wait-s", type=float, default=2400)
    args = parser.parse_args()
    with machine_lock(args.lock_wait_s, poll_s=0.5):
        sandbox = start_sandbox(ROOT, ("sb1",), gpus=8, stop_at_exit=True)
        try:
            config = load_config(sandbox.config_path)
            host = config.host("sb1")
            run = config.runs[0]
            with HostConnection(host, config.ssh) as conn:
                ensure_helper.run(context(ensure_helper, host, run, conn))
                reactions = [one_round(sandbox, host, run, conn) for _ in range(args.rounds)]
        finally:
            stop_sandbox(ROOT)
    print(f"GPUs free noticed after (s), {len(reactions)} rounds: median {statistics.median(reactions):.3f}, "
          f"max {max(reactions):.3f}, min {min(reactions):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
