"""Local locks per host (and router); the host lock per GPU device, whatever the state dir (issues 17, 22)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.base.errors import LockHeld
from deploy.engine.locks import HOST_LOCK_SOURCE, local_lock, local_scopes, parse_host_lock
from deploy.remote import host_lock


def _holder(config: Path, run: str, scopes: list[str], tmp: Path) -> subprocess.Popen:
    """Another deployctl process holding local locks until its stdin closes."""
    code = ("import sys; from pathlib import Path; from deploy.engine.locks import local_lock\n"
            f"with local_lock(Path({str(config)!r}), {run!r}, {{'command': 'up', 'run': {run!r}, 'pid': 4242, "
            f"'user': 'op', 'hostname': 'ws', 'started_at': 'T'}}, {scopes!r}):\n"
            "    print('held', flush=True); sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"XDG_STATE_HOME": str(tmp)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def _attempt(config: Path, run: str, scopes: list[str], tmp: Path) -> str:
    """What a third deployctl process gets when it asks for these locks: "taken" or the refusal."""
    code = ("from pathlib import Path; from deploy.base.errors import LockHeld; from deploy.engine.locks import local_lock\n"
            "try:\n"
            f"    with local_lock(Path({str(config)!r}), {run!r}, {{'command': 'up', 'pid': 77}}, {scopes!r}):\n"
            "        print('taken')\n"
            "except LockHeld as exc:\n"
            "    print('refused', exc.exit_code, exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=os.environ | {"XDG_STATE_HOME": str(tmp)})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


HOSTS = ["host1", "host2", "host3", "host4"]


@pytest.mark.parametrize("mine,theirs", [
    (["host3"], ["host2"]), (["host1", "host3"], ["host2", "host4"]), (["host4"], ["host1", "host2", "host3"]),
])
def test_disjoint_host_sets_of_one_run_proceed_in_parallel(tmp_path, monkeypatch, mine, theirs):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    config = tmp_path / "c.yaml"
    other = _holder(config, "r", local_scopes(theirs), tmp_path)
    try:
        with local_lock(config, "r", {"pid": 1}, local_scopes(mine)):
            # taken, not merely not refused: a third process is refused every host of mine
            for host in mine:
                refused = _attempt(config, "r", local_scopes([host]), tmp_path)
                assert refused.startswith("refused 9") and f"host {host}" in refused, refused
    finally:
        other.stdin.close()
        other.wait(10)


@pytest.mark.parametrize("mine,theirs,shared", [
    (["host2"], ["host2"], "host2"), (["host1", "host3"], ["host3", "host4"], "host3"),
    (["host1", "host2", "host3", "host4"], ["host4"], "host4"),
])
def test_overlapping_host_sets_exit_9_naming_the_holder_and_keep_nothing(tmp_path, monkeypatch, mine, theirs, shared):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    config = tmp_path / "c.yaml"
    other = _holder(config, "r", local_scopes(theirs), tmp_path)
    try:
        with pytest.raises(LockHeld) as refused:
            with local_lock(config, "r", {"pid": 1}, local_scopes(mine)):
                pass
        assert refused.value.exit_code == 9
        assert f"host {shared}" in str(refused.value) and "pid 4242" in str(refused.value)
        assert "op@ws" in str(refused.value)
    finally:
        other.stdin.close()
        other.wait(10)
    # all or nothing: the locks this run had taken before the refusal were released
    with local_lock(config, "r", {"pid": 1}, local_scopes(HOSTS)):
        pass


def test_the_router_is_one_lock_for_every_host_set_of_its_run(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    config = tmp_path / "c.yaml"
    other = _holder(config, "r", local_scopes(["host1"], "rt"), tmp_path)
    try:
        with pytest.raises(LockHeld, match="router rt"):
            with local_lock(config, "r", {"pid": 1}, local_scopes(["host2"], "rt")):
                pass
        with local_lock(config, "r", {"pid": 1}, local_scopes(["host2"])):  # no router: host2 is free
            pass
    finally:
        other.stdin.close()
        other.wait(10)


def _hold(state: Path, devices: str, owner: dict, shared: Path):
    code = (f"import sys; sys.path.insert(0, {str(HOST_LOCK_SOURCE.parent)!r}); import host_lock\n"
            f"sys.exit(host_lock.hold({str(state / 'deployctl.lock')!r}, {json.dumps(owner)!r}, "
            f"gpu_devices={devices!r}, directory={str(shared)!r}))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def _devices(tmp: Path, count: int = 4) -> Path:
    dev = tmp / "dev"
    dev.mkdir()
    for i in range(count):
        (dev / f"nvidia{i}").write_text("")
    (dev / "nvidiactl").write_text("")
    return dev


def test_two_state_dirs_on_one_host_contend_for_the_same_gpus(tmp_path):
    dev, shared = _devices(tmp_path), tmp_path / "lock"
    shared.mkdir()
    first, answer = _hold(tmp_path / "state-a", f"{dev}/nvidia*", {"command": "up", "run": "a", "pid": 1}, shared)
    assert answer["acquired"] is True
    try:
        # another config: another state_dir, the same GPUs, spelled differently (a link, another glob)
        (tmp_path / "alias").symlink_to(dev)
        second, refused = _hold(tmp_path / "state-b", f"{tmp_path}/alias/nvidia[0-1]", {"run": "b", "pid": 2}, shared)
        assert second.wait(10) == 0
        assert refused["acquired"] is False and refused["device"] == str(dev / "nvidia0")
        assert refused["owner"]["run"] == "a" and refused["owner"]["host_pid"] == first.pid
        document = parse_host_lock(json.dumps(refused), "h")
        assert document["lock"].startswith(str(shared))
        # the refused run kept nothing: its own state dir has no owner file
        assert not (tmp_path / "state-b" / "deployctl.lock.owner.json").exists()
    finally:
        first.stdin.write("release\n")
        first.stdin.close()
        first.wait(10)
    third, answer = _hold(tmp_path / "state-b", f"{dev}/nvidia1", {"pid": 3}, shared)
    assert answer["acquired"] is True
    third.stdin.close()
    third.wait(10)


@pytest.mark.parametrize("mine,theirs", [("nvidia[0-1]", "nvidia[2-3]"), ("nvidia0", "nvidia3"),
                                         ("nvidia[02]", "nvidia[13]")])
def test_disjoint_gpu_sets_of_one_host_proceed(tmp_path, mine, theirs):
    dev, shared = _devices(tmp_path), tmp_path / "lock"
    shared.mkdir()
    first, answer = _hold(tmp_path / "a", f"{dev}/{mine}", {"pid": 1}, shared)
    second, other = _hold(tmp_path / "b", f"{dev}/{theirs}", {"pid": 2}, shared)
    try:
        assert answer["acquired"] is True and other["acquired"] is True
    finally:
        for proc in (first, second):
            proc.stdin.close()
            proc.wait(10)


def test_gpu_lock_files_are_shared_by_every_user_and_never_followed(tmp_path):
    dev, shared = _devices(tmp_path, 1), tmp_path / "lock"
    shared.mkdir()
    [(device, path)] = [p for p in host_lock.gpu_lock_paths(f"{dev}/nvidia0", str(shared))]
    fd, writable = host_lock._open_shared(path)
    os.close(fd)
    assert writable  # created by this user: its owner note may be written
    assert os.stat(path).st_mode & 0o777 == 0o666
    os.unlink(path)
    os.symlink(tmp_path / "victim", path)  # planted by another user of the host
    with pytest.raises(OSError):
        host_lock._open_shared(path)
    assert not (tmp_path / "victim").exists()


def test_shared_dir_is_world_writable_and_sticky(tmp_path):
    plain, sticky = tmp_path / "plain", tmp_path / "sticky"
    plain.mkdir()
    sticky.mkdir()
    plain.chmod(0o777)
    sticky.chmod(0o1777)
    assert host_lock.shared_dir((str(tmp_path / "missing"), str(plain), str(sticky))) == str(sticky)
    with pytest.raises(OSError):
        host_lock.shared_dir((str(plain),))


def test_host_lock_command_names_the_gpu_devices():
    from deploy.config.models import Host
    from deploy.engine.locks import host_lock_command

    host = Host(name="h", address="127.0.0.1", state_dir="/var/lib/x", gpu_devices="/dev/nvidia?")
    command = host_lock_command(host, "<owner>", script="<s>")
    assert command.endswith("'/dev/nvidia?'")
