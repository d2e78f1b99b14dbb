"""Bad input: a clear error that names the file, the documented exit code, and untouched files."""

from __future__ import annotations

import errno
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from deploy.remote import fixer as fix
from deploy.remote.fixer import conversion
from tests.fixtures_ckpt import load_all, make_speculators_drafter, snapshot


def fails(path, code, *needles, **kwargs):
    """Run convert, expect FixError(code) whose message contains every needle; return it."""
    with pytest.raises(fix.FixError) as caught:
        fix.convert(path, **kwargs)
    assert caught.value.code == code, caught.value.message
    for needle in needles:
        assert needle in caught.value.message, caught.value.message
    return caught.value


def write_raw(path: Path, header, data: bytes, *, n=None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    body += b" " * ((-len(body)) % 8)
    path.write_bytes(struct.pack("<Q", len(body) if n is None else n) + body + data)
    return path


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


@pytest.fixture
def ckpt_dir(tmp_path):
    directory = tmp_path / "d"
    directory.mkdir()
    return directory


def check_untouched(directory, snap):
    assert snapshot(directory) == snap
    assert not (directory / ".deployctl-fix-backup.json").exists()


# --------------------------------------------------------------------------------- not safetensors

def test_text_file(ckpt_dir):
    path = ckpt_dir / "model.safetensors"
    path.write_text("this is a README, not weights\n" * 3)
    snap = snapshot(ckpt_dir)
    fails(ckpt_dir, 6, "model.safetensors", "not a safetensors file")
    check_untouched(ckpt_dir, snap)


def test_pickle_file(ckpt_dir):
    path = ckpt_dir / "model.safetensors"
    path.write_bytes(pickle.dumps({"layers.0.weight": list(range(100))}, protocol=2))
    snap = snapshot(ckpt_dir)
    fails(ckpt_dir, 6, "model.safetensors", "not a safetensors file")
    check_untouched(ckpt_dir, snap)


def test_tiny_file(ckpt_dir):
    (ckpt_dir / "model.safetensors").write_bytes(b"abc")
    fails(ckpt_dir, 6, "model.safetensors", "fewer than the 8-byte")


def test_truncated_file(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    path = drafter / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[:-100])
    snap = snapshot(drafter)
    fails(drafter, 6, "model.safetensors", "truncated")
    check_untouched(drafter, snap)


def test_header_length_larger_than_the_file(ckpt_dir):
    write_raw(ckpt_dir / "model.safetensors", {"a": entry()}, b"\0" * 8, n=5000)
    fails(ckpt_dir, 6, "model.safetensors", "header length of 5000 bytes")


def test_header_length_over_100_mb(ckpt_dir):
    write_raw(ckpt_dir / "model.safetensors", {"a": entry()}, b"\0" * 8, n=200000000)
    fails(ckpt_dir, 6, "model.safetensors", "100 MB")


@pytest.mark.parametrize("body, needle", [
    (b"{not json at all}", "not JSON"),
    (b"[1, 2, 3]", "not an object"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b'{"a": 5}', "expected an object"),
    (b'{"__metadata__": {"format": 1}}', "__metadata__"),
])
def test_header_not_a_json_object(ckpt_dir, body, needle):
    write_raw(ckpt_dir / "model.safetensors", body, b"")
    snap = snapshot(ckpt_dir)
    fails(ckpt_dir, 6, "model.safetensors", needle)
    check_untouched(ckpt_dir, snap)


@pytest.mark.parametrize("field", ["dtype", "shape", "data_offsets"])
def test_entry_missing_a_field(ckpt_dir, field):
    bad = entry()
    del bad[field]
    write_raw(ckpt_dir / "model.safetensors", {"layers.0.x": bad}, b"\0" * 8)
    fails(ckpt_dir, 6, "model.safetensors", "'layers.0.x'", "has no %s" % field)


@pytest.mark.parametrize("header, needle", [
    ({"a": entry(dtype="F128")}, "unknown dtype 'F128'"),
    ({"a": entry(shape=(-1,))}, "non-negative integers"),
    ({"a": entry(shape=(True,))}, "non-negative integers"),
    ({"a": entry(offsets=(8, 0))}, "0 <= begin <= end"),
    ({"a": entry(offsets=(0, 12))}, "needs 8"),                         # size != prod*dtype
    ({"a": entry(dtype="F4", shape=(3,), offsets=(0, 2))}, "whole bytes"),
    ({"a": entry(), "b": entry(offsets=(12, 20))}, "hole"),
    ({"a": entry(), "b": entry(offsets=(4, 12))}, "overlaps"),
])
def test_bad_tensor_entries(ckpt_dir, header, needle):
    write_raw(ckpt_dir / "model.safetensors", header, b"\0" * 20)
    snap = snapshot(ckpt_dir)
    fails(ckpt_dir, 6, "model.safetensors", needle)
    check_untouched(ckpt_dir, snap)


def test_data_buffer_longer_than_the_last_offset(ckpt_dir):
    write_raw(ckpt_dir / "model.safetensors", {"a": entry()}, b"\0" * 9)
    fails(ckpt_dir, 6, "model.safetensors", "trailing bytes")


def test_duplicate_key_in_header(ckpt_dir):
    body = b'{"a":' + json.dumps(entry()).encode() + b',"a":' + json.dumps(entry()).encode() + b"}"
    write_raw(ckpt_dir / "model.safetensors", body, b"\0" * 8)
    fails(ckpt_dir, 6, "model.safetensors", "'a' twice")


def test_rename_that_would_create_a_duplicate_key(ckpt_dir):
    save_file({"layers.0.x.weight": np.zeros(2, np.float32),
               "midlayer.x.weight": np.ones(2, np.float32)}, str(ckpt_dir / "model.safetensors"))
    snap = snapshot(ckpt_dir)
    fails(ckpt_dir, 6, "model.safetensors", "duplicate key", "midlayer.x.weight")
    check_untouched(ckpt_dir, snap)


def test_duplicate_across_shards_is_refused(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", sharded=True)
    shard = sorted(drafter.glob("*.safetensors"))[1]
    save_file({"layers.0.hidden_norm.weight": np.zeros(64, np.float16)},
              str(drafter / "extra.safetensors"))
    index = json.loads((drafter / "model.safetensors.index.json").read_text())
    index["weight_map"]["zz"] = "extra.safetensors"
    (drafter / "model.safetensors.index.json").write_text(json.dumps(index))
    fails(drafter, 6, "layers.0.hidden_norm.weight", "extra.safetensors")
    assert shard.exists()


# ------------------------------------------------------------------------------ directory shape

def test_no_weights_in_directory(ckpt_dir):
    (ckpt_dir / "config.json").write_text("{}")
    fails(ckpt_dir, 6, str(ckpt_dir), "no .safetensors file")


def test_several_weights_without_index(ckpt_dir):
    for name in ("a.safetensors", "b.safetensors"):
        save_file({"x": np.zeros(1, np.float32)}, str(ckpt_dir / name))
    fails(ckpt_dir, 6, "a.safetensors", "model.safetensors.index.json")


def test_index_names_a_missing_shard(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", sharded=True)
    os.unlink(sorted(drafter.glob("*.safetensors"))[0])
    fails(drafter, 6, "model-00001-of-00002.safetensors", "no such file")


def test_index_not_json(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", sharded=True)
    (drafter / "model.safetensors.index.json").write_text("{")
    fails(drafter, 6, "model.safetensors.index.json", "not valid JSON")


def test_config_not_json(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    (drafter / "config.json").write_text("{'python': 'dict'}")
    snap = snapshot(drafter)
    fails(drafter, 6, "config.json", "not valid JSON")
    check_untouched(drafter, snap)


def test_speculators_config_without_layer_config(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    config = json.loads((drafter / "config.json").read_text())
    del config["transformer_layer_config"]
    (drafter / "config.json").write_text(json.dumps(config))
    snap = snapshot(drafter)
    fails(drafter, 6, "config.json", "transformer_layer_config")
    check_untouched(drafter, snap)


def test_bad_aux_ids(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    config = json.loads((drafter / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = "2,30,58"
    (drafter / "config.json").write_text(json.dumps(config))
    fails(drafter, 6, "config.json", "list of non-negative integers")


def test_corrupt_sidecar(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    (drafter / ".deployctl-fix-backup.json").write_text("{")
    snap = snapshot(drafter)
    fails(drafter, 6, ".deployctl-fix-backup.json")
    assert snapshot(drafter) == snap


# --------------------------------------------------------------------------- cannot write (10)

def test_read_only_file_via_access_check(tmp_path, monkeypatch):
    drafter = make_speculators_drafter(tmp_path / "d")
    target = str(drafter / "model.safetensors")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if (
        os.fspath(p) == target and m & os.W_OK) else real_access(p, m, *a, **k))
    snap = snapshot(drafter)
    fails(drafter, 10, "model.safetensors", "read-only")
    check_untouched(drafter, snap)


@pytest.mark.parametrize("exc, needle", [
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
    (OSError(errno.EPERM, "Operation not permitted"), "permission denied"),
    (OSError(errno.EROFS, "Read-only file system"), "read-only file system"),
])
def test_open_for_writing_refused(tmp_path, monkeypatch, exc, needle):
    """As root chmod 0444 blocks nothing, so the refusal is injected where the fixer opens."""
    drafter = make_speculators_drafter(tmp_path / "d")
    target = str(drafter / "model.safetensors")
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if os.fspath(path) == target and flags & (os.O_WRONLY | os.O_RDWR):
            raise exc
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    snap = snapshot(drafter)
    error = fails(drafter, 10, "model.safetensors", needle, "nothing was changed")
    assert error.code == 10
    check_untouched(drafter, snap)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod 0444")
def test_chmod_read_only_file(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    os.chmod(drafter / "model.safetensors", 0o444)
    snap = snapshot(drafter)
    fails(drafter, 10, "model.safetensors")
    check_untouched(drafter, snap)


def test_read_only_directory(tmp_path, monkeypatch):
    drafter = make_speculators_drafter(tmp_path / "d")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if (
        os.fspath(p) == str(drafter) and m & os.W_OK) else real_access(p, m, *a, **k))
    snap = snapshot(drafter)
    fails(drafter, 10, str(drafter), "read-only directory")
    check_untouched(drafter, snap)


def test_no_space_on_the_fallback_path_removes_the_tmp_file(tmp_path, monkeypatch):
    drafter = make_speculators_drafter(tmp_path / "d")
    before = load_all(drafter)
    snap = snapshot(drafter)
    real_copy = conversion._copy_range
    seen = []

    def copy_then_fail(src, dst, src_off, length, dst_off, after_chunk=None):
        real_copy(src, dst, src_off, min(length, 1000), dst_off)      # some bytes land
        seen.extend(p.name for p in drafter.iterdir() if p.name.endswith(".tmp-fix"))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(conversion, "_copy_range", copy_then_fail)
    fails(drafter, 10, "model.safetensors", "no space left", "unchanged",
          renames=["layers.0.=model.midlayer."])
    assert seen == [".model.safetensors.tmp-fix"]            # the tmp file existed...
    check_untouched(drafter, snap)                            # ...and is gone, sidecar too
    assert load_all(drafter) == before


def test_no_space_found_before_writing(tmp_path, monkeypatch):
    drafter = make_speculators_drafter(tmp_path / "d")

    class Tiny(object):
        f_bavail, f_frsize = 1, 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Tiny())
    snap = snapshot(drafter)
    fails(drafter, 10, "no space left", renames=["layers.0.=model.midlayer."])
    check_untouched(drafter, snap)
    assert fix.convert(drafter)["status"] == "converted"     # in place needs no space


def test_no_space_for_the_in_place_write_is_reported(tmp_path, monkeypatch):
    """A copy-on-write filesystem can refuse even an overwrite; the header stays as it was."""
    drafter = make_speculators_drafter(tmp_path / "d")
    before = load_all(drafter)
    real_pwrite = os.pwrite
    target_ino = (drafter / "model.safetensors").stat().st_ino

    def fake_pwrite(fd, data, offset):
        if os.fstat(fd).st_ino == target_ino:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", fake_pwrite)
    fails(drafter, 10, "model.safetensors", "no space left")
    assert load_all(drafter) == before
    assert not (drafter / ".deployctl-fix-backup.json").exists()


def test_cli_error_has_no_traceback(tmp_path, capsys):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\x80\x02}q\x00.")
    assert fix.main([str(bad)]) == 6
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and "Traceback" not in captured.err
    assert str(bad) in captured.err
