"""Round 4 (issue 38): what another user of the host plants where deployctl keeps its locks.

The per-GPU lock files live in a directory every user of the host shares (``/run/lock`` ...). A
hard link ``ln VICTIM /run/lock/deployctl-gpu-<sha24>.lock`` made ``up --force`` / ``down`` as root
truncate VICTIM to 0 bytes (the owner note was ftruncate+pwrite'd, the release wrote ""). Every
kind of planted file is generated here, at every GPU lock of a run and at the state dir's lock:
each is refused naming the path (one line, no traceback; deployctl exits 10) or, for another
deployctl user's genuine lock file, flocked read-only and never written. The victim's bytes,
mode and link count are the same afterwards, and nothing is created through a dangling link.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.hostile.test_safe_writes import _socket

from deploy.base.errors import DeployError, ExitCode
from deploy.config.models import Host
from deploy.engine.locks import WRITE_FAILURE, acquire_host_lock
from deploy.remote import host_lock

VICTIM_BYTES = b"root:x:0:0:do not truncate me\n" * 3
OTHER_UID = 4242


class FakeHeld:
    def __init__(self, exit_code, stderr, first_line=""):
        self.exit_code, self.stderr, self.first_line = exit_code, stderr, first_line

    def close(self):
        pass


class Conn:
    def __init__(self, held):
        self.held = held

    def hold(self, command, timeout=None):
        return self.held




def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("planting a file of another uid needs root")


def _victim(tmp: Path, uid: int | None = None) -> Path:
    victim = tmp / "victim" / "shadow"
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(VICTIM_BYTES)
    victim.chmod(0o640)
    if uid is not None:
        _as_root()
        os.chown(victim, uid, uid)
    return victim


def _char_device(path: Path) -> None:
    try:  # a /dev/null of the scratch dir (major 1, minor 3); needs CAP_MKNOD
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")


def _plant_symlink(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp)
    path.symlink_to(victim)
    return victim


def _plant_symlink_other(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp, OTHER_UID)
    path.symlink_to(victim)
    return victim


def _plant_relative_symlink(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp)
    path.symlink_to(os.path.relpath(victim, path.parent))
    return victim


def _plant_symlink_chain(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp)
    middle = tmp / "victim" / "middle"
    middle.symlink_to(victim)
    path.symlink_to(middle)
    return victim


def _plant_dangling(path: Path, tmp: Path) -> Path | None:
    path.symlink_to(tmp / "victim-dir-absent" / "created-through-the-link")
    return None


def _plant_dangling_same_dir(path: Path, tmp: Path) -> Path | None:
    path.symlink_to(path.with_name("created-through-the-link"))
    return None


def _plant_symlink_to_dir(path: Path, tmp: Path) -> Path | None:
    (tmp / "victim").mkdir(exist_ok=True)
    path.symlink_to(tmp / "victim")
    return None


def _plant_symlink_to_fifo(path: Path, tmp: Path) -> Path | None:
    (tmp / "victim").mkdir(exist_ok=True)
    os.mkfifo(tmp / "victim" / "fifo")
    path.symlink_to(tmp / "victim" / "fifo")
    return None


def _plant_hardlink(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp)
    os.link(victim, path)
    return victim


def _plant_hardlink_other(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp, OTHER_UID)
    os.link(victim, path)
    return victim


def _plant_hardlink_0666(path: Path, tmp: Path) -> Path | None:
    # looks exactly like a genuine lock file of ours (mode 0666, ours), but has a second name
    victim = _victim(tmp)
    victim.chmod(0o666)
    os.link(victim, path)
    return victim


def _plant_hardlink_empty(path: Path, tmp: Path) -> Path | None:
    victim = tmp / "victim" / "empty"
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(b"")
    os.link(victim, path)
    return victim


def _plant_hardlink_three(path: Path, tmp: Path) -> Path | None:
    victim = _victim(tmp)
    os.link(victim, tmp / "victim" / "second-name")
    os.link(victim, path)
    return victim


def _plant_fifo(path: Path, tmp: Path) -> Path | None:
    os.mkfifo(path)
    return None


def _plant_directory(path: Path, tmp: Path) -> Path | None:
    path.mkdir()
    (path / "inside").write_bytes(VICTIM_BYTES)
    return None


def _plant_socket(path: Path, tmp: Path) -> Path | None:
    _socket(path)
    return None


def _plant_char_device(path: Path, tmp: Path) -> Path | None:
    _char_device(path)
    return None


#: each kind of file another user can plant at a lock path: refused, named, nothing written
PLANTS = {
    "symlink-to-victim": (_plant_symlink, "a symbolic link"),
    "symlink-to-other-users-file": (_plant_symlink_other, "a symbolic link"),
    "relative-symlink": (_plant_relative_symlink, "a symbolic link"),
    "symlink-chain": (_plant_symlink_chain, "a symbolic link"),
    "dangling-symlink": (_plant_dangling, "a symbolic link"),
    "dangling-symlink-same-dir": (_plant_dangling_same_dir, "a symbolic link"),
    "symlink-to-directory": (_plant_symlink_to_dir, "a symbolic link"),
    "symlink-to-fifo": (_plant_symlink_to_fifo, "a symbolic link"),
    "hardlink-to-victim": (_plant_hardlink, "hard link (2 names)"),
    "hardlink-to-other-users-file": (_plant_hardlink_other, "hard link (2 names)"),
    "hardlink-mode-0666": (_plant_hardlink_0666, "hard link (2 names)"),
    "hardlink-to-empty-file": (_plant_hardlink_empty, "hard link (2 names)"),
    "hardlink-third-name": (_plant_hardlink_three, "hard link (3 names)"),
    "fifo": (_plant_fifo, "a FIFO"),
    "directory": (_plant_directory, "a directory"),
    "socket": (_plant_socket, "a socket"),
    "char-device": (_plant_char_device, "a character device"),
}


def _snapshot(root: Path) -> dict:
    """Every name under ``root``: its type, mode, owner, link count and (for a regular file) bytes."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            body = Path(full).read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(full) if stat.S_ISLNK(st.st_mode) else None
            seen[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                                                 st.st_nlink, st.st_ino, body)
    return seen


