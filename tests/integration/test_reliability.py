"""Issue 17 (rest) over the real-sshd sandbox: each case ends with the host serving its last verified
deployment, or refused before anything was stopped. SIMULATED GPUs and SGLang (sandbox/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from deploy.local import history
from deploy.base.errors import ExitCode
from tests.integration.helpers import cli_json, cli_json_err, write_config
from tests.integration.test_safe_redeploy import (FAST, REPO, clear_markers, config, deployctl, new_checkpoint,
                                                  read_until, servers, steps_of)

pytestmark = pytest.mark.sandbox


def serving_pid(sandbox) -> int:
    """The server deployctl launched (its PID file), alive."""
    out = sandbox.run("sb1", "pid=$(cat ~/.deployctl/server.pid) && kill -0 \"$pid\" && echo \"$pid\"")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


def health(sandbox) -> str:
    return sandbox.run("sb1", "python3 -c \"import urllib.request as u; print(u.urlopen("
                              f"'http://{sandbox.host('sb1').address}:30000/health', "
                              "timeout=5).status)\"").stdout.strip()


def up_ok(capsys, path, *extra) -> dict:
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", *extra)
    assert code == 0, json.dumps(doc, indent=1)
    return doc


def refused_before_stop(doc: dict, code: int, expected: int, step: str = "doctor") -> dict:
    assert code == expected, json.dumps(doc, indent=1)
    steps = steps_of(doc)
    assert steps[step]["status"] == "failed"
    assert steps["stop-stale"]["status"] == "not-run"
    return steps


def test_phantom_gpu_memory_is_refused_before_the_stop_and_a_rollback_never_waits_for_it(clean_sandbox, tmp_path, capsys):
    path = config(clean_sandbox, tmp_path)
    up_ok(capsys, path)
    pid = serving_pid(clean_sandbox)
    # a leaked context: 512 MiB on GPU 3 that no listed process holds (the stand-in nvidia-smi's knob)
    clean_sandbox.run("sb1", "echo '{\"3\": 512}' > ~/.sim/phantom.json")
    new_checkpoint(clean_sandbox)
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    steps = refused_before_stop(doc, code, ExitCode.VERIFY)
    assert "gpu-memory: 1 GPU(s) would not be freed" in steps["doctor"]["detail"]
    assert "GPU 3: 512 MiB of" in steps["doctor"]["detail"] and "threshold_mib" in steps["doctor"]["detail"]
    assert serving_pid(clean_sandbox) == pid and health(clean_sandbox) == "200"
    # past the doctor (--ignore-doctor), a crash on load: the rollback's wait ends at the 512 MiB held before the stop
    new_checkpoint(clean_sandbox, "crash-during-load")
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json", "--ignore-doctor")
    assert code == ExitCode.ROLLED_BACK, json.dumps(doc, indent=1)
    [host] = doc["hosts"]
    wait = {s["step"]: s for s in host["rollback"]}["wait-gpus-free"]
    assert wait["status"] == "ok" and "GPU 3: 512 MiB held before the stop" in wait["detail"]
    assert health(clean_sandbox) == "200"


def _two_runs(sandbox, tmp_path):
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"], "env": FAST, "name": "a"})
    document = yaml.safe_load(path.read_text())
    document["runs"].append(dict(document["runs"][0], name="b", draft_tokens=10))  # another server
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_a_server_of_another_run_is_not_stopped_without_replace(clean_sandbox, tmp_path, capsys):
    path = _two_runs(clean_sandbox, tmp_path)
    up_ok(capsys, path, "--run", "a")
    pid = serving_pid(clean_sandbox)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--run", "b", "--json")
    steps = refused_before_stop(doc, code, ExitCode.VERIFY)
    assert f"pid {pid} serves run 'a'" in steps["doctor"]["detail"] and "--replace" in steps["doctor"]["detail"]
    assert serving_pid(clean_sandbox) == pid and health(clean_sandbox) == "200"
    up_ok(capsys, path, "--run", "b", "--replace")
    assert serving_pid(clean_sandbox) != pid


@pytest.mark.parametrize("extra_args,fragment", [
    (["--not-an-option", "1"], "unrecognized option --not-an-option"), (["--help"], "--help"), (["--"], "lone '--'"),
    (["--dp-size", "2"], "needs 16 GPUs on this host, which has 8"),
    # a value outside the option's choices: refused by the launch's argparse, so before the stop (issue 30)
    (["--kv-cache-dtype", "bogus"], "invalid choice: --kv-cache-dtype 'bogus'"),
    (["--mem-fractoin-static", "0.85"], "did you mean --mem-fraction-static"),
])
def test_extra_args_sglang_refuses_are_caught_before_the_stop(clean_sandbox, tmp_path, capsys, extra_args, fragment):
    good = config(clean_sandbox, tmp_path)
    up_ok(capsys, good)
    pid = serving_pid(clean_sandbox)
    bad = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb1"], "env": FAST,
                                                     "extra_args": extra_args})
    code, doc = cli_json(capsys, "-c", str(bad), "up", "--json")
    steps = refused_before_stop(doc, code, ExitCode.VERIFY)
    assert fragment in steps["doctor"]["detail"], steps["doctor"]["detail"]
    assert serving_pid(clean_sandbox) == pid and health(clean_sandbox) == "200"


def test_the_options_every_user_passes_deploy(clean_sandbox, tmp_path, capsys):
    """Issue 30: the stand-in's server_args.py is built like SGLang 0.5.15+ (Arg dataclass fields), which
    the doctor once read as having no options at all."""
    args = ["--mem-fraction-static", "0.85", "--context-length", "8192", "--kv-cache-dtype", "fp8_e4m3"]
    path = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb1"], "env": FAST, "extra_args": args})
    up_ok(capsys, path)
    pid = serving_pid(clean_sandbox)
    cmdline = clean_sandbox.run("sb1", f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert " ".join(args) in cmdline, cmdline


def test_a_checkpoint_that_rolled_back_is_not_redeployed_every_night(clean_sandbox, tmp_path, capsys):
    path = config(clean_sandbox, tmp_path)
    up_ok(capsys, path)
    new_checkpoint(clean_sandbox, "crash-during-load")
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    assert code == ExitCode.ROLLED_BACK, json.dumps(doc, indent=1)
    fingerprint = steps_of(doc)["fix-keys"]["data"]["fingerprint"]
    assert any("quarantined drafter fingerprint" in w for w in doc["hosts"][0]["warnings"])
    pid = serving_pid(clean_sandbox)
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    steps = refused_before_stop(doc, code, ExitCode.QUARANTINED, step="quarantine")
    assert fingerprint[:16] in doc["hosts"][0]["error"] and "failed on this host at 20" in doc["hosts"][0]["error"]
    assert serving_pid(clean_sandbox) == pid and health(clean_sandbox) == "200"
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json", "--retry-failed")
    assert code == ExitCode.ROLLED_BACK, json.dumps(doc, indent=1)  # tried again, as asked: still bad, restored
    clear_markers(clean_sandbox)
    new_checkpoint(clean_sandbox)  # a new checkpoint: a new fingerprint, deployed
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    assert [r["exit_code"] for r in history.read(host="sb1")] == [0, 11, 13, 11, 0]


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_are_handled_like_ctrl_c(clean_sandbox, tmp_path, capsys, signum, code):
    path = config(clean_sandbox, tmp_path, SGLANG_SIM_LOAD_SECONDS="5")
    proc = deployctl("-c", str(path), "up")
    try:
        read_until(proc, "[sb1] wait-ready: start")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "[sb1] interrupted: left running: SGLang pid " in err and "launched by this run, not verified in this run" in err  # issue 31
    assert f"terminated by {signal.Signals(signum).name}" in err
    assert [(r["outcome"], r["exit_code"]) for r in history.read(host="sb1")] == [("interrupted", code)]
    up_ok(capsys, path)  # locks released: the next run is not locked out


def test_two_state_dirs_on_one_host_contend_for_its_gpus(clean_sandbox, tmp_path, capsys):
    a = config(clean_sandbox, tmp_path, "a.yaml", SGLANG_SIM_LOAD_SECONDS="3")
    (tmp_path / "b").mkdir()
    b = write_config(clean_sandbox, tmp_path / "b", hosts=None, run={"group": None, "hosts": ["sb1"], "env": FAST})
    document = yaml.safe_load(b.read_text())
    document["hosts"][0]["state_dir"] = "~/other-state"
    b.write_text(yaml.safe_dump(document, sort_keys=False))
    first = deployctl("-c", str(a), "up", "--json")
    try:
        read_until(first, "[sb1] lock: held")
        code, doc, _ = cli_json_err(capsys, "-c", str(b), "up", "--json")
        assert code == ExitCode.LOCKED, json.dumps(doc, indent=1)
        message = doc["hosts"][0]["error"]
        assert "GPU device" in message and f"pid {first.pid}" in message
        assert all(s["status"] == "not-run" for s in doc["hosts"][0]["steps"])
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0
    serving_pid(clean_sandbox)


def test_a_hard_link_planted_at_a_gpu_lock_is_refused_and_its_target_kept(clean_sandbox, tmp_path, capsys):
    """Issue 38: `ln VICTIM /run/lock/deployctl-gpu-<sha24>.lock` by another user of the host made `down`
    truncate VICTIM (the lock's owner note was written through the link). Refused, exit 10 naming it."""
    from deploy.remote import host_lock

    h = clean_sandbox.host("sb1")
    path = config(clean_sandbox, tmp_path)
    [(_, lock), *_] = host_lock.gpu_lock_paths(h.gpu_glob, host_lock.shared_dir())
    victim = f"{os.path.dirname(lock)}/deployctl-test-victim-{os.getpid()}-{h.user}"
    import pwd

    if os.path.lexists(lock):
        os.unlink(lock)  # as root here: the lock file may be an earlier run's (of any user)
    with open(victim, "wb") as planted:
        planted.write(b"keep me\n")
    os.chown(victim, pwd.getpwnam(h.user).pw_uid, pwd.getpwnam(h.user).pw_gid)  # the deploy user's own file
    os.link(victim, lock)
    try:
        code, doc = cli_json(capsys, "-c", str(path), "down", "--json")
        assert code == ExitCode.IO, json.dumps(doc, indent=1)
        assert lock in doc["hosts"][0]["error"] and "hard link" in doc["hosts"][0]["error"]
        with open(victim, "rb") as kept:
            assert kept.read() == b"keep me\n"
        assert os.stat(victim).st_nlink == 2
    finally:
        for name in (lock, victim):
            os.unlink(name)


def test_disjoint_hosts_of_one_run_proceed_in_parallel(clean_sandbox, tmp_path, capsys):
    path = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb1", "sb2"],
                                                      "env": FAST | {"SGLANG_SIM_LOAD_SECONDS": "8"}})
    first = deployctl("-c", str(path), "up", "--host", "sb1", "--json")
    try:
        read_until(first, "[sb1] lock: held")
        again = subprocess.run([sys.executable, "-m", "deploy", "-c", str(path), "up", "--host", "sb1", "--json"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
        assert again.returncode == ExitCode.LOCKED and "host sb1" in again.stderr and f"pid {first.pid}" in again.stderr
        other = subprocess.run([sys.executable, "-m", "deploy", "-c", str(path), "up", "--host", "sb2", "--json"],
                               cwd=REPO, capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0
