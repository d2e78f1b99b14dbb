"""deployctl sandbox: start/stop the local SIMULATED GPU hosts (real sshd, simulated GPUs).

For the demo and the tests only; deploy/sandbox is never used against real hosts.
"""

from __future__ import annotations

from pathlib import Path

import click

DEFAULT_ROOT = Path(".sandbox")


@click.group("sandbox")
def sandbox() -> None:
    """Local simulated GPU hosts: real OpenSSH sshd on 127.0.0.x, simulated nvidia-smi and SGLang."""


@sandbox.command("start")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_ROOT, show_default=True)
@click.option("--hosts", "count", type=click.IntRange(1, 16), default=1, show_default=True, help="How many hosts.")
@click.option("--gpus", type=click.IntRange(1, 16), default=8, show_default=True)
@click.option("--sglang-version", default="0.5.9", show_default=True, help="Simulated SGLang version.")
def start(root: Path, count: int, gpus: int, sglang_version: str) -> int:
    """Start the sandbox hosts and write ROOT/deployctl.yaml (needs root and openssh-server)."""
    from deploy.sandbox.hosts import start_sandbox

    names = [f"sb{i + 1}" for i in range(count)]
    box = start_sandbox(root.resolve(), names, gpus=gpus, sglang_version=sglang_version)
    for host in box.hosts:
        click.echo(f"{host.name}: {host.user}@{host.address}:{host.port}  (SIMULATED {host.gpu_count} GPUs)")
    click.echo(f"config: {box.config_path}")
    click.echo(f"try:    deployctl -c {box.config_path} gpu-status")
    return 0


@sandbox.command("stop")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_ROOT, show_default=True)
def stop(root: Path) -> int:
    """Stop every sandbox sshd and the sandbox users' processes; remove the sandbox users."""
    from deploy.sandbox.hosts import stop_sandbox

    stop_sandbox(root.resolve())
    click.echo(f"sandbox at {root} stopped")
    return 0
