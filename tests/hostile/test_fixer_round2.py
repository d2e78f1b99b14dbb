"""Hostile input round 2 for the key fixer (issues 17 and 22): every case ends with the documented exit
code, a message naming the file, no traceback, and not one byte changed inside or outside the checkpoint.

Classes, each generated: checkpoints the planned conversion would fail to verify (exit 8 before the
first write); config.json that is missing or not a regular file (exit 6 before the first write);
safetensors header fields of the wrong JSON type; non-regular weights files in every fixer path (the
CLI, --check, --fingerprint, --restore and the host's ``store``: refused at once, never opened for a
blocking read); an oversized config.json under --fingerprint (bounded); forged or damaged backup
sidecars and links planted for --restore and for the fixer's temporary files.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.cli.main import main
from deploy.remote import fixer as fix
from deploy.remote.fixer import sidecar as sidecar_mod
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import make_speculators_drafter
from tests.hostile.tree import assert_clean_failure, tree_state

WEIGHTS = "model.safetensors"
SIDECAR = fix.SIDECAR_NAME


def read_file(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_file(path: Path, header: dict, data: bytes) -> None:
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * ((-len(body)) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def add_tensors(drafter: Path, names) -> None:
    """Append one-byte U8 tensors named ``names`` to the drafter's weights (a valid safetensors file)."""
    header, data = read_file(drafter / WEIGHTS)
    extra = bytearray()
    end = len(data)
    for name in names:
        header[name] = {"dtype": "U8", "shape": [1], "data_offsets": [end, end + 1]}
        extra += b"\x01"
        end += 1
    write_file(drafter / WEIGHTS, header, data + bytes(extra))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["fix-keys", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_zipapp(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(fixer_zipapp()), *argv], capture_output=True, text=True,
                          timeout=timeout)


# -- 1. the planned conversion fails verification: exit 8, nothing written ------------------------------
def _stray(n):
    return lambda d: add_tensors(d, ["stray.%d.weight" % i for i in range(n)])


VERIFY_CASES = [
    ("empty-tensor-name", lambda d: add_tensors(d, [""]), [], "empty"),
    ("nul-tensor-name", lambda d: add_tensors(d, ["layers.0.a\0b"]), [], "control character"),
    ("newline-tensor-name", lambda d: add_tensors(d, ["x\ny"]), [], "control character"),
    ("escape-tensor-name", lambda d: add_tensors(d, ["\x1b]0;title\x07"]), [], "control character"),
    ("one-stray-tensor", _stray(1), [], "would drop 1 tensor"),
    ("1000-stray-tensors", _stray(1000), [], "would drop 1000 tensor"),
    ("200k-stray-tensors", _stray(200000), [], "would drop 200000 tensor"),
    ("rename-misses-the-loader", lambda d: None, ["--rename", "layers.0.=x."], "would drop"),
    ("rename-to-modern-name-on-legacy", lambda d: None, ["--rename", "layers.0.=model.layers.0."], "would drop"),
    ("rename-everything-away", lambda d: None, ["--rename", "layers.=z.", "--rename", "fc.=q."], "would drop"),
    ("two-layers-on-legacy", "layers2", [], "only supports 1 layer"),
    ("aux-ids-count-mismatch", "aux2", [], "aux"),
]


#: every case converted and as JSON, except 200k stray tensors once: the JSON form is the same code
VERIFY_PARAMS = [pytest.param(*case, mode, id=f"{case[0]}-{mode}") for case in VERIFY_CASES
                 for mode in ("convert", "json") if (case[0], mode) != ("200k-stray-tensors", "json")]


