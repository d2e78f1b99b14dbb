"""The installed helper's compiled-code cache (deploy/facts/inline.py _CACHE): used only when it is
this program's, whole, the user's own and not writable by others; anything else planted at its place
is neither used, followed nor replaced, and the helper answers the same in every case."""

from __future__ import annotations

import marshal
import os
import re
import stat
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from deploy.facts import helpers
from deploy.facts.inline import inline_program

#: a helper shaped like host_ops: the entry imports a sibling module, prints one line
PACKAGE = [("util", "def double(x):\n    return 2 * int(x)\n"),
           ("tool", "import sys\nimport util\nprint(util.double(sys.argv[1]))\n")]
TAG = sys.implementation.cache_tag


def install(folder: Path, name: str = "tool") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    path = folder / f"{name}.py"
    path.write_text(inline_program(PACKAGE, "tool", cache_as=name))
    return path


def run(path: Path, *flags: str, arg: str = "21") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", "-S", *flags, str(path), arg], capture_output=True, text=True,
                          timeout=60)


def cache_files(folder: Path) -> list[Path]:
    cache = folder / "__pycache__"
    return sorted(cache.iterdir()) if cache.is_dir() and not cache.is_symlink() else []


def the_cache(path: Path) -> Path:
    [found] = [p for p in cache_files(path.parent) if re.fullmatch(rf"tool\.[0-9a-f]{{16}}\.{TAG}\.bin", p.name)]
    return found


def forge(path: Path, source: str) -> bytes:
    """A cache that passes every check but holds other code: what a writable cache would let in."""
    cache = the_cache(path)
    head = cache.read_bytes().split(b"\n", 1)[0].rsplit(b" ", 1)[0]
    body = marshal.dumps({"util": compile(PACKAGE[0][1], "<inline util>", "exec"),
                          "tool": compile(source, "<inline tool>", "exec")})
    return head + b" " + str(zlib.crc32(body)).encode() + b"\n" + body


def test_the_first_run_writes_the_cache_and_the_next_runs_use_it(tmp_path):
    path = install(tmp_path / "helpers")
    first = run(path)
    assert (first.returncode, first.stdout, first.stderr) == (0, "42\n", "")
    cache = the_cache(path)
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    # the cached code is what runs: a forged cache (the user's own, mode 0600) changes the answer
    cache.write_bytes(forge(path, "print(\"from the cache\")\n"))
    cache.chmod(0o600)
    assert run(path).stdout == "from the cache\n"


def test_the_inline_programs_sent_with_c_carry_no_cache():
    """``-c`` programs (the doctor, the locks, the router calls) write nothing on the host."""
    program = inline_program(PACKAGE, "tool")
    assert "__pycache__" not in program and "_cache" not in program
    installed = helpers.helper_payloads()["host_ops.py"].decode()
    assert "__pycache__" in installed and "def _cache" in installed


def test_a_new_helper_replaces_its_stale_caches_and_only_those(tmp_path):
    folder = tmp_path / "helpers"
    path = install(folder)
    cache = folder / "__pycache__"
    cache.mkdir(mode=0o700)
    stale = [cache / f"tool.{'0' * 16}.{TAG}.bin", cache / f"tool.{'1' * 16}.cpython-38.bin",
             cache / f"tool.{'2' * 16}.{TAG}.bin.4242.tmp"]
    kept = [cache / "tool.bin", cache / f"other.{'0' * 16}.{TAG}.bin", cache / "notes.txt",
            cache / f"tool.{'3' * 15}.{TAG}.bin"]
    for p in stale + kept:
        p.write_bytes(b"x")
        p.chmod(0o600)
    assert run(path).stdout == "42\n"
    assert sorted(p.name for p in cache.iterdir()) == sorted([the_cache(path).name] + [p.name for p in kept])


@pytest.mark.parametrize("how", ["link-to-a-user-file", "link-to-a-folder", "other-owner", "group-writable",
                                 "directory"])
