"""Benchmark: SSH channels deployctl opens per host for a first and a repeat ``up`` (one sandbox host).

    python tests/benchmarks/bench_exec_channels.py [--repeat 3]

Not collected by pytest (bench_*.py). Takes the test suite's machine-wide sandbox lock, starts ONE
simulated GPU host (the test sandbox's sb1: real sshd on 127.0.0.10, stand-in SGLang), and runs
``deployctl up`` in-process with the SSH transport's wire methods counted: every ``_exec`` (a
command: one exec channel), ``_watch`` (a host-side poll loop: one exec channel for a whole wait),
``hold`` (the host lock's channel), ``_upload`` (one SFTP session for all files of an upload) and
``_stream``. Prints the channels per kind and the wall time of the first ``up`` (a deploy) and of
each repeat (the server already runs as desired: converge skips stop/free/launch/wait). The issue's
goals: at most 10 exec channels for a first ``up``, 8 for a repeat.

deployctl's own time: the wall time minus what the stand-in server spends loading (the wait-ready
watch) and generating tokens (the accept check's /generate requests): SSH connect, every other
command's round trip and host-side python, and deployctl's local work. Goal: under 1 s. Also
printed: the part of it spent outside any wire call (local CPU: imports excluded, they happen once
before the first run).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.ssh import transport  # noqa: E402
from deploy.cli.main import main as deployctl_main  # noqa: E402
from sandbox.machine_lock import machine_lock
from sandbox.hosts import start_sandbox, stop_sandbox  # noqa: E402

ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))
COUNTS: collections.Counter = collections.Counter()
#: seconds spent in wire calls: all of them, and the two that are the server's own time
WIRE = {"all": 0.0, "server": 0.0}


def _counted(name: str):
    original = getattr(transport.HostConnection, name)

    def wrapper(self, *args, **kwargs):
        COUNTS[(self.host.name, name)] += 1
        started = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent = time.monotonic() - started
            WIRE["all"] += spent
            command = str(args[0]) if args else ""
            if "watch-health" in command or "accept-check" in command:
                WIRE["server"] += spent

    setattr(transport.HostConnection, name, wrapper)


def up(config: Path) -> tuple[float, dict, dict]:
    COUNTS.clear()
    WIRE.update(all=0.0, server=0.0)
    out = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out):
        code = deployctl_main(["-c", str(config), "up", "--json"])
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"deployctl up failed ({code}):\n{out.getvalue()}")
    per_kind = {kind: n for (_, kind), n in sorted(COUNTS.items())}
    return wall, per_kind, json.loads(out.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lock-wait-s", type=float, default=2400)
    args = parser.parse_args()
    for name in ("_exec", "_watch", "hold", "_put", "_upload", "_stream", "connect"):
        _counted(name)
    with machine_lock(args.lock_wait_s, poll_s=0.5):
        sandbox = start_sandbox(ROOT, ("sb1",), gpus=8, stop_at_exit=True)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                os.environ["XDG_STATE_HOME"] = tmp  # history and local locks of this benchmark only
                config = yaml.safe_load(Path(sandbox.config_path).read_text())
                config["runs"][0].update({"group": None, "hosts": ["sb1"]})
                path = Path(tmp) / "deployctl.yaml"
                path.write_text(yaml.safe_dump(config))
                print("| up | channels (sb1) | exec incl. hold (of which watches) | sftp sessions | wall time | "
                      "deployctl's own time | of which local |")
                print("|---|---:|---:|---:|---:|---:|---:|")
                for i in range(1 + args.repeat):
                    wall, kinds, doc = up(path)
                    steps = {s["step"]: s for s in doc["hosts"][0]["steps"]}
                    label = "first (deploy)" if i == 0 else f"repeat {i} (converged: {steps['converge']['data']['converged']})"
                    exec_channels = kinds.get("_exec", 0) + kinds.get("_watch", 0) + kinds.get("hold", 0)
                    sftp = kinds.get("_put", 0) + kinds.get("_upload", 0)
                    own = wall - WIRE["server"]
                    print(f"| {label} | {exec_channels + sftp} | {exec_channels} ({kinds.get('_watch', 0)}) | {sftp} | "
                          f"{wall:.2f} s | {own:.2f} s | {wall - WIRE['all']:.2f} s |")
        finally:
            stop_sandbox(ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