@pytest.mark.parametrize("name,make,flags,fragment,mode", VERIFY_PARAMS)
def test_a_conversion_that_would_fail_verification_writes_nothing(tmp_path, capsys, name, make, flags,
                                                                  fragment, mode):
    if make == "layers2":
        drafter = make_speculators_drafter(tmp_path / "d", layers=2)
    elif make == "aux2":
        drafter = make_speculators_drafter(tmp_path / "d", aux_ids=(2, 30))
    else:
        drafter = make_speculators_drafter(tmp_path / "d")
        make(drafter)
    (tmp_path / "outside.txt").write_text("x")
    before = tree_state(tmp_path)
    code, out, err = run_cli(capsys, *flags, *(["--json"] if mode == "json" else []),
                             "--sglang-generation", "legacy", "--", str(drafter))
    assert_clean_failure(code, 8, out, err, [fragment], before, tree_state(tmp_path))
    assert len(err) < 20000, len(err)                      # 200k names are not all printed
    if mode == "json":
        document = json.loads(out)
        assert document["status"] == "verify_failed" and document["exit_code"] == 8
        assert not document["verification"]["ok"]
    else:
        assert "nothing written" in out


CONFLICTS = [
    (["--rename", "layers.0.=midlayer.", "--rename", "layers.0.=x."], "conflicts"),
    (["--rename", "layers.=a.", "--rename", "layers.0.=midlayer."], "never applies"),
    (["--rename", "l=a", "--rename", "layers.0.=midlayer."], "never applies"),
]


@pytest.mark.parametrize("flags,fragment", CONFLICTS, ids=["same-prefix-twice", "shadowed", "shadowed-short"])
def test_conflicting_rename_rules_are_refused_before_reading(tmp_path, capsys, flags, fragment):
    drafter = make_speculators_drafter(tmp_path / "d")
    before = tree_state(tmp_path)
    code, out, err = run_cli(capsys, *flags, "--", str(drafter))
    assert_clean_failure(code, 2, out, err, [fragment, "--rename"], before, tree_state(tmp_path))


def test_the_same_rule_twice_is_not_a_conflict(tmp_path, capsys):
    drafter = make_speculators_drafter(tmp_path / "d")
    code, out, err = run_cli(capsys, "--rename", "layers.0.=midlayer.", "--rename", "layers.0.=midlayer.",
                             "--", str(drafter))
    assert code == 0, err


# -- 2. config.json missing or not a regular file: exit 6 before the first write ------------------------
def _config_fifo(c: Path) -> None:
    os.mkfifo(c)


def _config_socket(c: Path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(c))
    return sock


CONFIG_CASES = [
    ("missing", lambda c: None, "has no config.json"),
    ("fifo", _config_fifo, "a FIFO"),
    ("directory", lambda c: c.mkdir(), "a directory"),
    ("socket", _config_socket, "a socket"),
    ("dangling-link", lambda c: c.symlink_to("gone.json"), "dangling link"),
    ("link-to-dev-zero", lambda c: c.symlink_to("/dev/zero"), "character device"),
    ("link-to-directory", lambda c: c.symlink_to("/etc"), "a directory"),
    ("link-to-fifo", lambda c: (os.mkfifo(c.parent / "p"), c.symlink_to("p")), "a FIFO"),
    ("link-loop", lambda c: c.symlink_to(c.name), "dangling link"),
]


#: every case in every mode, except a missing config.json under --check and --fingerprint: that one
#: is fine to fingerprint or check (nothing would be written), and only convert must refuse it
CONFIG_PARAMS = [pytest.param(*case, mode, id=f"{case[0]}-{mode}") for case in CONFIG_CASES
                 for mode in ("convert", "--check", "--fingerprint") if case[0] != "missing" or mode == "convert"]


