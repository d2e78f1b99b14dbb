"""The drafter store deletes only what it created, and copies only what lies in the drafter directory.

Issue 17's data loss, reproduced: ``state_dir: ~/data`` put the store at ``~/data/drafters/``, where the
user kept ``kimi-1ep`` and ``kimi-3ep``; the first ``up`` pruned them. ``deployctl fix-keys store DIR
--store FOLDER --keep 1`` pruned a user folder the same way. Issue 22: ``cp -RL`` followed a
``base-model -> ...`` link out of the drafter directory. Run through the zipapp the hosts get.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.cli.main import main
from deploy.facts.fixer import FixerFailure, FixerSummary, parse_fixer_summary
from deploy.remote.fixer import store
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import make_speculators_drafter
from tests.hostile.tree import tree_state


def run_store(store_dir: Path, drafter: Path, last_good: Path, keep: int = 1):
    argv = [sys.executable, str(fixer_zipapp()), "store", "--store", str(store_dir), "--keep", str(keep),
            "--last-good", str(last_good), "--sglang-generation", "legacy", "--", str(drafter)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert len(done.stdout.splitlines()) == 1, done.stdout
    return done.returncode, parse_fixer_summary(done.returncode, done.stdout, done.stderr, "h"), done


def user_checkpoints(folder: Path) -> None:
    """What a user keeps: trained checkpoints, one with a hex-looking name, one with a stray marker."""
    make_speculators_drafter(folder / "kimi-1ep")
    make_speculators_drafter(folder / "kimi-3ep", seed=3)
    make_speculators_drafter(folder / ("ab" * 16), seed=4)              # a 32-hex name, no marker
    fake = folder / ("cd" * 16)
    make_speculators_drafter(fake, seed=5)
    (fake / store.READY_MARKER).write_text("not a fingerprint\n")        # a marker that proves nothing
    (folder / "notes.txt").write_text("keep me\n")


def test_pruning_a_store_full_of_user_checkpoints_deletes_none_of_them(tmp_path):
    data = tmp_path / "data"
    user_checkpoints(data / "drafters")
    before = tree_state(data / "drafters")
    new_ones = [make_speculators_drafter(tmp_path / f"new{i}", seed=10 + i) for i in range(3)]
    published = []
    for drafter in new_ones:            # keep 1: each new drafter pushes the previous one out
        code, summary, _ = run_store(data / "drafters", drafter, tmp_path / "last-good.json", keep=1)
        assert code == 0 and isinstance(summary, FixerSummary), summary
        published.append(Path(summary.store).name)
        time.sleep(0.01)
    after = tree_state(data / "drafters")
    assert {k: v for k, v in after.items() if k in before} == before        # every user byte intact
    assert summary.pruned is not None and summary.pruned.removed == [published[1]]
    assert set(summary.pruned.foreign) == {"kimi-1ep", "kimi-3ep", "ab" * 16, "cd" * 16, "notes.txt"}
    assert sorted(p.name for p in (data / "drafters").iterdir()) == sorted(
        ["kimi-1ep", "kimi-3ep", "ab" * 16, "cd" * 16, "notes.txt", published[2]])


@pytest.mark.parametrize("layout", ["drafter-inside-store", "store-is-drafter", "store-inside-drafter",
                                    "via-link"])
def test_a_store_overlapping_the_drafter_is_refused_before_anything(tmp_path, layout):
    root = tmp_path / "data"
    if layout == "drafter-inside-store":
        drafter, store_dir = root / "drafters" / "kimi-1ep", root / "drafters"
    elif layout == "store-is-drafter":
        drafter = store_dir = root / "drafters"
    elif layout == "store-inside-drafter":
        drafter, store_dir = root / "kimi", root / "kimi" / "drafters"
    else:
        drafter, store_dir = root / "drafters" / "kimi-1ep", tmp_path / "alias"
        store_dir.symlink_to(root / "drafters")
    make_speculators_drafter(drafter)
    make_speculators_drafter(root / "drafters" / "kimi-3ep", seed=3)
    before = tree_state(tmp_path)
    code, summary, done = run_store(store_dir, drafter, tmp_path / "lg.json")
    assert code == 3 and isinstance(summary, FixerFailure) and summary.code == 3
    assert str(drafter) in summary.error and str(store_dir) in summary.error and "overlap" in summary.error
    assert tree_state(tmp_path) == before


def test_store_is_not_a_deployctl_verb(tmp_path, capsys):
    user_checkpoints(tmp_path / "folder")
    drafter = make_speculators_drafter(tmp_path / "d")
    before = tree_state(tmp_path)
    code = main(["fix-keys", "store", str(drafter), "--store", str(tmp_path / "folder"), "--keep", "1",
                 "--last-good", str(tmp_path / "lg"), "--sglang-generation", "legacy"])
    captured = capsys.readouterr()
    assert code == 2 and "not a command of deployctl fix-keys" in captured.err
    assert "Traceback" not in captured.out + captured.err
    assert tree_state(tmp_path) == before


def test_even_the_host_command_never_prunes_a_user_folder(tmp_path):
    folder = tmp_path / "folder"
    user_checkpoints(folder)
    before = tree_state(folder)
    code, summary, _ = run_store(folder, make_speculators_drafter(tmp_path / "d"), tmp_path / "lg", keep=1)
    assert code == 0 and isinstance(summary, FixerSummary)
    after = tree_state(folder)
    assert {k: v for k, v in after.items() if k in before} == before
    assert summary.pruned is not None and summary.pruned.removed == []


def make_entry(drafters: Path, name: str, marker: str | None = None, ready: str | None = None) -> Path:
    entry = drafters / name
    entry.mkdir(parents=True)
    (entry / "model.safetensors").write_bytes(b"x")
    if marker is not None:
        (entry / store.OWNER_MARKER).write_text(marker)
    if ready is not None:
        (entry / store.READY_MARKER).write_text(ready)
    os.utime(entry, (1, 1))
    return entry


FP = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4


def owner(fp: str) -> str:
    return json.dumps({"format": store.OWNER_FORMAT, "fingerprint": fp})


# (entry name, owner marker text, ready marker text, removed by pruning?)
OWNERSHIP_CASES = [
    ("owned", FP[:32], owner(FP), None, True),
    ("legacy-ready-marker", FP[:32], None, FP + "\n", True),
    ("legacy-marker-other-fingerprint", FP[:32], None, OTHER + "\n", False),
    ("legacy-marker-short", FP[:32], None, FP[:32] + "\n", False),
    ("no-marker-hex-name", FP[:32], None, None, False),
    ("owner-other-fingerprint", FP[:32], owner(OTHER), None, False),
    ("owner-wrong-format", FP[:32], json.dumps({"format": "x", "fingerprint": FP}), None, False),
    ("owner-not-json", FP[:32], "{", None, False),
    ("owner-fingerprint-list", FP[:32], json.dumps({"format": store.OWNER_FORMAT, "fingerprint": [FP]}), None, False),
    ("user-name-with-owner", "kimi-1ep", owner(FP), FP, False),
    ("upper-hex-name", FP[:32].upper(), owner(FP), None, False),
    ("name-33-hex", FP[:33], owner(FP), None, False),
    ("staging-owned", ".staging-" + FP[:32], owner(FP), None, True),
    ("staging-old-no-owner", ".staging-" + FP[:32], None, FP, False),
    ("staging-user-name", ".staging-kimi", owner(FP), None, False),
]


@pytest.mark.parametrize("name,marker,ready,removed", [c[1:] for c in OWNERSHIP_CASES],
                         ids=[c[0] for c in OWNERSHIP_CASES])
def test_prune_removes_only_entries_it_can_prove_are_its_own(tmp_path, name, marker, ready, removed):
    drafters = tmp_path / "drafters"
    make_entry(drafters, name, marker, ready)
    for i in range(2):          # two newer owned entries: keep 1 leaves the case entry to be pruned
        fresh = "%02x" % (0xa0 + i) * 32
        make_entry(drafters, fresh[:32], owner(fresh))
        os.utime(drafters / fresh[:32], (10 ** 9 + i, 10 ** 9 + i))
    result = store.prune_drafters(str(drafters), 1, str(tmp_path / "none.json"))
    assert (name in result["removed"]) is removed
    assert (drafters / name).exists() is not removed
    assert (name in result["foreign"]) is not removed


@pytest.mark.parametrize("kind", ["symlink-to-owned", "marker-fifo", "marker-symlink", "marker-dir", "entry-file"])
def test_odd_entries_are_foreign_and_never_block(tmp_path, kind):
    drafters = tmp_path / "drafters"
    drafters.mkdir()
    real = make_entry(tmp_path / "elsewhere", FP[:32], owner(FP))
    name = OTHER[:32]
    if kind == "symlink-to-owned":
        (drafters / name).symlink_to(real)
    elif kind == "entry-file":
        (drafters / name).write_text(owner(OTHER))
    else:
        entry = make_entry(drafters, name)
        marker = entry / store.OWNER_MARKER
        if kind == "marker-fifo":
            os.mkfifo(marker)
        elif kind == "marker-symlink":
            (tmp_path / "m").write_text(owner(OTHER))
            marker.symlink_to(tmp_path / "m")
        else:
            marker.mkdir()
    before = tree_state(tmp_path)
    started = time.monotonic()
    result = store.prune_drafters(str(drafters), 0 + 1, str(tmp_path / "none.json"))
    assert time.monotonic() - started < 5              # a FIFO marker is never opened
    assert result["removed"] == [] and result["foreign"] == [name]
    assert tree_state(tmp_path) == before


def test_a_foreign_directory_at_the_entry_path_is_refused_not_replaced(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    from deploy.remote.fixer import fingerprint
    digest = fingerprint(str(drafter))
    squatter = tmp_path / "drafters" / digest[:32]
    make_speculators_drafter(squatter, seed=9)          # the user's own files under that name
    before = tree_state(tmp_path)
    code, summary, _ = run_store(tmp_path / "drafters", drafter, tmp_path / "lg")
    assert code == 10 and isinstance(summary, FixerFailure)
    assert str(squatter) in summary.error and "did not create it" in summary.error
    assert tree_state(tmp_path) == before


# -- what the copy into the store takes: regular files inside, nothing a link leads out to ------------
def _links(drafter: Path, outside: Path) -> dict[str, str]:
    """Each case: link name -> what it points at (created here)."""
    (outside / "base-model").mkdir(parents=True)
    (outside / "base-model" / "big.bin").write_bytes(b"B" * 100000)
    (outside / "secret.txt").write_text("secret\n")
    (outside / "chain2").symlink_to(outside / "secret.txt")
    (drafter / "sub").mkdir()
    (drafter / "sub" / "inner.txt").write_text("inner\n")
    return {
        "base-model": str(outside / "base-model"),                # absolute, a directory
        "rel-base": os.path.relpath(outside / "base-model", drafter),   # ../ relative, a directory
        "passwd": "/etc/passwd",
        "secret-rel": os.path.relpath(outside / "secret.txt", drafter),
        "chain": str(outside / "chain2"),                         # a link to a link out
        "zero": "/dev/zero",
        "subdir-link": "sub",                                     # a directory inside
        "loop": "loop",                                           # points at itself
    }


def test_copy_takes_regular_files_inside_and_names_every_link_it_skips(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    outside = tmp_path / "outside"
    links = _links(drafter, outside)
    for name, target in links.items():
        if name != "loop":
            (drafter / name).symlink_to(target)
    (drafter / "inner-link.txt").symlink_to("sub/inner.txt")            # inside, a file: copied
    os.mkfifo(drafter / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(drafter / "sock"))
    try:
        before = tree_state(tmp_path)
        code, summary, _ = run_store(tmp_path / "drafters", drafter, tmp_path / "lg")
    finally:
        sock.close()
    assert code == 0 and isinstance(summary, FixerSummary), summary
    entry = Path(summary.store)
    copied = sorted(str(p.relative_to(entry)) for p in entry.rglob("*"))
    assert copied == sorted([".deployctl-fix-backup.json", store.OWNER_MARKER, store.READY_MARKER, "config.json",
                             "inner-link.txt", "model.safetensors", "sub", "sub/inner.txt"]), copied
    assert not any(p.is_symlink() for p in entry.rglob("*"))
    skipped = "\n".join(summary.skipped)
    for name in list(links)[:-1] + ["pipe", "sock"]:
        assert str(drafter / name) in skipped, (name, skipped)
    after = tree_state(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before         # drafter and outside intact


@pytest.mark.parametrize("target", ["missing-file", "/no/such/abs", "../gone", "loop"])
def test_a_dangling_link_in_the_drafter_is_exit_6_naming_it(tmp_path, target):
    drafter = make_speculators_drafter(tmp_path / "d")
    (drafter / "tokenizer.json").symlink_to("tokenizer.json" if target == "loop" else target)
    before = tree_state(tmp_path)
    code, summary, _ = run_store(tmp_path / "drafters", drafter, tmp_path / "lg")
    assert code == 6 and isinstance(summary, FixerFailure)
    assert str(drafter / "tokenizer.json") in summary.error
    after = tree_state(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("drafters")} == before
    assert not [k for k in after if k.startswith("drafters/")]


def test_weights_linked_out_like_the_hugging_face_cache_are_copied_as_files(tmp_path):
    blobs = tmp_path / "hub" / "blobs"
    snap = tmp_path / "hub" / "snapshots" / "rev"
    source = make_speculators_drafter(tmp_path / "src")
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        os.replace(source / name, blobs / name)
        (snap / name).symlink_to(os.path.join("..", "..", "blobs", name))
    before = tree_state(tmp_path)
    code, summary, _ = run_store(tmp_path / "drafters", snap, tmp_path / "lg")
    assert code == 0 and isinstance(summary, FixerSummary), summary
    entry = Path(summary.store)
    assert (entry / "model.safetensors").is_file() and not (entry / "model.safetensors").is_symlink()
    assert any("its file is copied" in note for note in summary.skipped)
    after = tree_state(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before
