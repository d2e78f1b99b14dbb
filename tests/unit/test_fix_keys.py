"""The key fixer on real safetensors files: in place, idempotent, config, backup and restore, CLI."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from deploy.remote import fixer as fix
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import (
    contents,
    data_region_sha256,
    header_json,
    load_all,
    make_sglang_drafter,
    make_speculators_drafter,
    snapshot,
)

FIXER = fixer_zipapp()
PACKAGE = Path(fix.__file__).parent


def renamed(name: str) -> str:
    return "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name


def run_cli(*argv: str):
    out, err = io.StringIO(), io.StringIO()
    code = fix.main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------------------------ in place

def test_single_file_is_renamed_in_place_and_loads_byte_identical(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    weights = drafter / "model.safetensors"
    before = load_all(drafter)
    st = weights.stat()
    data_sha = data_region_sha256(weights)
    order = list(header_json(weights))

    summary = fix.convert(drafter)

    assert summary["status"] == "converted" and summary["exit_code"] == 0
    assert summary["files"] == [{"file": "model.safetensors", "mode": "in_place", "renamed": 10}]
    assert len(summary["renames"]) == 10
    after = load_all(drafter)
    assert after == {renamed(k): v for k, v in before.items()}
    assert not any(k.startswith("layers.") for k in after)
    st2 = weights.stat()
    assert (st2.st_ino, st2.st_size) == (st.st_ino, st.st_size)
    assert data_region_sha256(weights) == data_sha
    # key order and __metadata__ kept
    assert list(header_json(weights)) == [renamed(k) for k in order]
    assert header_json(weights)["__metadata__"] == {"format": "pt"}
    assert summary["verification"]["ok"] is True
    assert "layers.0.hidden_norm.weight -> midlayer.hidden_norm.weight" in summary["log"]


def test_safe_open_reads_every_tensor_under_its_new_name(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    before = load_all(drafter)
    fix.convert(drafter)
    with safe_open(str(drafter / "model.safetensors"), "numpy") as handle:
        keys = set(handle.keys())
        assert keys == {renamed(k) for k in before}
        for old, (dtype, shape, data) in before.items():
            array = handle.get_tensor(renamed(old))
            assert (str(array.dtype), tuple(array.shape), array.tobytes()) == (dtype, shape, data)


def test_second_run_is_a_no_op_same_bytes_same_mtime(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter)
    snap = snapshot(drafter)

    summary = fix.convert(drafter)

    assert summary["status"] == "already_converted"
    assert summary["files"][0]["mode"] == "unchanged" and summary["renames"] == []
    assert snapshot(drafter) == snap
    assert summary["exit_code"] == 0


def test_sharded_checkpoint_updates_every_shard_and_the_index(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", sharded=True)
    shards = sorted(drafter.glob("*.safetensors"))
    assert len(shards) == 2
    before = load_all(drafter)
    inodes = {p.name: (p.stat().st_ino, p.stat().st_size, data_region_sha256(p)) for p in shards}

    summary = fix.convert(drafter)

    assert {f["mode"] for f in summary["files"]} == {"in_place"}
    assert sum(f["renamed"] for f in summary["files"]) == 10
    assert load_all(drafter) == {renamed(k): v for k, v in before.items()}
    for p in shards:
        assert (p.stat().st_ino, p.stat().st_size, data_region_sha256(p)) == inodes[p.name]
    index = json.loads((drafter / "model.safetensors.index.json").read_text())
    for shard in shards:
        for name in header_json(shard):
            if name != "__metadata__":
                assert index["weight_map"][name] == shard.name
    assert len(index["weight_map"]) == len(before)
    assert index["metadata"]["total_size"] > 0
    assert fix.convert(drafter)["status"] == "already_converted"


def test_shorter_header_is_padded_with_spaces_in_place(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter, renames=["layers.0.=model.midlayer."])     # longer: rewritten
    weights = drafter / "model.safetensors"
    size = weights.stat().st_size
    raw = weights.read_bytes()
    n = int.from_bytes(raw[:8], "little")

    # model.midlayer.X and midlayer.X load into the same parameter (SGLang prefixes "model.")
    summary = fix.convert(drafter, renames=["model.midlayer.=midlayer."])

    assert summary["files"][0]["mode"] == "in_place" and summary["exit_code"] == 0
    new = weights.read_bytes()
    assert len(new) == size and new[:8] == raw[:8]
    assert new[8:8 + n].endswith(b" " * (10 * len("model.midlayer.") - 10 * len("midlayer.")))
    assert "midlayer.hidden_norm.weight" in load_all(drafter)


def test_longer_header_falls_back_to_a_new_file_atomically(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    weights = drafter / "model.safetensors"
    before = load_all(drafter)
    data_sha = data_region_sha256(weights)
    ino = weights.stat().st_ino

    summary = fix.convert(drafter, renames=["layers.0.=model.midlayer."])

    assert summary["files"][0]["mode"] == "rewritten" and summary["exit_code"] == 0
    assert weights.stat().st_ino != ino
    assert data_region_sha256(weights) == data_sha
    n = int.from_bytes(weights.read_bytes()[:8], "little")
    assert (8 + n) % 8 == 0                     # data stays 8-byte aligned
    after = load_all(drafter)
    assert after == {("model.midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
                     for k, v in before.items()}
    assert not [p for p in drafter.iterdir() if p.name.endswith(".tmp-fix")]


def test_multi_layer_drafter_keeps_layer_names_and_maps_later_input_norms(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", layers=2)
    before = load_all(drafter)

    summary = fix.convert(drafter, generation="modern")

    assert summary["renames"] == [["layers.1.input_layernorm.weight", "layers.1.hidden_norm.weight"]]
    assert summary["layers"] == 2 and summary["legacy_servable"] is False
    after = load_all(drafter)
    assert after["layers.1.hidden_norm.weight"] == before["layers.1.input_layernorm.weight"]
    assert after["layers.0.input_layernorm.weight"] == before["layers.0.input_layernorm.weight"]
    assert "midlayer.hidden_norm.weight" not in after
    assert summary["verification"]["ok"] is True and summary["exit_code"] == 0
    assert any("cannot serve" in line for line in summary["log"])


def test_multi_layer_drafter_fails_verification_for_legacy_sglang(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", layers=2)
    before = contents(drafter)
    code, out, err = run_cli(str(drafter), "--sglang-generation", "legacy")
    assert code == 8
    assert "EAGLE3 currently only supports 1 layer" in err
    assert "nothing written" in out    # verified before the first write: the drafter is as it was
    assert contents(drafter) == before
    assert fix.convert(drafter, generation="modern")["exit_code"] == 0
    assert fix.verify(drafter, "modern")["ok"] is True


def test_sglang_format_drafter_is_left_alone(tmp_path):
    drafter = make_sglang_drafter(tmp_path / "d")
    snap = snapshot(drafter)
    summary = fix.convert(drafter, hidden_states_from="vllm")
    assert summary["status"] == "already_converted"
    assert summary["config"] == {"converted": False, "kind": "sglang", "aux_layer_ids": [2, 30, 58],
                                 "ids_mode": "vllm"}
    assert any("not applied" in line for line in summary["log"])
    assert snapshot(drafter) == snap
    assert not (drafter / ".deployctl-fix-backup.json").exists()
    assert summary["verification"]["ok"] is True


def test_single_file_path_argument(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    summary = fix.convert(drafter / "model.safetensors")
    assert summary["status"] == "converted"
    assert json.loads((drafter / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]


def test_single_odd_name_in_directory_is_used(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    os.rename(drafter / "model.safetensors", drafter / "drafter.safetensors")
    assert fix.convert(drafter)["files"][0]["file"] == "drafter.safetensors"


# ------------------------------------------------------------------------------------- config

def test_speculators_config_becomes_the_flat_sglang_config(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    original = json.loads((drafter / "config.json").read_text())
    summary = fix.convert(drafter)
    config = json.loads((drafter / "config.json").read_text())

    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama"
    for key, value in original["transformer_layer_config"].items():
        if key not in ("architectures", "model_type"):
            assert config[key] == value, key
    assert config["draft_vocab_size"] == 128
    assert "target_hidden_size" not in config          # null in the original: SGLang uses hasattr
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 30, 58],
                                      "use_aux_hidden_state": True}
    for gone in ("transformer_layer_config", "speculators_model_type",
                 "eagle_aux_hidden_state_layer_ids"):
        assert gone not in config
    assert summary["config"] == {"converted": True, "kind": "speculators",
                                 "aux_layer_ids": [2, 30, 58], "ids_mode": "keep"}
    assert ("config.json: eagle_aux_hidden_state_layer_ids [2, 30, 58] kept as-is "
            "(--hidden-states-from keep)") in summary["log"]


def test_target_hidden_size_is_copied_when_set(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    config = json.loads((drafter / "config.json").read_text())
    config["target_hidden_size"] = 64
    (drafter / "config.json").write_text(json.dumps(config))
    fix.convert(drafter)
    assert json.loads((drafter / "config.json").read_text())["target_hidden_size"] == 64


@pytest.mark.parametrize("mode, ids", [("keep", [2, 30, 58]), ("vllm", [1, 29, 57]),
                                       ("sglang", [2, 30, 58])])
def test_aux_layer_ids_follow_the_engine_that_extracted_hidden_states(tmp_path, mode, ids):
    drafter = make_speculators_drafter(tmp_path / "d")
    summary = fix.convert(drafter, hidden_states_from=mode)
    config = json.loads((drafter / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    assert summary["config"]["aux_layer_ids"] == ids and summary["config"]["ids_mode"] == mode
    assert any("--hidden-states-from %s" % mode in line for line in summary["log"])


def test_vllm_ids_that_would_go_negative_are_refused_and_nothing_is_written(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", aux_ids=(0, 30, 58))
    snap = snapshot(drafter)
    with pytest.raises(fix.FixError) as caught:
        fix.convert(drafter, hidden_states_from="vllm")
    assert caught.value.code == 6
    assert "config.json" in caught.value.message and "-1" in caught.value.message
    assert snapshot(drafter) == snap


def test_absent_ids_leave_sglang_its_default(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", aux_ids=None)
    summary = fix.convert(drafter)
    config = json.loads((drafter / "config.json").read_text())
    assert config["eagle_config"] == {"use_aux_hidden_state": True}
    assert summary["config"]["aux_layer_ids"] is None
    assert any("default [2, N//2, N-3]" in line for line in summary["log"])
    assert summary["verification"]["ok"] is True


def test_config_write_is_atomic_and_keeps_mode(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    os.chmod(drafter / "config.json", 0o640)
    fix.convert(drafter)
    assert (drafter / "config.json").stat().st_mode & 0o777 == 0o640
    assert not [p for p in drafter.iterdir() if p.name.endswith(".tmp-fix")]


# ------------------------------------------------------------------------- backup and restore

def test_restore_puts_back_every_original_byte(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d", sharded=True)
    original = contents(drafter)
    fix.convert(drafter, hidden_states_from="vllm")
    assert contents(drafter) != original
    sidecar = json.loads((drafter / ".deployctl-fix-backup.json").read_text())
    assert set(sidecar["files"]) == {p.name for p in drafter.glob("*.safetensors")}
    for entry in sidecar["files"].values():
        assert entry["original"]["size"] > 0 and len(entry["original"]["sha256"]) == 64
    assert "config" in sidecar and "index" in sidecar

    summary = fix.restore(drafter)

    assert summary["status"] == "restored"
    assert contents(drafter) == original           # sidecar removed too
    assert fix.convert(drafter, dry_run=True)["status"] == "needs_conversion"


def test_restore_of_a_rewritten_file(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    original = contents(drafter)
    fix.convert(drafter, renames=["layers.0.=model.midlayer."])
    assert fix.restore(drafter)["files"][0]["mode"] == "rewritten"
    assert contents(drafter) == original


def test_backup_keeps_the_original_across_later_conversions(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    original = contents(drafter)
    first = (drafter / "model.safetensors").read_bytes()[:4096]
    fix.convert(drafter)
    fix.convert(drafter, renames=["midlayer.=model.midlayer."])      # a second change on top
    sidecar = json.loads((drafter / ".deployctl-fix-backup.json").read_text())
    import base64
    raw = base64.b64decode(sidecar["files"]["model.safetensors"]["original"]["b64"])
    assert first.startswith(raw)
    fix.restore(drafter)
    assert contents(drafter) == original


def test_full_backup_copies_each_changed_file(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    original = contents(drafter)
    summary = fix.convert(drafter, full_backup=True)
    assert summary["status"] == "converted"
    now = contents(drafter)
    assert now["model.safetensors.orig"] == original["model.safetensors"]
    assert now["config.json.orig"] == original["config.json"]
    fix.restore(drafter)
    restored = contents(drafter)
    assert {k: v for k, v in restored.items() if not k.endswith(".orig")} == original


def test_restore_without_backup_is_a_clear_error(tmp_path):
    drafter = make_sglang_drafter(tmp_path / "d")
    code, out, err = run_cli(str(drafter), "--restore")
    assert code == 6 and "nothing to restore" in err and str(drafter) in err


def test_restore_refuses_a_file_replaced_since_conversion(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter)
    make_speculators_drafter(tmp_path / "d", seed=7, hidden=32, vocab=128, draft_vocab=64)
    snap = snapshot(drafter)
    with pytest.raises(fix.FixError) as caught:
        fix.restore(drafter)
    assert caught.value.code == 6 and "model.safetensors changed" in caught.value.message
    assert snapshot(drafter) == snap


def test_reconverting_a_replaced_file_records_its_new_original(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter)
    # a new training output with other shapes: its header is a new original
    make_speculators_drafter(tmp_path / "d", seed=7, hidden=32, vocab=128, draft_vocab=64)
    fresh = contents(drafter)
    del fresh[".deployctl-fix-backup.json"]
    summary = fix.convert(drafter)
    assert any("backup entry for model.safetensors replaced" in line for line in summary["log"])
    fix.restore(drafter)
    assert contents(drafter) == fresh


# --------------------------------------------------------------------------- --check and CLI

def test_check_writes_nothing_and_exits_1(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    snap = snapshot(drafter)
    code, out, err = run_cli(str(drafter), "--check", "--json", "--sglang-generation", "legacy")
    assert code == 1
    summary = json.loads(out)
    assert summary["status"] == "needs_conversion" and summary["dry_run"] is True
    assert summary["files"][0]["mode"] == "in_place" and len(summary["renames"]) == 10
    assert summary["verification"]["ok"] is False
    assert "layers.0.hidden_norm.weight" in summary["verification"]["dropped"]
    assert summary["verification_after_conversion"]["ok"] is True
    assert snapshot(drafter) == snap


def _no_sglang(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))


def test_without_sglang_the_local_default_is_0_5_12_and_a_2_layer_drafter_converts(tmp_path, monkeypatch, capsys):
    """Issue 28: the default was 0.5.6-0.5.11 (legacy), so a 2-layer drafter was refused with exit 8."""
    _no_sglang(monkeypatch)
    drafter = make_speculators_drafter(tmp_path / "d", layers=2)
    code, out, err = run_cli(str(drafter))
    assert code == 0, err
    assert "verifying for SGLang 0.5.12+ (modern): no sglang is importable" in out
    assert "verification for SGLang 0.5.12+ (modern): ok" in out
    assert fix.main(["--help"]) == 0
    assert "here: SGLang 0.5.12+ (modern)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("version, generation", [("0.5.9", "legacy"), ("0.5.14", "modern"), ("0.4.0", "modern")])
def test_an_importable_sglang_sets_the_default_from_its_metadata_without_importing_it(tmp_path, monkeypatch, version,
                                                                                      generation):
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    # importing this package would fail the test: the fixer must read the metadata only
    (site / "sglang" / "__init__.py").write_text("raise RuntimeError('sglang was imported')\n")
    (site / f"sglang-{version}.dist-info").mkdir()
    (site / f"sglang-{version}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(site))
    drafter = make_speculators_drafter(tmp_path / "d")
    code, out, err = run_cli(str(drafter), "--check", "--json")
    summary = json.loads(out)
    assert summary["verification"]["generation"] == generation
    assert version in summary["target"] and ("not one the fixer knows" in summary["target"]) is (version == "0.4.0")


def test_check_on_a_converted_drafter_exits_0(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    fix.convert(drafter)
    code, out, _ = run_cli(str(drafter), "--check")
    assert code == 0 and "already converted" in out


def test_json_is_one_document_with_the_documented_fields(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    code, out, err = run_cli(str(drafter), "--json")
    assert code == 0 and err == ""
    summary = json.loads(out)          # exactly one document
    for key in ("status", "path", "files", "renames", "config", "verification", "fingerprint", "log"):
        assert key in summary
    assert summary["renames"][0] == ["layers.0.hidden_norm.weight", "midlayer.hidden_norm.weight"]
    assert set(summary["verification"]) >= {"generation", "ok", "dropped", "missing", "problems"}
    assert summary["path"] == str(drafter)


def test_human_output_lists_the_renames_like_the_seed(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    code, out, _ = run_cli(str(drafter))
    assert code == 0
    assert "layers.0.hidden_norm.weight -> midlayer.hidden_norm.weight\n" in out
    assert "layers.0.mlp.down_proj.weight -> midlayer.mlp.down_proj.weight\n" in out


def test_json_error_document_and_exit_code(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_text("hello, I am not a checkpoint\n")
    code, out, err = run_cli(str(bad), "--json")
    assert code == 6
    document = json.loads(out)
    assert document["status"] == "error" and document["code"] == 6
    assert "model.safetensors" in document["error"]
    assert err.startswith("error: ")


@pytest.mark.parametrize("argv, needle", [
    (["--rename", "layers.0."], "OLD=NEW"),
    (["--rename", "a.=a.b."], "every run"),
    (["--hidden-states-from", "sglang2"], "invalid choice"),
    (["--sglang-version", "0.5.5"], "not supported"),
    (["--sglang-version", "banana"], "expected legacy, modern or a version"),
    (["--sglang-generation", "legacy", "--sglang-version", "0.5.9"], "not allowed with"),
    (["--restore", "--check"], "cannot be combined"),
    (["--bogus"], "unrecognized"),
])
def test_usage_errors_exit_2(tmp_path, argv, needle):
    drafter = make_speculators_drafter(tmp_path / "d")
    snap = snapshot(drafter)
    code, out, err = run_cli(*(argv + [str(drafter)]))
    assert code == 2, (out, err)
    assert needle in err
    assert snapshot(drafter) == snap


def test_missing_path_is_a_checkpoint_error(tmp_path):
    code, _, err = run_cli(str(tmp_path / "nope"))
    assert code == 6 and "does not exist" in err


@pytest.mark.parametrize("version, generation", [("0.5.6", "legacy"), ("0.5.9", "legacy"),
                                                 ("0.5.10.post1", "legacy"), ("0.5.11", "legacy"),
                                                 ("0.5.12", "modern"), ("0.5.23", "modern"),
                                                 ("0.6.0rc1", "modern")])
def test_sglang_version_maps_to_a_generation(tmp_path, version, generation):
    drafter = make_sglang_drafter(tmp_path / "d")
    code, out, _ = run_cli(str(drafter), "--json", "--sglang-version", version)
    assert code == 0
    assert json.loads(out)["verification"]["generation"] == generation


# ------------------------------------------------------------------------------- fingerprint

def test_fingerprint_is_stable_and_notices_changes(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    first = fix.fingerprint(drafter)
    assert first == fix.fingerprint(drafter) and len(first) == 64
    int(first, 16)
    summary = fix.convert(drafter)
    assert summary["fingerprint"] == fix.fingerprint(drafter) != first
    assert fix.convert(drafter)["fingerprint"] == summary["fingerprint"]
    os.utime(drafter / "model.safetensors", ns=(1, 1))
    assert fix.fingerprint(drafter) != summary["fingerprint"]


def test_fingerprint_flag_prints_json(tmp_path):
    drafter = make_sglang_drafter(tmp_path / "d")
    code, out, _ = run_cli("--fingerprint", str(drafter))
    assert code == 0
    assert json.loads(out) == {"status": "fingerprint", "path": str(drafter),
                               "fingerprint": fix.fingerprint(drafter), "exit_code": 0}


# ----------------------------------------------------------------- standalone on the GPU host

@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py")))
def test_fixer_is_python38_standard_library_only(module):
    source = (PACKAGE / module).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = set()
    siblings = {p.stem for p in PACKAGE.glob("*.py")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:       # within the package only (it is "fixer" inside the zipapp)
                assert node.level == 1 and (node.module or "").split(".")[0] in siblings, node.module
            else:
                imported.add(node.module.split(".")[0])
        assert not isinstance(node, ast.NamedExpr), "walrus operator is 3.8+ but banned here"
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("removeprefix", "removesuffix", "is_relative_to",
                                     "BooleanOptionalAction", "cache"), node.attr
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            assert node.value.id not in ("list", "dict", "tuple", "set", "type"), (
                "builtin generic %s[...] needs 3.9" % node.value.id)
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert "deploy" not in imported
    assert "from __future__ import annotations" in source
    assert "=}" not in source          # no f-string = specifier


def test_fixer_runs_as_a_standalone_zipapp(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    script = tmp_path / "host" / "fixer.pyz"     # as uploaded: one file, no deploy package beside it
    script.parent.mkdir()
    script.write_bytes(FIXER.read_bytes())
    result = subprocess.run([sys.executable, "-I", "-S", str(script), "--json", str(drafter)],
                            capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "converted"
    help_result = subprocess.run([sys.executable, "-I", str(script), "--help"],
                                 capture_output=True, text=True, timeout=60)
    assert help_result.returncode == 0 and "--hidden-states-from" in help_result.stdout


def test_metadata_and_unusual_header_formatting_survive(tmp_path):
    drafter = make_speculators_drafter(tmp_path / "d")
    path = drafter / "model.safetensors"
    tensors = {}
    with safe_open(str(path), "np") as handle:
        for key in handle.keys():
            tensors[key] = handle.get_tensor(key)
    save_file(tensors, str(path), metadata={"format": "pt", "note": "h\u00e9llo \"q\""})
    # re-write the header pretty-printed (another tool's style): longer N, same data
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    pretty = json.dumps(json.loads(raw[8:8 + n]), indent=4).encode()
    pretty += b" " * ((-len(pretty)) % 8)
    path.write_bytes(len(pretty).to_bytes(8, "little") + pretty + raw[8 + n:])
    order = list(json.loads(pretty))
    summary = fix.convert(drafter)
    assert summary["files"][0]["mode"] == "in_place" and summary["exit_code"] == 0
    assert path.stat().st_size == len(pretty) + 8 + len(raw) - 8 - n
    header = header_json(path)
    assert header["__metadata__"] == {"format": "pt", "note": "h\u00e9llo \"q\""}
    assert list(header) == [renamed(k) for k in order]
    loaded = load_all(drafter)
    assert loaded["midlayer.hidden_norm.weight"][2] == tensors["layers.0.hidden_norm.weight"].tobytes()


PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3.8")


@pytest.mark.skipif(not PY38.exists(), reason="no Python 3.8 interpreter on this machine")
def test_fixer_under_python38_gives_the_same_bytes(tmp_path):
    host = make_speculators_drafter(tmp_path / "host", sharded=True)
    local = make_speculators_drafter(tmp_path / "local", sharded=True)
    fix.convert(local, hidden_states_from="vllm")
    result = subprocess.run([str(PY38), "-I", str(FIXER), "--json", "--hidden-states-from", "vllm",
                             str(host)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "converted"
    ours, theirs = contents(local), contents(host)
    for name in ours:
        if name != ".deployctl-fix-backup.json":          # holds the directory path
            assert ours[name] == theirs[name], name
    restore = subprocess.run([str(PY38), "-I", str(FIXER), "--restore", str(host)],
                             capture_output=True, text=True, timeout=60)
    assert restore.returncode == 0, restore.stderr


def test_symlinked_weights_outside_the_directory_are_never_written_through(tmp_path):
    """The Hugging Face cache layout: snapshots/REV/model.safetensors -> ../../blobs/SHA, a blob other
    snapshots share. The link is replaced by a converted copy; --restore puts the link back."""
    drafter = make_speculators_drafter(tmp_path / "d")
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    os.rename(drafter / "model.safetensors", blobs / "abc123")
    link_text = os.path.relpath(blobs / "abc123", drafter)
    os.symlink(link_text, drafter / "model.safetensors")
    original = (blobs / "abc123").read_bytes()
    summary = fix.convert(drafter)
    assert not (drafter / "model.safetensors").is_symlink()
    assert (blobs / "abc123").read_bytes() == original          # the shared blob is untouched
    assert summary["files"][0]["mode"] == "copied"
    assert any("outside the checkpoint directory" in line for line in summary["log"])
    assert "midlayer.hidden_norm.weight" in load_all(drafter)
    assert fix.convert(drafter)["status"] == "already_converted"
    fix.restore(drafter)
    assert (drafter / "model.safetensors").is_symlink()
    assert os.readlink(drafter / "model.safetensors") == link_text
    assert (blobs / "abc123").read_bytes() == original
