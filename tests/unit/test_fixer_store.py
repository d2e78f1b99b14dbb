"""``fixer.pyz store``: fix-keys' whole host side in one command, run for real (the zipapp as the
hosts get it, a real cp, real files), its one JSON summary parsed by deployctl's strict model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.base.errors import RemoteCommandFailed, RemoteOutputError
from deploy.facts.fixer import FixerFailure, FixerSummary, parse_fixer_summary
from deploy.remote.fixer import store
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import contents, make_speculators_drafter

SOURCE = "gpu-a"


def run_store(tmp_path: Path, drafter: Path, *flags: str, keep: int = 2) -> tuple[int, FixerSummary | FixerFailure]:
    argv = [sys.executable, str(fixer_zipapp()), "store", "--store", str(tmp_path / "drafters"), "--keep", str(keep),
            "--last-good", str(tmp_path / "last-good.json")] + list(flags or ["--sglang-version", "0.5.11"])
    done = subprocess.run(argv + ["--", str(drafter)], capture_output=True, text=True, timeout=60)
    assert len(done.stdout.splitlines()) == 1, done.stdout        # exactly one JSON document
    return done.returncode, parse_fixer_summary(done.returncode, done.stdout, done.stderr, SOURCE)


def test_copy_convert_publish_then_reuse_then_skip(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "ckpt")
    original = contents(drafter)
    code, first = run_store(tmp_path, drafter)
    assert code == 0 and isinstance(first, FixerSummary), first
    assert first.status == "converted" and not first.stored_before and first.renamed == 10
    assert first.verification is not None and first.verification.ok and first.verification.generation == "legacy"
    entry = Path(first.store)
    assert entry == tmp_path / "drafters" / first.fingerprint[:32]
    assert (entry / store.READY_MARKER).read_text() == first.fingerprint + "\n"
    assert contents(drafter) == original                     # the user's checkpoint is never modified
    assert not [p for p in (tmp_path / "drafters").iterdir() if p.name.startswith(store.STAGING_PREFIX)]
    assert first.pruned is not None and first.pruned.kept == [entry.name]

    code, again = run_store(tmp_path, drafter, "--sglang-version", "0.5.12")
    assert code == 0 and isinstance(again, FixerSummary)
    assert again.status == "already_converted" and again.stored_before and again.store == first.store
    assert again.verification is not None and again.verification.generation == "modern" and again.pruned is None

    code, skipped = run_store(tmp_path, drafter, "--when", "changed", "--sglang-python", "/no/such/python")
    assert code == 0 and isinstance(skipped, FixerSummary)
    assert skipped.status == "unchanged" and skipped.sglang_version_read is None   # nothing read or converted


def test_version_is_read_under_sglang_python_in_the_same_command(tmp_path):
    site = tmp_path / "site"
    (site / "sglang-0.5.12.dist-info").mkdir(parents=True)
    (site / "sglang-0.5.12.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.12\n")
    python = tmp_path / "sglang-python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    code, summary = run_store(tmp_path, make_speculators_drafter(tmp_path / "ckpt"), "--sglang-python", str(python))
    assert code == 0 and isinstance(summary, FixerSummary)
    assert summary.sglang_version == "0.5.12" and summary.verification.generation == "modern"


def test_no_sglang_is_reported_with_the_raw_read_and_nothing_is_copied(tmp_path):
    code, summary = run_store(tmp_path, make_speculators_drafter(tmp_path / "ckpt"), "--sglang-python", sys.executable)
    assert code == store.EXIT_NO_SGLANG_VERSION and isinstance(summary, FixerSummary)
    assert summary.status == "no_sglang_version" and "PackageNotFoundError" in summary.sglang_version_read.stderr
    assert not (tmp_path / "drafters").exists()
    from deploy.facts.fixer import parse_sglang_version
    read = summary.sglang_version_read
    with pytest.raises(RemoteCommandFailed, match="SGLang is not installed"):
        parse_sglang_version(read.exit_code, read.stdout, read.stderr, SOURCE)


def test_a_drafter_sglang_cannot_load_is_verified_failed_and_not_published(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "ckpt", layers=2)      # 0.5.11 serves 1 layer only
    code, summary = run_store(tmp_path, drafter)
    assert code == 8 and isinstance(summary, FixerSummary) and summary.status == "verify_failed"
    assert summary.verification is not None and not summary.verification.ok
    assert "only supports 1 layer" in summary.verification.problems[0]
    assert list((tmp_path / "drafters").iterdir()) == []                 # neither published nor staged


def test_a_broken_checkpoint_is_an_error_document(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "ckpt")
    os.truncate(drafter / "model.safetensors", 100)
    code, summary = run_store(tmp_path, drafter)
    assert code == 6 and isinstance(summary, FixerFailure) and "model.safetensors" in summary.error
    code, summary = run_store(tmp_path, tmp_path / "missing")
    assert code == 6 and isinstance(summary, FixerFailure) and "missing" in summary.error


def test_a_checkpoint_written_during_the_copy_is_refused_and_the_staging_copy_removed(tmp_path, monkeypatch):
    drafter = make_speculators_drafter(tmp_path / "ckpt")
    answers = iter(["a" * 64, "b" * 64])
    monkeypatch.setattr(store, "fingerprint", lambda path: next(answers))
    with pytest.raises(store.FixError) as caught:
        store.store_drafter(str(drafter), str(tmp_path / "drafters"), keep=2, last_good=str(tmp_path / "lg"),
                            generation="legacy")
    assert caught.value.code == 6 and "changed while it was being copied" in caught.value.message
    assert list((tmp_path / "drafters").iterdir()) == []


def owned_entry(drafters: Path, digest: str, staging: bool = False) -> Path:
    """A store entry as deployctl makes it: fingerprint name, owner marker inside."""
    entry = drafters / ((store.STAGING_PREFIX if staging else "") + digest[:32])
    entry.mkdir(parents=True)
    (entry / store.OWNER_MARKER).write_text(json.dumps({"format": store.OWNER_FORMAT, "fingerprint": digest}))
    return entry


def test_prune_keeps_the_most_recent_and_the_last_good(tmp_path):
    drafters = tmp_path / "drafters"
    names = {}
    for i, label in enumerate(["old-good", "a", "b", "c"]):
        entry = owned_entry(drafters, ("%x" % (i + 10)) * 64)
        names[label] = entry.name
        os.utime(entry, (1000 + i, 1000 + i))
    dead = owned_entry(drafters, "d" * 64, staging=True)
    os.utime(dead, (1, 1))
    live = owned_entry(drafters, "e" * 64, staging=True)                  # a conversion running now
    (tmp_path / "last-good.json").write_text(json.dumps({"drafter_path": str(drafters / names["old-good"])}))
    result = store.prune_drafters(str(drafters), 2, str(tmp_path / "last-good.json"))
    assert sorted(os.listdir(drafters)) == sorted([live.name, names["b"], names["c"], names["old-good"]])
    assert result["removed"] == sorted([dead.name, names["a"]]) and result["protected"] == names["old-good"]


def test_the_new_drafter_is_the_most_recent_and_an_old_one_is_pruned(tmp_path):
    first = make_speculators_drafter(tmp_path / "one")
    second = make_speculators_drafter(tmp_path / "two", hidden=128)
    _, one = run_store(tmp_path, first, keep=1)
    time.sleep(0.01)
    _, two = run_store(tmp_path, second, keep=1)
    assert isinstance(one, FixerSummary) and isinstance(two, FixerSummary)
    assert two.pruned is not None and two.pruned.removed == [Path(one.store).name]
    assert sorted(os.listdir(tmp_path / "drafters")) == [Path(two.store).name]


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(status="published"), lambda d: d.update(extra=1), lambda d: d.pop("store"),
    lambda d: d.update(fingerprint="xyz"), lambda d: d.update(renamed=True), lambda d: d.update(renamed=-1),
    lambda d: d["verification"].update(ok="yes"), lambda d: d["files"].append({"file": "x", "mode": "moved", "renamed": 0}),
])
def test_a_summary_of_another_shape_is_a_remote_output_error(tmp_path, mutate):
    drafter = make_speculators_drafter(tmp_path / "ckpt")
    done = subprocess.run([sys.executable, str(fixer_zipapp()), "store", "--store", str(tmp_path / "s"), "--keep", "2",
                           "--last-good", str(tmp_path / "lg"), "--sglang-generation", "legacy", "--", str(drafter)],
                          capture_output=True, text=True, timeout=60)
    document = json.loads(done.stdout)
    assert isinstance(parse_fixer_summary(0, done.stdout, "", SOURCE), FixerSummary)
    mutate(document)
    with pytest.raises(RemoteOutputError) as err:
        parse_fixer_summary(0, json.dumps(document), "", SOURCE)
    assert SOURCE in str(err.value)


def test_usage_errors_are_error_documents(tmp_path):
    done = subprocess.run([sys.executable, str(fixer_zipapp()), "store", "--keep", "0", "--store", "s", "--last-good",
                           "l", "--sglang-generation", "legacy", "--", "d"], capture_output=True, text=True, timeout=60)
    summary = parse_fixer_summary(done.returncode, done.stdout, done.stderr, SOURCE)
    assert done.returncode == 2 and isinstance(summary, FixerFailure) and "--keep" in summary.error
