"""Issue: the key fix on the host. Helpers shipped by SFTP to the persistent state dir, sha256
checked, re-uploaded after a VM crash wiped the directory; the drafter converted on the host."""

from __future__ import annotations

import hashlib
import json

import pytest

from deploy.base.errors import ExitCode
from deploy.facts.helpers import HELPER_FILES, helper_payloads
from deploy.cli.main import main
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
    assert sorted(steps["ensure-helper"]["data"]["uploaded"]) == sorted(HELPER_FILES)
    assert {"fixer.pyz", "host_ops.py"} <= set(HELPER_FILES)
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
    assert code == 0 and sorted(steps["ensure-helper"]["data"]["uploaded"]) == sorted(HELPER_FILES)

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


def _user_checkpoints(sandbox) -> None:
    """The user's own trained checkpoints on the big disk, beside where the store would go."""
    sandbox.run("sb1", "mkdir -p ~/data/drafters && cp -r ~/drafters/kimi-k25-eagle3 ~/data/drafters/kimi-1ep && "
                       "cp -r ~/drafters/kimi-k25-eagle3 ~/data/drafters/kimi-3ep && "
                       "cp -r ~/drafters/kimi-k25-eagle3 ~/drafters/second")


def _hosts_with_state_dir(sandbox, state_dir: str) -> list[dict]:
    import yaml
    from pathlib import Path

    hosts = yaml.safe_load(Path(sandbox.config_path).read_text())["hosts"]
    for host in hosts:
        if host["name"] == "sb1":
            host["state_dir"] = state_dir
    return hosts


def test_issue_17_state_dir_on_the_data_disk_never_loses_a_user_checkpoint(clean_sandbox, tmp_path, capsys):
    """Issue 17: ``state_dir: ~/data`` with the drafters in ``~/data/drafters/``: the first ``up`` pruned
    kimi-1ep and kimi-3ep. Now a run deploying one of them is refused at config load (exit 3), and a run
    deploying drafters from elsewhere prunes only the store entries it created."""
    from tests.hostile.tree import tree_state

    _user_checkpoints(clean_sandbox)
    home = clean_sandbox.host("sb1").home
    users = home / "data" / "drafters"
    before = tree_state(users)
    hosts = _hosts_with_state_dir(clean_sandbox, "~/data")

    path = write_config(clean_sandbox, tmp_path, hosts=hosts,
                        run={"group": None, "hosts": ["sb1"], "drafter": "~/data/drafters/kimi-1ep"})
    code = main(["-c", str(path), "up"])
    captured = capsys.readouterr()
    assert code == ExitCode.CONFIG, captured.err
    assert "~/data/drafters/kimi-1ep" in captured.err and "state_dir ~/data" in captured.err and "sb1" in captured.err
    assert tree_state(users) == before

    book = BOOK.replace("  - step: fix-keys\n", "  - step: fix-keys\n    keep_drafters: 1\n")
    (tmp_path / "fix.yaml").write_text(book)
    stored = []
    for drafter in ("~/drafters/kimi-k25-eagle3", "~/drafters/second"):
        path = write_config(clean_sandbox, tmp_path, hosts=hosts, run={"group": None, "hosts": ["sb1"],
                                                                       "drafter": drafter})
        code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", str(tmp_path / "fix.yaml"))
        steps = {s["step"]: s for s in doc["hosts"][0]["steps"]}
        assert code == 0, json.dumps(steps, indent=1)
        stored.append(steps["fix-keys"]["data"]["store"].rsplit("/", 1)[-1])
    pruned = steps["fix-keys"]["data"]["pruned"]
    assert pruned["removed"] == [stored[0]]                          # the store's own older entry
    assert set(pruned["foreign"]) == {"kimi-1ep", "kimi-3ep"}          # the user's: never touched
    after = tree_state(users)
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(p.name for p in users.iterdir()) == sorted(["kimi-1ep", "kimi-3ep", stored[1]])
