"""``python -m sandbox start|stop|status``: run the simulated GPU hosts (SIMULATION ONLY).

A TEST DOUBLE for real GPU hosts; see sandbox/__init__.py. Needs root.
The default root is ``<repo>/.sandbox``; the deployctl config for the hosts is written to
``<root>/deployctl.yaml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deploy.base.errors import DeployError, ExitCode
from sandbox.hosts import sandbox_status, start_sandbox, stop_sandbox

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / ".sandbox"
# The demo's hosts (demo1.. on 127.0.0.20..) never collide with the test suite's (sb1.. on
# 127.0.0.10..), so a running demo does not stop the tests from starting their own sandbox.
DEMO_PREFIX = "demo"
DEMO_ADDRESS_BASE = 20


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandbox",
                                     description="Simulated GPU hosts for deployctl (test double).")
    sub = parser.add_subparsers(dest="verb", required=True)
    start = sub.add_parser("start", help="start the simulated hosts and write deployctl.yaml")
    start.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    start.add_argument("--hosts", type=int, default=1, help="number of hosts: demo1..demoN (default 1)")
    start.add_argument("--gpus", type=int, default=8, help="simulated GPUs per host (default 8)")
    start.add_argument("--sglang-version", default="0.5.11",
                       help="version the stand-in SGLang reports and behaves as (default 0.5.11: the sandbox base model is Kimi-K2.5, which captures aux hidden states from 0.5.10 on)")
    stop = sub.add_parser("stop", help="stop the hosts and delete their users")
    stop.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    stop.add_argument("--purge", action="store_true", help="also delete the root directory")
    status = sub.add_parser("status", help="show what is running")
    status.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    status.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser()
    if prog:
        parser.prog = prog
    args = parser.parse_args(argv)
    try:
        if args.verb == "start":
            if not 1 <= args.hosts <= 32:
                raise DeployError(f"--hosts must be between 1 and 32, got {args.hosts}",
                                  exit_code=ExitCode.USAGE)
            names = [f"{DEMO_PREFIX}{i + 1}" for i in range(args.hosts)]
            sandbox = start_sandbox(args.root, names, gpus=args.gpus, sglang_version=args.sglang_version,
                                    address_base=DEMO_ADDRESS_BASE)
            for h in sandbox.hosts:
                print(f"{h.name}: {h.user}@{h.address}:{h.port}  home {h.home}  ({h.gpu_count} simulated GPUs)")
            print(f"config: {sandbox.config_path}")
            print(f"next:   deployctl -c {sandbox.config_path} up")
            print(f"ssh:    ssh -F /dev/null -o UserKnownHostsFile={sandbox.known_hosts} "
                  f"-i {sandbox.hosts[0].identity_file} -p {sandbox.hosts[0].port} "
                  f"{sandbox.hosts[0].user}@{sandbox.hosts[0].address} nvidia-smi")
        elif args.verb == "stop":
            stop_sandbox(args.root, remove_root=args.purge)
            print(f"sandbox at {args.root.resolve()} stopped")
        else:
            status = sandbox_status(args.root)
            if args.json:
                print(json.dumps(status, indent=2))
            elif not status["hosts"]:
                print(f"no sandbox recorded at {status['root']}")
            else:
                for h in status["hosts"]:
                    state = "up" if h["sshd_alive"] else "DOWN"
                    print(f"{h['name']}: {state}  {h['user']}@{h['address']}:{h['port']}  sshd pid {h['sshd_pid']}")
                print(f"config: {status['config_path']}")
            return 0 if status["running"] or not status["hosts"] else 1
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
