"""Benchmark: ``deployctl gpu-status`` on 8 sandbox hosts vs plain OpenSSH running the same queries.

    python tests/benchmarks/bench_gpu_status.py [--hosts 8] [--repeat 7]

Not collected by pytest (bench_*.py). Takes the test suite's machine-wide sandbox lock and starts
8 simulated GPU hosts (real sshd on 127.0.0.10-17, 8 simulated GPUs each). Per round, each measured
as wall time from start to the last answer:

- ``deployctl``: ``deployctl -c CONFIG gpu-status --json`` as a fresh process (what a person or a
  cron job runs: start-up, imports, config, 8 SSH connections in parallel, one exec channel each,
  parsing, rendering);
- ``openssh``: 8 ``ssh`` client processes started at once, the same user, key, known_hosts and
  strict host key checking, no connection sharing (a fresh handshake each, as deployctl makes), each
  running the same remote command (both nvidia-smi queries, ``deploy.facts.gpus.gpu_status_command``);
- ``deployctl in-process``: ``inspect.gpu_status`` in this already-started Python (connect,
  query, parse: deployctl without its process start-up), to tell start-up from the connect path;
- the same in-process with the two queries as two remote commands (two exec channels per host), as
  gpu-status sent them before they became one command.

Prints a Markdown table: median and min of ``--repeat`` rounds (after one warm-up round each) and the
ratio deployctl / openssh. The issue's goal: within 1.2x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.verbs import inspect  # noqa: E402  (the read-only verbs)
from deploy.config import load_config  # noqa: E402
from deploy.facts import gpus  # noqa: E402
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402
from sandbox.machine_lock import machine_lock  # noqa: E402

ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))
DEPLOYCTL = Path(sys.executable).parent / "deployctl"


def deployctl_round(config: Path) -> float:
    started = time.monotonic()
    done = subprocess.run([str(DEPLOYCTL), "-c", str(config), "gpu-status", "--json"], capture_output=True,
                          text=True, timeout=120)
    wall = time.monotonic() - started
    if done.returncode != 0 or '"all_free": true' not in done.stdout:
        raise SystemExit(f"deployctl gpu-status failed ({done.returncode}): {done.stdout[-800:]} {done.stderr[-800:]}")
    return wall


def openssh_round(sandbox, names: list[str]) -> float:
    tag = gpus.new_tag()
    command = gpus.gpu_status_command(tag)
    started = time.monotonic()
    procs = [subprocess.Popen(sandbox.ssh_argv(name, command, multiplex=False), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in names]
    answers = [p.communicate(timeout=120) for p in procs]
    wall = time.monotonic() - started
    for name, proc, (out, err) in zip(names, procs, answers):
        if proc.returncode != 0:
            raise SystemExit(f"ssh {name} failed ({proc.returncode}): {err[-800:]}")
        gpus.parse_gpu_status(0, out, err, tag, sandbox.host(name).gpu_count, name)  # the same answer, checked
    return wall


def in_process_round(config) -> float:
    started = time.monotonic()
    outcomes = inspect.gpu_status(config, config.hosts)
    wall = time.monotonic() - started
    failed = [o.error for o in outcomes if o.error is not None]
    if failed:
        raise SystemExit(f"inspect.gpu_status failed: {failed[0]}")
    return wall


def two_commands_round(config) -> float:
    """The queries as two remote commands (two exec channels) per host, as gpu-status sent them before."""
    from deploy.engine.fanout import for_each_host
    from deploy.ssh.transport import HostConnection

    def work(host):
        with HostConnection(host, config.ssh) as conn:
            g, a = conn.run(gpus.GPU_QUERY_COMMAND), conn.run(gpus.COMPUTE_APPS_COMMAND)
            return gpus.read_answers((g.exit_code, g.stdout, g.stderr), (a.exit_code, a.stdout, a.stderr),
                                     host.gpus, host.name)

    started = time.monotonic()
    outcomes = for_each_host(config.hosts, work, config.ssh.max_parallel)
    wall = time.monotonic() - started
    failed = [o.error for o in outcomes if o.error is not None]
    if failed:
        raise SystemExit(f"two-command gpu-status failed: {failed[0]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--lock-wait-s", type=float, default=2400)
    args = parser.parse_args()
    if not 1 <= args.hosts <= 19:  # 127.0.0.10-28: the jump sandbox uses 127.0.0.30-32
        raise SystemExit("--hosts must be 1..19")
    names = [f"sb{i + 1}" for i in range(args.hosts)]
    with machine_lock(args.lock_wait_s, poll_s=0.5):
        sandbox = start_sandbox(ROOT, names, gpus=8, stop_at_exit=True)
        try:
            config = load_config(sandbox.config_path)
            kinds = {"deployctl (fresh process)": lambda: deployctl_round(sandbox.config_path),
                     "openssh (8 ssh processes)": lambda: openssh_round(sandbox, names),
                     "deployctl in-process (connect + query + parse)": lambda: in_process_round(config),
                     "in-process, the queries as 2 commands (before)": lambda: two_commands_round(config)}
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for kind, measure in kinds.items():
                measure()  # warm-up: page cache, sshd's first fork
            for _ in range(args.repeat):  # interleaved, so a noisy moment hits every kind alike
                for kind, measure in kinds.items():
                    times[kind].append(measure())
        finally:
            stop_sandbox(ROOT)
    base = statistics.median(times["openssh (8 ssh processes)"])
    print(f"| gpu-status on {args.hosts} hosts | median of {args.repeat} | min | vs openssh |")
    print("|---|---:|---:|---:|")
    for kind, values in times.items():
        median = statistics.median(values)
        print(f"| {kind} | {median:.3f} s | {min(values):.3f} s | {median / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