@pytest.mark.parametrize("name,make,fragment,mode", CONFIG_PARAMS)
def test_config_json_that_is_not_a_file_is_exit_6_with_nothing_written(tmp_path, capsys, name, make,
                                                                      fragment, mode):
    drafter = make_speculators_drafter(tmp_path / "d")
    (drafter / "config.json").unlink()
    keep = make(drafter / "config.json")
    try:
        before = tree_state(tmp_path)
        started = time.monotonic()
        code, out, err = run_cli(capsys, *([] if mode == "convert" else [mode]), "--", str(drafter))
        assert time.monotonic() - started < 10                   # a FIFO is never opened for reading
        assert_clean_failure(code, 6, out, err, ["config.json", fragment], before, tree_state(tmp_path))
        assert "nothing was written" in err or mode != "convert" or name != "missing"
    finally:
        if keep is not None and hasattr(keep, "close"):
            keep.close()


# -- 3. header fields of another JSON type ----------------------------------------------------------------
BAD_VALUES = {
    "dtype": [["F32"], {"F32": 1}, 32, True, 1.5, [], ""],
    "shape": [[[2]], {"0": 2}, None, [None], ["2"], 2, [2.5], [-1]],
    "data_offsets": [{"a": 0}, [[0], [8]], None, [0, None], [0.0, 8.0], "0-8", [0], [True, 8]],
}
TYPE_CASES = [(f"{field}-{json.dumps(v)}", field, v) for field, values in BAD_VALUES.items() for v in values]


@pytest.mark.parametrize("path", ["local", "host"])
@pytest.mark.parametrize("case,field,value", TYPE_CASES, ids=[c[0] for c in TYPE_CASES])
def test_header_fields_of_another_type_are_exit_6_naming_the_file(tmp_path, capsys, case, field, value, path):
    drafter = make_speculators_drafter(tmp_path / "d")
    header, data = read_file(drafter / WEIGHTS)
    header["fc.weight"][field] = value
    write_file(drafter / WEIGHTS, header, data)
    before = tree_state(tmp_path)
    if path == "local":
        code, out, err = run_cli(capsys, "--", str(drafter))
    else:
        done = run_zipapp("store", "--store", str(tmp_path / "store"), "--keep", "1", "--last-good",
                          str(tmp_path / "lg"), "--sglang-generation", "legacy", "--", str(drafter))
        code, out, err = done.returncode, done.stdout, done.stderr
        before["store"] = "dir"               # the store directory itself may be created, empty
        if (tmp_path / "store").exists():
            assert list((tmp_path / "store").iterdir()) == []
    after = tree_state(tmp_path)
    if path == "host":
        after.setdefault("store", "dir")
    assert_clean_failure(code, 6, out, err, [str(drafter / WEIGHTS), "fc.weight"], before, after)
    assert "unhashable" not in out + err


# -- 4. weights that are not a regular file, in every fixer path --------------------------------------
def _weights_fifo(w: Path):
    os.mkfifo(w)


def _weights_socket(w: Path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(w))
    return sock


WEIGHTS_CASES = [
    ("fifo", _weights_fifo),
    ("directory", lambda w: w.mkdir()),
    ("socket", _weights_socket),
    ("link-to-dev-zero", lambda w: w.symlink_to("/dev/zero")),
    ("link-to-fifo", lambda w: (os.mkfifo(w.parent / "pipe"), w.symlink_to("pipe"))),
    ("dangling-link", lambda w: w.symlink_to("/no/such/blob")),
]
FIXER_PATHS = ["convert", "--check", "--fingerprint", "--restore", "store"]


@pytest.mark.parametrize("how", FIXER_PATHS)
@pytest.mark.parametrize("name,make", WEIGHTS_CASES, ids=[c[0] for c in WEIGHTS_CASES])
def test_weights_that_are_not_a_regular_file_are_refused_at_once(tmp_path, name, make, how):
    drafter = make_speculators_drafter(tmp_path / "d")
    if how == "--restore":
        fix.convert(drafter)
    (drafter / WEIGHTS).unlink()
    keep = make(drafter / WEIGHTS)
    try:
        before = tree_state(tmp_path)
        started = time.monotonic()
        if how == "store":
            done = run_zipapp("store", "--store", str(tmp_path / "store"), "--keep", "1", "--last-good",
                              str(tmp_path / "lg"), "--sglang-generation", "legacy", "--", str(drafter))
        else:
            done = run_zipapp(*([] if how == "convert" else [how]), "--", str(drafter))
        elapsed = time.monotonic() - started
    finally:
        if keep is not None and hasattr(keep, "close"):
            keep.close()
    assert elapsed < 10, elapsed
    after = tree_state(tmp_path)
    after.pop("store", None)
    assert_clean_failure(done.returncode, 6, done.stdout, done.stderr, [WEIGHTS], before, after)


