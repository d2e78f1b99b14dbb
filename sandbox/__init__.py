"""SIMULATION ONLY: a sandbox of simulated GPU hosts (a TEST DOUBLE), never imported by product
code paths used against real hosts.

There is no GPU on the development machine, so deployctl is tested (and its README demo runs)
against stand-ins: each simulated host is a real OpenSSH server on its own 127.0.0.x address with
its own Unix user, a simulated ``nvidia-smi`` whose numbers come from real processes holding
``~/dev/nvidiaN`` files, and a stand-in SGLang that reproduces the EAGLE-3 weight-name pitfalls.

- ``hosts``: ``start_sandbox`` / ``stop_sandbox`` / ``Sandbox`` / ``SandboxHost``.
- ``sim_nvidia_smi``: the simulated nvidia-smi (standalone script).
- ``sim_sglang/sglang``: the stand-in SGLang package (stdlib only).
- ``drafter``: synthetic speculators-format EAGLE-3 drafters and base-model stubs.

CLI: ``python -m sandbox start|stop|status [--root DIR] [--hosts N]``.
"""

from sandbox.hosts import (
    Sandbox,
    SandboxError,
    SandboxHost,
    sandbox_status,
    sandbox_unavailable_reason,
    start_sandbox,
    stop_sandbox,
)

__all__ = [
    "Sandbox",
    "SandboxError",
    "SandboxHost",
    "sandbox_status",
    "sandbox_unavailable_reason",
    "start_sandbox",
    "stop_sandbox",
]
