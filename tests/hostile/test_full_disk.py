"""A full disk (a real, tiny tmpfs filled up): every write fails cleanly and leaves no temporary file,
on the host side (drafter store copy, PID file, the key fixer) as in the fixer run locally."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.host.records import DeploymentRecord
from deploy.config.models import Host, Run
from deploy.facts.fixer import FixerFailure, parse_fixer_summary
from deploy.remote import fixer as fix
from deploy.steps import fix_keys, launch
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import make_speculators_drafter
from tests.hostile.tree import tree_state


@pytest.fixture
def full_fs(tmp_path):
    """A tmpfs of 1 MiB; ``fill()`` uses up what is left."""
    mount = tmp_path / "fs"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")

    def fill():
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for block in (65536, 4096, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * block)
                except OSError:
                    pass
        finally:
            os.close(fd)

    try:
        yield mount, fill
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def ctx_for(module, state_dir: Path) -> StepContext:
    # model_construct: the test's state dir lives under pytest's /tmp, which the validator refuses
    host = Host.model_construct(**{**Host(name="gpu-a", address="10.1.2.3").model_dump(), "state_dir": str(state_dir)})
    run = Run(name="r", hosts=["gpu-a"], base_model="/m", drafter="/d")
    return StepContext(host=host, run=run, settings=module.Settings(step=module.NAME), conn=None,
                       launch_stamp="20261130T000000Z")


def test_drafter_store_copy_on_a_full_disk(full_fs, tmp_path):
    mount, fill = full_fs
    state = mount / "state"
    state.mkdir()
    (state / "helpers").mkdir()
    shutil.copy(fixer_zipapp(), state / "helpers" / "fixer.pyz")
    drafter = make_speculators_drafter(tmp_path / "drafter", hidden=512)  # larger than the filesystem
    fill()
    before_drafter = tree_state(drafter)
    ctx = ctx_for(fix_keys, state)
    host = Host.model_construct(**{**ctx.host.model_dump(), "python": sys.executable})
    ctx = StepContext(host=host, run=ctx.run.model_copy(update={"drafter": str(drafter)}), settings=ctx.settings,
                      conn=None, launch_stamp=ctx.launch_stamp, memory=StepMemory(sglang_version="0.5.11"))
    [planned] = fix_keys.plan(ctx)
    result = subprocess.run(["sh", "-c", planned.command], capture_output=True, text=True, timeout=30)
    summary = parse_fixer_summary(result.returncode, result.stdout, result.stderr, "gpu-a")
    assert result.returncode == 10 and isinstance(summary, FixerFailure), result.stdout
    assert "no space left on device" in summary.error.lower() and str(drafter) in summary.error
    # no partial staging copy left in the store (an empty store dir may remain), the user's checkpoint untouched
    drafters = state / "drafters"
    assert not drafters.exists() or list(drafters.iterdir()) == []
    assert tree_state(drafter) == before_drafter


def test_pid_file_on_a_full_disk(full_fs):
    mount, fill = full_fs
    state = mount / "state"
    (state / "logs").mkdir(parents=True)
    fill()
    ctx = ctx_for(launch, state)
    result = subprocess.run(["sh", "-c", launch.command(ctx, ["true"], DeploymentRecord(argv=["true"]))], capture_output=True,
                            text=True, timeout=30, input='{"argv": ["true"], "pid": "__PID__"}\n')  # the record: stdin
    assert result.returncode != 0 and "cannot write the PID file" in result.stderr
    assert not (state / "server.pid.tmp").exists() and not (state / "server.pid").exists()


def test_prepare_failure_is_reported_before_anything_starts(tmp_path):
    state = tmp_path / "state"
    state.write_text("a file where the state directory should be")
    ctx = ctx_for(launch, state)
    started = subprocess.run(["sh", "-c", launch.command(ctx, ["sleep", "30"], DeploymentRecord(argv=["sleep", "30"]))],
                             capture_output=True, text=True, timeout=30, input='{"pid": "__PID__"}\n')
    # the log directory failed first: no PID printed, nothing started, the reason on stderr
    assert started.returncode != 0 and started.stdout == "" and "Not a directory" in started.stderr


def test_key_fix_on_a_full_disk(full_fs):
    mount, fill = full_fs
    ckpt = make_speculators_drafter(mount / "ckpt")
    fill()
    before = tree_state(mount / "ckpt")
    with pytest.raises(fix.FixError) as caught:
        fix.convert(ckpt)
    assert caught.value.code == 10 and "no space left on device" in caught.value.message
    after = tree_state(mount / "ckpt")
    assert not [name for name in after if name.endswith(fix.TMP_SUFFIX)], after
    assert after == before


def test_converted_copy_on_a_full_disk_is_refused_before_writing(full_fs, tmp_path):
    mount, fill = full_fs
    source = make_speculators_drafter(tmp_path / "blobs")
    snap = mount / "snap"
    snap.mkdir()
    os.symlink(source / "model.safetensors", snap / "model.safetensors")
    os.symlink(source / "config.json", snap / "config.json")    # no config.json would be exit 6 first
    fill()
    before = tree_state(tmp_path)
    with pytest.raises(fix.FixError) as caught:
        fix.convert(snap)
    assert caught.value.code == 10
    assert tree_state(tmp_path) == before


def test_store_copy_on_a_full_disk_is_refused_before_copying(full_fs, tmp_path):
    """The drafter store on a full disk: refused from the free space before the first byte is copied
    (no staging directory left), the user's drafter untouched."""
    from deploy.remote.fixer import store

    mount, fill = full_fs
    drafter = make_speculators_drafter(tmp_path / "d")
    (mount / "drafters").mkdir()
    fill()
    before = tree_state(tmp_path)
    with pytest.raises(fix.FixError) as caught:
        store.store_drafter(str(drafter), str(mount / "drafters"), keep=1, last_good=str(tmp_path / "lg"),
                            generation="legacy")
    assert caught.value.code == 10 and "no space left on device" in caught.value.message
    assert str(drafter) in caught.value.message
    assert tree_state(tmp_path) == before
    assert list((mount / "drafters").iterdir()) == []
