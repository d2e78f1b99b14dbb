"""Round 4 (issue 44): no local write of deployctl follows a name it did not create.

``status --prom-file`` is usually fed from cron as root into a textfile-collector directory other
accounts can write: a symbolic link planted there at the prom file's name made round 3's code
replace /etc/passwd with 27 lines of metrics. Generated here: every kind of planted name (a
symbolic link to a victim file, a dangling one, one to a directory, a hard link to a victim, a
FIFO, a socket, a device, a directory) at every path deployctl writes locally through its one
safe write (the prom file, the bench report, ``replace_file`` itself), written as root and as
an unprivileged user. Each must be refused with exit 10 naming the path, and every other file
(the victim above all) must be byte for byte and inode for inode what it was.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Callable

import pytest

from deploy.base.errors import ExitCode
from deploy.local.state import LocalStateError, replace_file
from deploy.render import bench_report
from deploy.verbs import status
from tests.hostile.test_safe_writes import _char_device, _socket

NOBODY = 65534


#: name -> (plant(at, victim_dir), words the refusal must say)
PLANTS: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "symlink-to-victim": (lambda at, v: at.symlink_to(v / "passwd"), "symbolic link"),
    "symlink-to-victim-relative": (lambda at, v: at.symlink_to(os.path.relpath(v / "passwd", at.parent)),
                                   "symbolic link"),
    "symlink-chain": (lambda at, v: (at.parent.joinpath("hop").symlink_to(v / "passwd"),
                                     at.symlink_to(at.parent / "hop")) and None, "symbolic link"),
    "dangling-symlink": (lambda at, v: at.symlink_to(v / "created-by-nobody"), "symbolic link"),
    "symlink-to-directory": (lambda at, v: at.symlink_to(v), "symbolic link"),
    "symlink-to-fifo": (lambda at, v: at.symlink_to(v / "fifo"), "symbolic link"),
    "hardlink-to-victim": (lambda at, v: os.link(v / "passwd", at), "hard link"),
    "fifo": (lambda at, v: os.mkfifo(at), "a FIFO"),
    "socket": (lambda at, v: _socket(at), "a socket"),
    "device": (lambda at, v: _char_device(at), "a character device"),
    "directory": (lambda at, v: at.mkdir(), "a directory"),
}


def _writers(directory: Path) -> dict[str, tuple[Path, Callable[[], object]]]:
    """Every local write that goes through the one safe write, with the name it writes."""
    stamp = "20261204T000000.000000Z"
    report = directory / f"report-{stamp}.json"

    def bench() -> object:
        import deploy.render.bench_report as module

        real = module.datetime

        class Frozen:  # the report's name is its time: plant at the name it will take
            @staticmethod
            def now(tz):
                return real.strptime(stamp, "%Y%m%dT%H%M%S.%fZ")

        module.datetime = Frozen  # type: ignore[misc,assignment]
        try:
            return bench_report.write(bench_report.document("r", 4, [], []), directory)
        finally:
            module.datetime = real  # type: ignore[misc]

    return {
        "prom-file": (directory / "deployctl.prom", lambda: status.write_prom_file(directory / "deployctl.prom",
                                                                                   "deployctl_status_up 1\n")),
        "replace-file": (directory / "record.json", lambda: replace_file(directory / "record.json", b"{}\n", "a record")),
        "bench-report": (report, bench),
    }


def _snapshot(*roots: Path) -> dict[str, tuple]:
    """Every name under ``roots``: its type, inode, link target or content hash (links never followed)."""
    seen = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                detail: object = None
                if stat.S_ISLNK(st.st_mode):
                    detail = os.readlink(path)
                elif stat.S_ISREG(st.st_mode):
                    detail = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                seen[path] = (stat.S_IFMT(st.st_mode), st.st_ino, st.st_nlink, st.st_uid, detail)
    return seen


def _as_user(uid: int, action: Callable[[], object]) -> tuple[int, str]:
    """Run ``action`` in a child that dropped to ``uid``: (exit code, message)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            action()
        except LocalStateError as exc:
            os.write(write, str(exc).encode()[:4000])
            code = int(exc.exit_code)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent as exit 99
            os.write(write, repr(exc).encode()[:4000])
            code = 99
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        message = handle.read().decode()
    _, status_ = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status_), message


@pytest.fixture
def places():
    """A shared collector directory (sticky, world-writable) and a victim's directory beside it, in a
    directory of this test's own that the unprivileged user can reach (pytest's tmp_path is 0700)."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="deployctl-planted-"))
    try:
        yield _places(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _places(tmp_path: Path) -> tuple[Path, Path]:
    shared = tmp_path / "collector"
    victims = tmp_path / "victims"
    shared.mkdir()
    victims.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(shared, 0o1777)
    os.chmod(victims, 0o755)
    (victims / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.chmod(victims / "passwd", 0o644)
    os.mkfifo(victims / "fifo")
    return shared, victims


@pytest.mark.parametrize("who", ["root", "user"])
@pytest.mark.parametrize("writer", ["prom-file", "replace-file", "bench-report"])
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_name_is_refused_exit_10_and_nothing_else_changes(places, plant, writer, who):
    if os.geteuid() != 0:
        pytest.skip("planting other accounts' files and dropping to a user needs root")
    shared, victims = places
    target, action = _writers(shared)[writer]
    make, words = PLANTS[plant]
    make(target, victims)
    before = _snapshot(shared, victims)
    if who == "root":
        with pytest.raises(LocalStateError) as caught:
            action()
        code, message = int(caught.value.exit_code), str(caught.value)
    else:
        code, message = _as_user(NOBODY, action)
    assert code == ExitCode.IO, message
    assert str(target) in message and words in message, message
    assert _snapshot(shared, victims) == before
    assert not (victims / "created-by-nobody").exists()


@pytest.mark.parametrize("who", ["root", "user"])
@pytest.mark.parametrize("writer", ["prom-file", "replace-file", "bench-report"])
def test_an_absent_or_own_regular_name_is_replaced(places, writer, who):
    if who == "user" and os.geteuid() != 0:
        pytest.skip("dropping to a user needs root")
    shared, victims = places
    target, action = _writers(shared)[writer]
    for round_ in range(2):  # absent, then the regular file the first round wrote
        if who == "root":
            action()
        else:
            code, message = _as_user(NOBODY, action)
            assert code == 0, message
        assert stat.S_ISREG(os.lstat(target).st_mode) and os.lstat(target).st_nlink == 1
    assert not [n for n in os.listdir(shared) if n.endswith(".tmp")]
    assert (victims / "passwd").read_text().startswith("root:x:0:0")


def test_a_link_planted_between_the_check_and_the_rename_is_replaced_as_a_name(places, monkeypatch):
    """The check is advice; the rename is the guarantee: rename(2) replaces the name, never the file
    a link there names."""
    shared, victims = places
    target = shared / "deployctl.prom"
    import deploy.local.state as state

    real = state.refuse_planted

    def check_then_plant(path, what):
        answer = real(path, what)
        target.symlink_to(victims / "passwd")  # the race: planted after the check
        return answer

    monkeypatch.setattr(state, "refuse_planted", check_then_plant)
    status.write_prom_file(target, "deployctl_status_up 1\n")
    assert not target.is_symlink() and target.read_text() == "deployctl_status_up 1\n"
    assert (victims / "passwd").read_text().startswith("root:x:0:0")
