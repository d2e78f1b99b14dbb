"""Issue: the key fix on the host. Helpers shipped by SFTP to the persistent state dir, sha256
checked, re-uploaded after a VM crash wiped the directory; the drafter converted on the host."""

from __future__ import annotations

import hashlib
import json

import pytest

from deploy.errors import ExitCode
from deploy.facts.helpers import helper_payloads
from tests.integration.helpers import cli_json, write_config

pytestmark = pytest.mark.sandbox

BOOK = "name: fix\nsteps:\n  - step: ensure-helper\n  - step: fix-keys\n"


def run_fix(sandbox, tmp_path, capsys, book=BOOK, **run):
    (tmp_path / "fix.yaml").write_text(book)
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"], **run})
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", str(tmp_path / "fix.yaml"))
    return code, {s["step"]: s for s in doc["hosts"][0]["steps"]}


def remote_sha(sandbox, path: str) -> str:
    return sandbox.run("sb1", f"sha256sum {path}").stdout.split()[0]


def test_upload_hash_check_reupload_after_wipe_and_convert(clean_sandbox, tmp_path, capsys):
    state = clean_sandbox.host("sb1").state_dir
    code, steps = run_fix(clean_sandbox, tmp_path, capsys)
    assert code == 0, json.dumps(steps, indent=1)
    assert sorted(steps["ensure-helper"]["data"]["uploaded"]) == ["fixer.pyz", "host_ops.py"]
    local = hashlib.sha256(helper_payloads()["fixer.pyz"]).hexdigest()
    assert remote_sha(clean_sandbox, f"{state}/helpers/fixer.pyz") == local
    assert not str(state).startswith("/tmp")
    fix = steps["fix-keys"]["data"]
    assert fix["status"] == "converted" and fix["verification"]["ok"] is True
    assert fix["sglang_version"] == "0.5.11"  # read from the host's installed SGLang
    def keys_of(directory: str) -> list[str]:
        header = clean_sandbox.run("sb1", f"cd {directory} && python3 -c \"import json,struct;f=open('model.safetensors','rb');"
                                   "n=struct.unpack('<Q',f.read(8))[0];print(json.dumps(sorted(json.loads(f.read(n)))))\"")
        return json.loads(header.stdout)

    # converted in the drafter store; the user's checkpoint is left exactly as it was
    keys = keys_of(fix["store"])
    assert any(k.startswith("midlayer.") for k in keys) and not any(k.startswith("layers.0.") for k in keys)
    assert fix["store"].startswith("~/.deployctl/drafters/")
    original = keys_of("drafters/kimi-k25-eagle3")
    assert any(k.startswith("layers.0.") for k in original) and not any(k.startswith("midlayer.") for k in original)
    assert ".deployctl-fix-backup.json" not in clean_sandbox.run("sb1", "ls -A drafters/kimi-k25-eagle3").stdout

    # Present and unchanged: nothing uploaded, and the fix is a no-op.
    code, steps = run_fix(clean_sandbox, tmp_path, capsys)
    assert code == 0 and steps["ensure-helper"]["data"]["uploaded"] == []
    assert steps["fix-keys"]["data"]["status"] == "already_converted"

    # The VM crashed and the state directory is gone: one upload, nothing more.
    clean_sandbox.run("sb1", f"rm -rf {state}")
    code, steps = run_fix(clean_sandbox, tmp_path, capsys)
    assert code == 0 and sorted(steps["ensure-helper"]["data"]["uploaded"]) == ["fixer.pyz", "host_ops.py"]

    # A changed helper on the host (an old version, or tampering) is replaced.
    clean_sandbox.run("sb1", f"echo '# edited' >> {state}/helpers/host_ops.py")
    code, steps = run_fix(clean_sandbox, tmp_path, capsys)
    assert code == 0 and steps["ensure-helper"]["data"]["uploaded"] == ["host_ops.py"]


def test_modern_sglang_version_is_passed_to_the_verifier(clean_sandbox, tmp_path, capsys):
    clean_sandbox.set_sglang_version("sb1", "0.5.12")
    code, steps = run_fix(clean_sandbox, tmp_path, capsys)
    assert code == 0, json.dumps(steps, indent=1)
    assert steps["fix-keys"]["data"]["sglang_version"] == "0.5.12"
    assert steps["fix-keys"]["data"]["verification"]["generation"] == "modern"


def test_broken_drafter_on_host_fails_with_checkpoint_exit_code(clean_sandbox, tmp_path, capsys):
    drafter = clean_sandbox.host("sb1").drafter_dir
    clean_sandbox.run("sb1", f"truncate -s 100 {drafter}/model.safetensors")
    code, steps = run_fix(clean_sandbox, tmp_path, capsys)
    assert code == ExitCode.CHECKPOINT
    assert "model.safetensors" in steps["fix-keys"]["detail"]


def test_missing_drafter_path_names_it(clean_sandbox, tmp_path, capsys):
    code, steps = run_fix(clean_sandbox, tmp_path, capsys, drafter="~/drafters/does-not-exist")
    assert code == ExitCode.CHECKPOINT
    assert "does-not-exist" in steps["fix-keys"]["detail"]