def _devices(tmp: Path, count: int) -> Path:
    dev = tmp / "dev"
    dev.mkdir()
    for i in range(count):
        (dev / f"nvidia{i}").write_text("")
    return dev


def _hold(state: Path, devices: str, shared: Path, release: bool = True):
    out = io.StringIO()
    code = host_lock.hold(str(state / "deployctl.lock"), json.dumps({"run": "r", "pid": 1}),
                          stdin=io.BytesIO(b"release\n" if release else b""), stdout=out,
                          gpu_devices=devices, directory=str(shared))
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def _layout(tmp: Path, gpus: int):
    dev, shared, state = _devices(tmp, gpus), tmp / "lock", tmp / "state"
    shared.mkdir()
    shared.chmod(0o1777)
    paths = [Path(p) for _, p in host_lock.gpu_lock_paths(f"{dev}/nvidia*", str(shared))]
    return dev, shared, state, paths


@pytest.mark.parametrize("gpus,planted_at", [(1, 0), (2, 0), (2, 1), (4, 3)])
@pytest.mark.parametrize("release", [True, False], ids=["released", "connection-dropped"])
@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_a_planted_gpu_lock_file_is_refused_naming_it_and_nothing_is_written(tmp_path, kind, gpus, planted_at, release):
    plant, words = PLANTS[kind]
    dev, shared, state, paths = _layout(tmp_path, gpus)
    victim = plant(paths[planted_at], tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    before = _snapshot(tmp_path / "victim") if (tmp_path / "victim").exists() else {}
    planted_before = os.lstat(paths[planted_at])
    with pytest.raises(host_lock.Refused) as refused:
        _hold(state, f"{dev}/nvidia*", shared, release)
    message = str(refused.value)
    assert str(paths[planted_at]) in message and words in message and "\n" not in message
    assert WRITE_FAILURE.search(message)
    if victim is not None:
        assert victim.read_bytes() == victim_bytes
    after = _snapshot(tmp_path / "victim") if (tmp_path / "victim").exists() else {}
    assert after == before
    assert not (tmp_path / "victim-dir-absent").exists()
    assert not paths[planted_at].with_name("created-through-the-link").exists()
    planted_after = os.lstat(paths[planted_at])
    assert (planted_after.st_ino, planted_after.st_mode, planted_after.st_nlink) == \
        (planted_before.st_ino, planted_before.st_mode, planted_before.st_nlink)
    # nothing was taken and no owner note written: the state dir has no owner file, and the GPU
    # lock files created before the refusal are empty (their owner note is written only once all hold)
    assert not (state / "deployctl.lock.owner.json").exists()
    for path in paths[:planted_at]:
        assert path.read_bytes() == b""


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_the_helper_prints_one_line_naming_the_planted_file_and_deployctl_exits_10(tmp_path, kind, monkeypatch, capsys):
    plant, words = PLANTS[kind]
    dev, shared, state, paths = _layout(tmp_path, 2)
    victim = plant(paths[1], tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    monkeypatch.setattr(host_lock, "shared_dir", lambda *a: str(shared))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"release\n")))
    assert host_lock.main(["deployctl-host-lock", str(state / "deployctl.lock"), "{}", f"{dev}/nvidia*"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    [line] = captured.err.splitlines()
    assert str(paths[1]) in line and words in line
    host = Host(name="gpu-a", address="10.0.0.1").model_copy(update={"state_dir": str(state)})
    with pytest.raises(DeployError) as caught:
        acquire_host_lock(Conn(FakeHeld(1, captured.err)), host, {"pid": 1})
    assert caught.value.exit_code == ExitCode.IO
    assert "gpu-a" in str(caught.value) and str(paths[1]) in str(caught.value)
    if victim is not None:
        assert victim.read_bytes() == victim_bytes


def test_the_helper_as_a_process_refuses_a_hard_link_in_one_line(tmp_path):
    """host_lock.main in its own interpreter (the shared dir pointed at the test's): one line, exit 1."""
    dev, shared, state, paths = _layout(tmp_path, 1)
    victim = _plant_hardlink(paths[0], tmp_path)
    driver = (f"import sys; sys.path.insert(0, {str(Path(host_lock.__file__).parent)!r}); import host_lock\n"
              f"host_lock.shared_dir = lambda *a: {str(shared)!r}\n"
              f"sys.exit(host_lock.main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", driver, "deployctl-host-lock", str(state / "deployctl.lock"), "{}",
                           f"{dev}/nvidia*"], input="release\n", capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert str(paths[0]) in proc.stderr and "hard link" in proc.stderr
    assert victim.read_bytes() == VICTIM_BYTES and os.stat(victim).st_nlink == 2


def _genuine_other(path: Path, content: bytes) -> None:
    _as_root()
    path.write_bytes(content)
    os.chown(path, OTHER_UID, OTHER_UID)
    path.chmod(0o666)


@pytest.mark.parametrize("content", [b"", b'{"run": "theirs", "pid": 7}\n', b"not json", b"\0" * 100,
                                     b'{"run": "theirs"}' + b" " * 70000])
@pytest.mark.parametrize("release", [True, False], ids=["released", "connection-dropped"])
def test_another_users_genuine_gpu_lock_is_flocked_read_only_and_never_written(tmp_path, content, release):
    dev, shared, state, paths = _layout(tmp_path, 2)
    _genuine_other(paths[0], content)
    before = _snapshot(shared)
    code, [answer] = _hold(state, f"{dev}/nvidia*", shared, release)
    assert code == 0 and answer["acquired"] is True
    after = _snapshot(shared)
    assert after[paths[0].name] == before[paths[0].name]  # another user's: bytes, mode, owner unchanged
    if not release:  # our own lock file keeps its owner note (the trace of a holder that is gone)
        assert json.loads(paths[1].read_text())["run"] == "r"
    else:
        assert paths[1].read_bytes() == b""


def test_another_users_gpu_lock_held_by_them_still_refuses_us_naming_them(tmp_path):
    """Cross-user contention keeps working: their lock file, opened read-only, is flock-able."""
    dev, shared, state, paths = _layout(tmp_path, 1)
    _genuine_other(paths[0], b'{"command": "up", "run": "theirs", "user": "bob", "pid": 7}\n')
    theirs = os.open(paths[0], os.O_RDONLY)
    try:
        fcntl.flock(theirs, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, [answer] = _hold(state, f"{dev}/nvidia*", shared)
        assert code == 0 and answer["acquired"] is False
        assert answer["owner"]["run"] == "theirs" and answer["lock"] == str(paths[0])
    finally:
        os.close(theirs)
    assert paths[0].read_bytes() == b'{"command": "up", "run": "theirs", "user": "bob", "pid": 7}\n'


@pytest.mark.parametrize("swap", ["regular-file", "symlink", "hardlink", "fifo", "removed"])
def test_a_lock_file_swapped_between_open_and_check_is_refused(tmp_path, monkeypatch, swap):
    """The second (O_RDWR) open must reach the very file the first one checked."""
    dev, shared, state, paths = _layout(tmp_path, 1)
    target = paths[0]
    target.write_bytes(b"")
    target.chmod(0o666)
    victim = _victim(tmp_path)
    real_open = os.open

    def swapping_open(path, flags, *args):
        if str(path) == str(target) and flags & os.O_RDWR and not flags & os.O_CREAT:
            os.unlink(target)
            if swap == "regular-file":
                target.write_bytes(b"other")
            elif swap == "symlink":
                target.symlink_to(victim)
            elif swap == "hardlink":
                os.link(victim, target)
            elif swap == "fifo":
                os.mkfifo(target)
        return real_open(path, flags, *args)

    monkeypatch.setattr(host_lock.os, "open", swapping_open)
    with pytest.raises(host_lock.Refused) as refused:
        _hold(state, f"{dev}/nvidia*", shared)
    assert str(target) in str(refused.value)
    assert victim.read_bytes() == VICTIM_BYTES and os.stat(victim).st_nlink == (2 if swap == "hardlink" else 1)
    if swap == "regular-file":
        assert target.read_bytes() == b"other"


def test_our_own_gpu_lock_file_keeps_working_and_is_created_0666(tmp_path):
    dev, shared, state, paths = _layout(tmp_path, 2)
    code, [answer] = _hold(state, f"{dev}/nvidia*", shared, release=False)
    assert code == 0 and answer["acquired"] is True
    for path in paths:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 and json.loads(path.read_text())["run"] == "r"
    code, [answer] = _hold(state, f"{dev}/nvidia*", shared)  # the next run reuses them
    assert code == 0 and answer["acquired"] is True and answer["previous"]["run"] == "r"
    assert all(path.read_bytes() == b"" for path in paths)


STATE_PLANTS = {k: v for k, v in PLANTS.items() if not k.startswith("hardlink")}


@pytest.mark.parametrize("kind", sorted(STATE_PLANTS))
def test_a_planted_state_dir_lock_file_is_refused_naming_it(tmp_path, kind, monkeypatch, capsys):
    plant, words = STATE_PLANTS[kind]
    state = tmp_path / "state"
    state.mkdir()
    lock = state / "deployctl.lock"
    victim = plant(lock, tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    before = _snapshot(tmp_path / "victim") if (tmp_path / "victim").exists() else {}
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"release\n")))
    assert host_lock.main(["deployctl-host-lock", str(lock), "{}"]) == 1
    captured = capsys.readouterr()
    [line] = captured.err.splitlines()
    assert str(lock) in line and "Traceback" not in captured.err and WRITE_FAILURE.search(line)
    if not kind.startswith("symlink") and not kind.startswith("dangling") and kind != "relative-symlink":
        assert words in line
    if victim is not None:
        assert victim.read_bytes() == victim_bytes
    assert (_snapshot(tmp_path / "victim") if (tmp_path / "victim").exists() else {}) == before
    assert not (tmp_path / "victim-dir-absent").exists()
    assert not lock.with_name("created-through-the-link").exists()
    assert not (state / "deployctl.lock.owner.json").exists()
    host = Host(name="gpu-a", address="10.0.0.1").model_copy(update={"state_dir": str(state)})
    with pytest.raises(DeployError) as caught:
        acquire_host_lock(Conn(FakeHeld(1, captured.err)), host, {"pid": 1})
    assert caught.value.exit_code == ExitCode.IO and str(lock) in str(caught.value)


# -- another user's lock file: the holder's note goes beside it (LOCK.<euid>.owner) ----------------


def _note(path: Path) -> Path:
    return Path(f"{path}.{os.geteuid()}.owner")


@pytest.mark.parametrize("content", [b"", b'{"run": "stale", "pid": 1}\n'])
def test_a_holder_of_another_users_lock_file_is_still_named_through_its_own_note(tmp_path, content):
    """The lock file is another user's (created by a user since deleted, say): the holder cannot write
    it, so its note goes to LOCK.<euid>.owner; a contending run names the holder, not a stale note."""
    dev, shared, state, paths = _layout(tmp_path, 1)
    _genuine_other(paths[0], content)
    os.utime(paths[0], (1_000_000_000, 1_000_000_000))  # the stale note is old
    out = io.StringIO()
    release = threading.Event()

    class Stdin:
        """deployctl's channel: silent until the test releases, then "release" and EOF."""

        def __init__(self):
            self.said = False

        def read(self, n):
            release.wait(20)
            if self.said:
                return b""
            self.said = True
            return b"release\n"

    holder = threading.Thread(target=host_lock.hold, args=(str(state / "deployctl.lock"),
                                                           json.dumps({"run": "holder", "pid": 7})),
                              kwargs={"stdin": Stdin(), "stdout": out, "gpu_devices": f"{dev}/nvidia*",
                                      "directory": str(shared)})
    holder.start()
    try:
        deadline = time.monotonic() + 10
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert json.loads(out.getvalue())["acquired"] is True
        assert json.loads(_note(paths[0]).read_text())["run"] == "holder"
        assert paths[0].read_bytes() == content  # another user's file: never written
        code, [refused] = _hold(tmp_path / "state-b", f"{dev}/nvidia*", shared)
        assert code == 0 and refused["acquired"] is False and refused["owner"]["run"] == "holder"
    finally:
        release.set()
        holder.join(20)
    assert not _note(paths[0]).exists() and paths[0].read_bytes() == content  # removed on release


@pytest.mark.parametrize("kind", ["symlink-to-victim", "hardlink-to-victim", "fifo", "directory",
                                  "symlink-to-other-users-file", "dangling-symlink"])
def test_a_plant_at_the_note_name_is_never_written_through(tmp_path, kind):
    dev, shared, state, paths = _layout(tmp_path, 1)
    _genuine_other(paths[0], b"")
    victim = PLANTS[kind][0](_note(paths[0]), tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    before = os.lstat(_note(paths[0]))
    code, [answer] = _hold(state, f"{dev}/nvidia*", shared)
    assert code == 0 and answer["acquired"] is True  # the lock is taken; only its note is missing
    after = os.lstat(_note(paths[0]))
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    if victim is not None:
        assert victim.read_bytes() == victim_bytes
    assert not (tmp_path / "victim-dir-absent").exists()


def test_a_note_whose_name_lies_about_its_owner_is_not_believed(tmp_path):
    dev, shared, state, paths = _layout(tmp_path, 1)
    _genuine_other(paths[0], b"")
    spoof = Path(f"{paths[0]}.0.owner")  # named for root, owned by another user
    spoof.write_text('{"run": "spoofed", "pid": 1}\n')
    os.chown(spoof, OTHER_UID, OTHER_UID)
    theirs = os.open(paths[0], os.O_RDONLY)
    try:
        fcntl.flock(theirs, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, [refused] = _hold(state, f"{dev}/nvidia*", shared)
        assert refused["acquired"] is False and refused["owner"] is None
    finally:
        os.close(theirs)
