"""The sandbox's stand-in python packages (sandbox/sim_sglang: sglang, torch, safetensors) in this
process, for tests that run the drafter swap's sender or the stand-in's session without a sandbox host.

On a sandbox host they are on ``~/pylib`` (sandbox/hosts.py); the sender's one payload path
(``sglang_payloads``) imports them there as it imports the real ones on a GPU host (issue 41)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

SIM_PYTHON = Path(__file__).resolve().parents[1] / "sandbox" / "sim_sglang"
PACKAGES = ("sglang", "torch", "safetensors")


def _drop() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] in PACKAGES]:
        del sys.modules[name]


@contextlib.contextmanager
def sim_python() -> Iterator[Path]:
    """The stand-ins importable while inside (``import sglang`` without its 2.5 s sleep); none of
    them left in ``sys.modules`` afterwards, so no other test sees a top-level ``sglang`` or ``torch``."""
    old_path, old_sleep = list(sys.path), os.environ.get("SGLANG_SIM_IMPORT_SECONDS")
    sys.path.insert(0, str(SIM_PYTHON))
    os.environ["SGLANG_SIM_IMPORT_SECONDS"] = "0"
    _drop()
    try:
        yield SIM_PYTHON
    finally:
        sys.path[:] = old_path
        if old_sleep is None:
            os.environ.pop("SGLANG_SIM_IMPORT_SECONDS", None)
        else:
            os.environ["SGLANG_SIM_IMPORT_SECONDS"] = old_sleep
        _drop()


def sim_env() -> dict[str, str]:
    """The environment for a sender run as its own process with the stand-ins on its path."""
    return {**os.environ, "PYTHONPATH": str(SIM_PYTHON), "SGLANG_SIM_IMPORT_SECONDS": "0"}