# -- 5. --fingerprint reads config.json bounded ------------------------------------------------------------
@pytest.mark.parametrize("size", [(16 << 20) + 1, 2 << 30], ids=["16MiB+1", "2GiB"])
def test_fingerprint_refuses_a_huge_config_json_without_reading_it(tmp_path, size):
    drafter = make_speculators_drafter(tmp_path / "d")
    with open(drafter / "config.json", "r+b") as handle:
        handle.truncate(size)                       # sparse: costs no disk
    before = tree_state(tmp_path) if size < (1 << 30) else None
    program = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")
    done = subprocess.run([sys.executable, "-c", program, sys.executable, str(fixer_zipapp()), "--fingerprint", "--",
                           str(drafter)], capture_output=True, text=True, timeout=60)
    rss_kib = int(done.stderr.strip().splitlines()[-1])
    print("fingerprint of a %d-byte config.json: exit %d, child max RSS %d KiB" % (size, done.returncode, rss_kib))
    assert done.returncode == 6 and "Traceback" not in done.stderr
    assert str(drafter / "config.json") in done.stdout and "limit" in done.stdout
    assert rss_kib < 100 * 1024                     # never read: 2.1 GB RSS before the limit
    if before is not None:
        assert tree_state(tmp_path) == before


# -- 6. forged and damaged backup sidecars, links planted for --restore ----------------------------------
def converted(tmp_path: Path, link_weights: bool = False) -> Path:
    drafter = make_speculators_drafter(tmp_path / "d")
    if link_weights:                                     # a shared blob: converted into a copy
        blobs = tmp_path / "blobs"
        blobs.mkdir()
        os.rename(drafter / WEIGHTS, blobs / "abc")
        os.symlink(os.path.relpath(blobs / "abc", drafter), drafter / WEIGHTS)
    summary = fix.convert(drafter)
    assert summary["exit_code"] == 0
    return drafter


def load_side(drafter: Path) -> dict:
    return json.loads((drafter / SIDECAR).read_text())


def save_side(drafter: Path, side: dict, reseal: bool = True) -> None:
    if reseal:
        side = sidecar_mod.seal(side)
    (drafter / SIDECAR).write_text(json.dumps(side))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _rename_entry(new_name):
    def mutate(drafter, side):
        side["files"][new_name] = side["files"].pop(WEIGHTS)
    return mutate


def _wrong_hash(drafter, side):
    side["content_sha256"] = "0" * 64
    save_side(drafter, side, reseal=False)
    return "skip-save"


def _hash_not_string(drafter, side):
    side["content_sha256"] = ["x"]
    save_side(drafter, side, reseal=False)
    return "skip-save"


def _tampered_after_seal(drafter, side):
    side["files"][WEIGHTS]["known_sha256"] = ["1" * 64]
    save_side(drafter, side, reseal=False)
    return "skip-save"


def _weights_link_to_passwd(drafter, side):
    side["files"][WEIGHTS]["link"] = "/etc/passwd"


def _weights_link_to_outside_copy(drafter, side):
    outside = drafter.parent / "outside.safetensors"
    shutil.copy(drafter / WEIGHTS, outside)
    side["files"][WEIGHTS]["link"] = str(outside)


def _link_with_nul(drafter, side):
    side["files"][WEIGHTS]["link"] = "a\0b"