def test_a_stale_name_that_is_not_its_own_file_is_never_removed_nor_followed(tmp_path, how):
    """Only a regular file of the user's own, not writable by others, with a stale name of this helper is
    removed: a link named so (to a user's checkpoint, to a folder) stays and so does what it points at."""
    if how == "other-owner" and os.geteuid() != 0:
        pytest.skip("planting another user's file needs root")
    folder = tmp_path / "helpers"
    path = install(folder)
    cache = folder / "__pycache__"
    cache.mkdir(mode=0o700)
    victim = tmp_path / "checkpoint" / "model.safetensors"
    victim.parent.mkdir()
    victim.write_bytes(b"weights")
    planted = cache / f"tool.{'0' * 16}.{TAG}.bin"
    if how == "link-to-a-user-file":
        planted.symlink_to(victim)
    elif how == "link-to-a-folder":
        planted.symlink_to(victim.parent, target_is_directory=True)
    elif how == "directory":
        planted.mkdir()
        (planted / "inside").write_bytes(b"x")
    else:
        planted.write_bytes(b"x")
        planted.chmod(0o620 if how == "group-writable" else 0o600)
        if how == "other-owner":
            os.chown(planted, 65534, 65534)
    assert run(path).stdout == "42\n"
    assert os.path.lexists(planted), how
    assert victim.read_bytes() == b"weights" and sorted(p.name for p in victim.parent.iterdir()) == [victim.name]
    if how == "directory":
        assert (planted / "inside").read_bytes() == b"x"


