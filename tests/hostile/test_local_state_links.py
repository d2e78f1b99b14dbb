"""Round 4 (issue 38): a link planted in the user's own local state dir.

The local lock's owner file was opened ``O_WRONLY|O_CREAT|O_TRUNC`` (following links): a symbolic or
hard link there truncated and overwrote the file it named; the history append followed a link
too. ``write_regular`` now opens ``O_NOFOLLOW`` without ``O_TRUNC``, fstats (a regular file with one
name, this user's) and only then truncates: every planted kind is exit 10 naming the path, the
victim's bytes are the same, the planted name is left where it was, nothing is created through a
dangling link. Generated: every plant at the owner file (of each lock scope) and at the history.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from deploy.base.errors import ExitCode
from deploy.engine.locks import local_lock, local_lock_path, local_scopes
from deploy.local import history
from deploy.local.state import LocalStateError, write_regular

VICTIM = b"ssh-ed25519 AAAA... do not truncate me\n" * 4


def _victim(tmp: Path, name: str = "authorized_keys") -> Path:
    victim = tmp / "victim" / name
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(VICTIM)
    return victim


def _other_uid(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a file of another uid needs root")
    os.chown(path, 4242, 4242)


def symlink(path, tmp):
    victim = _victim(tmp)
    path.symlink_to(victim)
    return victim, "symbolic link"


def relative_symlink(path, tmp):
    victim = _victim(tmp)
    path.symlink_to(os.path.relpath(victim, path.parent))
    return victim, "symbolic link"


def symlink_chain(path, tmp):
    victim = _victim(tmp)
    (tmp / "victim" / "hop").symlink_to(victim)
    path.symlink_to(tmp / "victim" / "hop")
    return victim, "symbolic link"


def symlink_to_other_users_file(path, tmp):
    victim = _victim(tmp)
    _other_uid(victim)
    path.symlink_to(victim)
    return victim, "symbolic link"


def dangling_symlink(path, tmp):
    path.symlink_to(tmp / "absent-dir" / "created-through-the-link")
    return None, "symbolic link"


def dangling_symlink_beside(path, tmp):
    path.symlink_to(path.with_name("created-through-the-link"))
    return None, "symbolic link"


def symlink_to_fifo(path, tmp):
    (tmp / "victim").mkdir(exist_ok=True)
    os.mkfifo(tmp / "victim" / "fifo")
    path.symlink_to(tmp / "victim" / "fifo")
    return None, "symbolic link|not a regular file"  # the lock's owner file is stat'ed first


def symlink_to_dev_null(path, tmp):
    path.symlink_to("/dev/null")
    return None, "symbolic link|not a regular file"


def hardlink(path, tmp):
    victim = _victim(tmp)
    os.link(victim, path)
    return victim, r"hard link \(2 names\)"


def hardlink_three_names(path, tmp):
    victim = _victim(tmp)
    os.link(victim, tmp / "victim" / "again")
    os.link(victim, path)
    return victim, r"hard link \(3 names\)"


def hardlink_to_empty(path, tmp):
    victim = tmp / "victim" / "empty"
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(b"")
    os.link(victim, path)
    return victim, r"hard link \(2 names\)"


def hardlink_to_other_users_file(path, tmp):
    victim = _victim(tmp)
    _other_uid(victim)
    os.link(victim, path)
    return victim, r"hard link \(2 names\)"


def other_users_file(path, tmp):
    path.write_bytes(VICTIM)
    _other_uid(path)
    return path, "belongs to uid 4242"


def fifo(path, tmp):
    os.mkfifo(path)
    return None, "regular file"


PLANTS = {f.__name__.replace("_", "-"): f for f in (
    symlink, relative_symlink, symlink_chain, symlink_to_other_users_file, dangling_symlink,
    dangling_symlink_beside, symlink_to_fifo, symlink_to_dev_null, hardlink, hardlink_three_names,
    hardlink_to_empty, hardlink_to_other_users_file, other_users_file, fifo)}


def _tree(root: Path) -> dict:
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            body = (Path(full).read_bytes() if stat.S_ISREG(st.st_mode)
                    else os.readlink(full) if stat.S_ISLNK(st.st_mode) else None)
            seen[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                                                 st.st_nlink, st.st_ino, body)
    return seen


def _check_refused(caught, path: Path, words: str, victim, victim_bytes, tmp: Path, before: dict) -> None:
    message = str(caught.value)
    assert caught.value.exit_code == ExitCode.IO and str(path) in message and re.search(words, message), message
    if victim is not None:
        assert victim.read_bytes() == victim_bytes
    assert _tree(tmp) == before  # the planted name, its target and everything else exactly as they were
    assert not (tmp / "absent-dir").exists()


@pytest.mark.parametrize("scopes", [("",), ("host:gpu-a",), ("host:gpu-a", "host:gpu-b", "router:r")],
                         ids=["whole-run", "one-host", "hosts-and-router"])
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_local_lock_owner_file_is_refused_and_left_as_it_was(tmp_path, plant, scopes):
    config = tmp_path / "deployctl.yaml"
    config.write_text("hosts: []\n")
    planted_scope = sorted(scopes)[-1]
    lock = local_lock_path(config, "r1", planted_scope)
    lock.parent.mkdir(parents=True, exist_ok=True)
    owner = lock.with_name(lock.name + ".owner.json")
    victim, words = PLANTS[plant](owner, tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    before = _tree(tmp_path)
    with pytest.raises(LocalStateError) as caught:
        with local_lock(config, "r1", {"pid": 1, "command": "up"}, scopes):
            pytest.fail("the lock was taken through a planted owner file")
    # the locks taken before the refusal are released and their own owner files removed; the lock
    # files themselves (filelock's) may stay, as after every run
    message = str(caught.value)
    assert caught.value.exit_code == ExitCode.IO and str(owner) in message and re.search(words, message), message
    if victim is not None:
        assert victim.read_bytes() == victim_bytes
    without_locks = lambda tree: {k: v for k, v in tree.items() if not k.endswith(".lock")}  # noqa: E731
    assert without_locks(_tree(tmp_path)) == without_locks(before)
    assert not (tmp_path / "absent-dir").exists() and not owner.with_name("created-through-the-link").exists()
    with local_lock(config, "r1", {"pid": 2}, local_scopes(["gpu-z"])):  # another scope still works
        pass


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_history_is_refused_and_left_as_it_was(tmp_path, plant, rows):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    victim, words = PLANTS[plant](path, tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    history_lock = Path(str(path) + ".lock")
    before = {k: v for k, v in _tree(tmp_path).items()}
    with pytest.raises(LocalStateError) as caught:
        history.append([{"host": f"gpu-{i}", "outcome": "ok"} for i in range(rows)])
    after = {k: v for k, v in _tree(tmp_path).items() if not k.endswith(history_lock.name)}
    message = str(caught.value)
    assert caught.value.exit_code == ExitCode.IO and str(path) in message and re.search(words, message), message
    if victim is not None:
        assert victim.read_bytes() == victim_bytes
    assert after == {k: v for k, v in before.items() if not k.endswith(history_lock.name)}
    assert not (tmp_path / "absent-dir").exists()
    assert not path.with_name("created-through-the-link").exists()


@pytest.mark.parametrize("append", [True, False])
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_write_regular_checks_before_it_truncates(tmp_path, plant, append):
    path = tmp_path / "state" / "target"
    path.parent.mkdir()
    victim, words = PLANTS[plant](path, tmp_path)
    victim_bytes = victim.read_bytes() if victim is not None else None
    before = _tree(tmp_path)
    with pytest.raises(LocalStateError) as caught:
        write_regular(path, b"new\n", "the test file", append=append)
    _check_refused(caught, path, words, victim, victim_bytes, tmp_path, before)


@pytest.mark.parametrize("append", [True, False])
def test_write_regular_still_writes_its_own_file(tmp_path, append):
    path = tmp_path / "target"
    write_regular(path, b"one\n", "the test file", append=append)
    write_regular(path, b"two\n", "the test file", append=append)
    assert path.read_bytes() == (b"one\ntwo\n" if append else b"two\n")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
