"""Issue 39 over real sshd: a signal during a host-side command ends its whole process group before the call
returns (so before the host lock is released). Closing the channel alone left the fix-keys store running 7.3 s
after the lock was released (a restart at once failed with exit 10) and watch-gpus up to 25 s after deployctl
exited. Every host-side command goes through these two calls (``run``: the fix-keys store, stop-stale,
bench_serving, any exec; ``watch``: watch-gpus, watch-health, fleet_ops poll), so they are tested here with
host-side programs that behave like the worst of them: busy, silent, deaf to stdin's EOF, with a child.
SIMULATED host (sandbox/)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from deploy.base.errors import Interrupted
from deploy.config import load_config
from deploy.ssh.transport import HostConnection
from tests.integration.helpers import write_config

pytestmark = pytest.mark.sandbox


def busy_program(tag: str) -> str:
    """A parent and its child, silent for a minute, ignoring stdin (the fix-keys store copying a checkpoint,
    a watch loop inside an nvidia-smi query); ``tag`` in both command lines."""
    return (f"python3 -c 'import subprocess, time; subprocess.Popen([\"python3\", \"-c\", \"import time; "
            f"time.sleep(61)\", \"{tag}\"]); time.sleep(61)' {tag}")


def left(sandbox, tag: str) -> str:
    """The host user's processes whose command line has ``tag``, still running (a zombie left to a PID 1 that
    reaps no orphans, as this machine's, runs nothing)."""
    return sandbox.run("sb1", f"pgrep -a -u $(id -u) -f '{tag}' | grep -v -e '[p]grep' -e '<defunct>' || true"
                       ).stdout.strip()


@pytest.mark.parametrize("verb", ["run", "watch"])
def test_a_signal_ends_the_host_side_process_group_before_the_call_returns(clean_sandbox, tmp_path, verb):
    config = load_config(write_config(clean_sandbox, tmp_path))
    tag = f"deployctl-test-{uuid.uuid4().hex[:12]}"
    cancelled = threading.Event()
    with HostConnection(config.host("sb1"), config.ssh) as conn:
        conn.cancelled = cancelled

        def signal_when_running():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and tag not in left(clean_sandbox, tag):
                time.sleep(0.1)
            time.sleep(0.3)  # the child is up too
            cancelled.set()

        threading.Thread(target=signal_when_running, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(Interrupted):
            if verb == "run":
                conn.run(busy_program(tag), timeout=120)
            else:
                conn.watch(busy_program(tag), lambda line: False, timeout=120, cancelled=cancelled)
        took = time.monotonic() - started
        # the host lock would be released only now: nothing of the command may run on the host any more
        assert left(clean_sandbox, tag) == "", f"still running after the call returned:\n{left(clean_sandbox, tag)}"
        assert took < 40
        # the connection is usable as before
        assert conn.run("echo ok", timeout=30).stdout == "ok\n"


def test_ctrl_c_during_the_fix_keys_store_then_a_restart_at_once_succeeds(clean_sandbox, tmp_path, capsys):
    """The issue's night: Ctrl-C while ``fixer.pyz store`` copies a changed checkpoint into the drafter store;
    the store kept running after the lock was released and a restart started at once failed with exit 10
    ("cannot copy ... into the drafter store: No such file or directory")."""
    import signal

    from deploy.base.errors import ExitCode
    from tests.integration.helpers import cli_json
    from tests.integration.test_safe_redeploy import config, deployctl, new_checkpoint, read_until

    path = config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, doc
    new_checkpoint(clean_sandbox)
    drafter = clean_sandbox.host("sb1").drafter_dir
    # 1.5 GB more in the drafter's folder (unwritten extents: no disk I/O to make it): the store's fingerprint and
    # copy take seconds, as a real drafter's do
    assert clean_sandbox.run("sb1", f"fallocate -l 1536M {drafter}/padding.bin").returncode == 0
    try:
        proc = deployctl("-c", str(path), "restart")
        try:
            read_until(proc, "[sb1] fix-keys: start", timeout=120)
            time.sleep(1.0)
            assert "fixer.pyz" in left(clean_sandbox, "fixer.pyz")  # the store is running now
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == ExitCode.INTERRUPTED, err
        assert left(clean_sandbox, "fixer.pyz") == "", left(clean_sandbox, "fixer.pyz")
        code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")  # at once
        assert code == 0, doc
    finally:
        clean_sandbox.run("sb1", f"rm -f {drafter}/padding.bin; find ~/.deployctl/drafters -name padding.bin -delete")


def test_ctrl_c_during_wait_gpus_free_leaves_no_watch_gpus_behind(clean_sandbox, tmp_path, capsys):
    """The issue's other night: SIGINT during wait-gpus-free left the read-only watch-gpus helper running up to
    25 s after deployctl exited (its loop reads stdin's EOF only between two nvidia-smi queries)."""
    import signal

    from deploy.base.errors import ExitCode
    from tests.integration.helpers import cli_json
    from tests.integration.test_safe_redeploy import config, deployctl, read_until

    path = config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, doc
    # every nvidia-smi call on sb1 now takes 3 s (sandbox/sim_nvidia_smi.py: a driver busy tearing a context down)
    assert clean_sandbox.run("sb1", "echo 3 > ~/.sim/query_delay_s").returncode == 0
    try:
        proc = deployctl("-c", str(path), "restart", "--force")
        try:
            read_until(proc, "[sb1] wait-gpus-free: start", timeout=120)
            time.sleep(1.0)  # watch-gpus is inside its first query
            assert "watch-gpus" in left(clean_sandbox, "watch-gpus")
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == ExitCode.INTERRUPTED, err
        assert left(clean_sandbox, "watch-gpus") == "", left(clean_sandbox, "watch-gpus")
        assert left(clean_sandbox, "nvidia-smi") == "", left(clean_sandbox, "nvidia-smi")
    finally:
        clean_sandbox.run("sb1", "rm -f ~/.sim/query_delay_s")