def _link_not_string(drafter, side):
    side["files"][WEIGHTS]["link"] = ["x"]


SIDECAR_REFUSED = [
    ("wrong-content-hash", _wrong_hash, "does not match"),
    ("content-hash-not-string", _hash_not_string, "content_sha256"),
    ("tampered-after-seal", _tampered_after_seal, "does not match"),
    ("name-dotdot", _rename_entry("../outside.safetensors"), "not a file in the checkpoint"),
    ("name-absolute", _rename_entry("/etc/passwd"), "not a file in the checkpoint"),
    ("name-subdir", _rename_entry("sub/model.safetensors"), "not a file in the checkpoint"),
    ("name-dot-dot-only", _rename_entry(".."), "not a file in the checkpoint"),
    ("name-nul", _rename_entry("model\0.safetensors"), "not a file in the checkpoint"),
    ("name-newline", _rename_entry("model\n.safetensors"), "not a file in the checkpoint"),
    ("name-huge", _rename_entry("m" * 300), "not a file in the checkpoint"),
    ("link-nul", _link_with_nul, "link"),
    ("link-not-string", _link_not_string, "link"),
    ("weights-link-to-passwd", _weights_link_to_passwd, "no longer holds the original"),
    ("weights-link-to-outside-copy", _weights_link_to_outside_copy, "no longer holds the original"),
]


@pytest.mark.parametrize("name,mutate,fragment", SIDECAR_REFUSED, ids=[c[0] for c in SIDECAR_REFUSED])
def test_a_forged_or_damaged_sidecar_is_refused_and_nothing_changes(tmp_path, capsys, name, mutate, fragment):
    drafter = converted(tmp_path)
    side = load_side(drafter)
    if mutate(drafter, side) != "skip-save":
        save_side(drafter, side)
    before = tree_state(tmp_path)
    passwd = Path("/etc/passwd").read_bytes()
    code, out, err = run_cli(capsys, "--restore", "--", str(drafter))
    assert_clean_failure(code, 6, out, err, [], before, tree_state(tmp_path))
    assert fragment in out + err and (SIDECAR in out + err or WEIGHTS in out + err)
    assert Path("/etc/passwd").read_bytes() == passwd


@pytest.mark.parametrize("target", ["/etc/passwd", "../../../../../../etc/passwd", "../outside/config.json",
                                    "/dev/zero", "sub/../../outside/config.json"])