def broken(cache: Path, good: bytes, how: str) -> None:
    """Damage a valid cache ``good`` at ``cache`` one way."""
    head, body = good.split(b"\n", 1)
    if how == "empty":
        cache.write_bytes(b"")
    elif how.startswith("truncated-"):
        cache.write_bytes(good[:int(len(good) * float(how.split("-")[1]))])
    elif how == "bit-flip":
        flipped = bytearray(good)
        flipped[len(head) + 1 + len(body) // 2] ^= 0x40
        cache.write_bytes(bytes(flipped))
    elif how == "no-header":
        cache.write_bytes(body)
    elif how == "other-key":
        cache.write_bytes(re.sub(rb"deployctl-code [0-9a-f]{16}", b"deployctl-code " + b"f" * 16, head) + b"\n" + body)
    elif how == "other-tag":
        cache.write_bytes(head.replace(TAG.encode(), b"cpython-38") + b"\n" + body)
    elif how.startswith("shape-"):
        value = {"list": [1, 2], "none": None, "missing-module": {"tool": compile("print(1)", "t", "exec")},
                 "not-code": {"tool": "print(1)", "util": "x"}}[how[6:]]
        payload = marshal.dumps(value)
        cache.write_bytes(head.rsplit(b" ", 1)[0] + b" " + str(zlib.crc32(payload)).encode() + b"\n" + payload)
    elif how == "garbage":
        payload = os.urandom(4096)
        cache.write_bytes(head.rsplit(b" ", 1)[0] + b" " + str(zlib.crc32(payload)).encode() + b"\n" + payload)
    else:
        raise AssertionError(how)
    cache.chmod(0o600)


DAMAGE = ["empty", "truncated-0.1", "truncated-0.5", "truncated-0.99", "bit-flip", "no-header", "other-key",
          "other-tag", "shape-list", "shape-none", "shape-missing-module", "shape-not-code", "garbage"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_cache_is_compiled_anew_and_replaced(tmp_path, how):
    path = install(tmp_path / "helpers")
    assert run(path).stdout == "42\n"
    cache = the_cache(path)
    good = cache.read_bytes()
    broken(cache, good, how)
    done = run(path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")
    assert cache.read_bytes() == good                      # rewritten whole


def plant(folder: Path, path: Path, how: str, forged: bytes) -> Path:
    """Put something that is not deployctl's own cache where the cache goes; returns what must stay."""
    cache = folder / "__pycache__"
    name = the_cache(path).name
    target = folder.parent / "elsewhere"
    target.mkdir(exist_ok=True)
    if how == "dir-link":
        (target / name).write_bytes(forged)
        (target / name).chmod(0o600)
        for p in cache.iterdir():
            p.unlink()
        cache.rmdir()
        cache.symlink_to(target)
        return target / name
    if how == "dir-group-writable":
        (cache / name).write_bytes(forged)
        cache.chmod(0o770)
        return cache / name
    if how == "dir-other-owner":
        (cache / name).write_bytes(forged)
        os.chown(cache, 65534, 65534)
        return cache / name
    (cache / name).unlink()
    if how == "file-link":
        (target / name).write_bytes(forged)
        (target / name).chmod(0o600)
        (cache / name).symlink_to(target / name)
    elif how == "file-group-writable":
        (cache / name).write_bytes(forged)
        (cache / name).chmod(0o620)
    elif how == "file-world-writable":
        (cache / name).write_bytes(forged)
        (cache / name).chmod(0o602)
    elif how == "file-other-owner":
        (cache / name).write_bytes(forged)
        (cache / name).chmod(0o600)
        os.chown(cache / name, 65534, 65534)
    elif how == "fifo":
        os.mkfifo(cache / name, 0o600)
    elif how == "directory":
        (cache / name).mkdir(mode=0o700)
    elif how == "hard-link-other-owner":
        (target / name).write_bytes(forged)
        os.chown(target / name, 65534, 65534)
        os.link(target / name, cache / name)
    elif how == "oversized":
        (cache / name).write_bytes(forged + b"\0" * (5 << 20))
        (cache / name).chmod(0o600)
    else:
        raise AssertionError(how)
    return cache / name


PLANTS = ["dir-link", "dir-group-writable", "dir-other-owner", "file-link", "file-group-writable",
          "file-world-writable", "file-other-owner", "fifo", "directory", "hard-link-other-owner", "oversized"]


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root (the sandbox tests run as root)")
@pytest.mark.parametrize("how", PLANTS)
def test_a_planted_cache_is_neither_used_followed_nor_replaced(tmp_path, how):
    folder = tmp_path / "helpers"
    path = install(folder)
    assert run(path).stdout == "42\n"
    forged = forge(path, "print(\"planted code ran\")\n")
    planted = plant(folder, path, how, forged)
    before = (planted.lstat().st_mode, planted.lstat().st_uid, planted.read_bytes() if planted.is_file() else None)
    for _ in range(2):
        done = subprocess.run([sys.executable, "-I", "-S", str(path), "21"], capture_output=True, text=True,
                              timeout=20)
        assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")
    after = (planted.lstat().st_mode, planted.lstat().st_uid, planted.read_bytes() if planted.is_file() else None)
    assert after == before


def test_no_cache_is_written_under_python_B_and_a_read_only_folder_is_no_error(tmp_path):
    path = install(tmp_path / "helpers")
    done = run(path, "-B")
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")
    assert not [p for p in cache_files(path.parent) if p.name.endswith(".bin")]
    # a cache folder the helper may not write (a file in its place): the helper answers all the same
    (path.parent / "__pycache__").rmdir()
    (path.parent / "__pycache__").write_text("not a folder")
    done = run(path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")
    assert (path.parent / "__pycache__").read_text() == "not a folder"


def test_the_installed_host_ops_answers_the_same_with_and_without_its_cache(tmp_path):
    folder = tmp_path / "helpers"
    folder.mkdir()
    path = folder / "host_ops.py"
    path.write_bytes(helpers.helper_payloads()["host_ops.py"])
    answers = []
    for i in range(3):     # compiles and writes; then from the cache twice
        target = tmp_path / f"state-{i}.json"
        done = subprocess.run([sys.executable, "-I", "-S", str(path), "write-file", str(target), "--mode", "640"],
                              input=b"{}\n", capture_output=True, timeout=60)
        answers.append((done.returncode, done.stdout, done.stderr, target.read_bytes(),
                        stat.S_IMODE(target.stat().st_mode)))
    assert answers[0] == answers[1] == answers[2] == (0, b"", b"", b"{}\n", 0o640)
    assert [p.name for p in cache_files(folder)] == [
        f"host_ops.{re.search(r'deployctl-code ([0-9a-f]{16})', path.read_text()).group(1)}.{TAG}.bin"]


def test_the_fixer_zipapp_keeps_its_cache_beside_the_archive(tmp_path):
    folder = tmp_path / "helpers"
    folder.mkdir()
    path = folder / "fixer.pyz"
    path.write_bytes(helpers.helper_payloads()["fixer.pyz"])
    answers = [subprocess.run([sys.executable, "-I", "-S", str(path), "--help"], capture_output=True, text=True,
                              timeout=60) for _ in range(2)]
    assert answers[0].returncode == 0 and answers[0].stdout.startswith("usage: fixer.pyz")
    assert (answers[0].returncode, answers[0].stdout, answers[0].stderr) == (
        answers[1].returncode, answers[1].stdout, answers[1].stderr)
    [cache] = cache_files(folder)
    assert re.fullmatch(rf"fixer\.[0-9a-f]{{16}}\.{TAG}\.bin", cache.name)
