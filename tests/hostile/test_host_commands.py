"""Paths on host command lines: after `--`, so a path is never read as an option, even one that
slipped past the config check (a drafter named `-x`), proven by running the real command in sh."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from deploy.config.models import Host, Run
from deploy.steps import fix_keys
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import make_speculators_drafter


def test_the_store_command_puts_the_drafter_after_double_dash(tmp_path):
    helpers = tmp_path / "state" / "helpers"
    helpers.mkdir(parents=True)
    shutil.copy(fixer_zipapp(), helpers / fix_keys.FIXER)
    make_speculators_drafter(tmp_path / "-x")
    # model_construct: the config check refuses such a drafter; this proves the second guard
    base = Host(name="gpu-a", address="10.1.2.3").model_dump()
    host = Host.model_construct(**{**base, "state_dir": str(tmp_path / "state"), "python": sys.executable})
    run = Run.model_construct(**{**Run(name="r", hosts=["gpu-a"], base_model="/m", drafter="/d").model_dump(),
                                 "drafter": "-x"})
    ctx = StepContext(host=host, run=run, settings=fix_keys.Settings(step="fix-keys"), conn=None,
                      launch_stamp="x", memory=StepMemory(sglang_version="0.5.11"))
    command = fix_keys.store_command(ctx, fix_keys.known_version(ctx))  # what plan() shows and run() sends
    assert command.endswith(" -- -x")
    result = subprocess.run(["sh", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr        # not exit 2, usage
    summary = json.loads(result.stdout)
    assert summary["status"] == "converted" and summary["drafter"] == str(tmp_path / "-x")