@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "legacy-unsealed"])
def test_a_config_link_out_of_the_directory_is_never_put_back(tmp_path, capsys, target, sealed):
    """The forged sidecar that turned config.json into a link to /etc/passwd: whatever its hash, a
    config.json link leading out of the checkpoint directory is not restored as a link."""
    drafter = converted(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text("{}\n")
    side = load_side(drafter)
    pointed = os.path.normpath(os.path.join(drafter, target))
    original = Path(pointed).read_bytes()[:4096] if Path(pointed).is_file() else b"{}\n"
    side["config"]["original"] = {"size": len(original), "sha256": __import__("hashlib").sha256(original).hexdigest(),
                                  "b64": b64(original)}
    side["config"]["link"] = target
    if not sealed:
        side.pop("content_sha256", None)
        side["version"] = 1
    save_side(drafter, side, reseal=sealed)
    outside_before = tree_state(outside)
    passwd = Path("/etc/passwd").read_bytes()
    code, out, err = run_cli(capsys, "--restore", "--", str(drafter))
    assert "Traceback" not in out + err
    assert code == 0, err
    assert not (drafter / "config.json").is_symlink()
    assert "not put back" in out and "config.json" in out
    assert tree_state(outside) == outside_before and Path("/etc/passwd").read_bytes() == passwd


@pytest.mark.parametrize("kind", ["absolute", "relative", "chain", "to-etc-passwd", "to-dev-zero"])
def test_restore_never_writes_through_a_link_leaving_the_directory(tmp_path, capsys, kind):
    drafter = converted(tmp_path)
    victim = tmp_path / "outside" / "victim.safetensors"
    victim.parent.mkdir()
    os.replace(drafter / WEIGHTS, victim)                 # the converted bytes, now outside
    if kind == "absolute":
        os.symlink(victim, drafter / WEIGHTS)
    elif kind == "relative":
        os.symlink(os.path.relpath(victim, drafter), drafter / WEIGHTS)
    elif kind == "chain":
        os.symlink(victim, tmp_path / "hop")
        os.symlink("../hop", drafter / WEIGHTS)
    elif kind == "to-etc-passwd":
        os.symlink("/etc/passwd", drafter / WEIGHTS)
    else:
        os.symlink("/dev/zero", drafter / WEIGHTS)
    before = tree_state(tmp_path)
    passwd = Path("/etc/passwd").read_bytes()
    code, out, err = run_cli(capsys, "--restore", "--", str(drafter))
    fragment = "outside the checkpoint directory" if kind in ("absolute", "relative", "chain") else ""
    assert_clean_failure(code, 6, out, err, [WEIGHTS, fragment], before, tree_state(tmp_path))
    assert Path("/etc/passwd").read_bytes() == passwd


def test_restore_never_writes_through_a_hard_link(tmp_path, capsys):
    drafter = converted(tmp_path)
    os.link(drafter / WEIGHTS, tmp_path / "elsewhere.safetensors")
    before = tree_state(tmp_path)
    code, out, err = run_cli(capsys, "--restore", "--", str(drafter))
    assert_clean_failure(code, 6, out, err, [WEIGHTS, "hard links"], before, tree_state(tmp_path))


def test_a_sidecar_that_is_a_link_is_not_trusted(tmp_path, capsys):
    drafter = converted(tmp_path)
    os.replace(drafter / SIDECAR, tmp_path / "real-sidecar.json")
    os.symlink(tmp_path / "real-sidecar.json", drafter / SIDECAR)
    before = tree_state(tmp_path)
    for argv in (["--restore"], []):
        code, out, err = run_cli(capsys, *argv, "--", str(drafter))
        assert_clean_failure(code, 6, out, err, [SIDECAR, "symbolic link"], before, tree_state(tmp_path))


@pytest.mark.parametrize("planted", [".config.json.tmp-fix", ".model.safetensors.tmp-fix",
                                     "." + SIDECAR + ".tmp-fix"])
def test_a_link_planted_at_a_temporary_name_is_never_written_through(tmp_path, capsys, planted):
    drafter = make_speculators_drafter(tmp_path / "d")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, drafter / planted)
    code, out, err = run_cli(capsys, "--rename", "layers.0.=model.midlayer.", "--", str(drafter))
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    code, out, err = run_cli(capsys, "--restore", "--", str(drafter))
    assert code == 0, err
    assert victim.read_text() == "precious\n"


def test_a_last_good_record_that_is_a_fifo_is_never_opened(tmp_path):
    from deploy.remote.fixer import store

    os.mkfifo(tmp_path / "last-good.json")
    (tmp_path / "drafters").mkdir()
    started = time.monotonic()
    result = store.prune_drafters(str(tmp_path / "drafters"), 1, str(tmp_path / "last-good.json"))
    assert time.monotonic() - started < 5 and result["protected"] is None


def test_a_sealed_sidecar_round_trips_and_an_old_unsealed_one_still_restores(tmp_path, capsys):
    drafter = converted(tmp_path)
    side = load_side(drafter)
    assert side["version"] == 2 and side["content_sha256"] == sidecar_mod.content_digest(side)
    side.pop("content_sha256")
    side["version"] = 1                                  # as deployctl wrote it before the seal
    save_side(drafter, side, reseal=False)
    code, out, err = run_cli(capsys, "--restore", "--", str(drafter))
    assert code == 0, err
    assert not (drafter / SIDECAR).exists()
