"""SSH trust against real sshd (SIMULATED GPU hosts): OpenSSH's known_hosts markers, key permissions,
accept-new reporting, and the host-side fixer's clean error coming back as a clean deployctl error."""

from __future__ import annotations

import shutil

import pytest

from tests.integration.helpers import cli_json_err, write_config

pytestmark = pytest.mark.sandbox


def sb1_line(sandbox) -> str:
    return next(ln for ln in sandbox.known_hosts.read_text().splitlines() if ln.startswith(f"[{sandbox.host('sb1').address}]:"))


def gpu_status(sandbox, tmp_path, capsys, known_hosts_text: str, *extra, ssh=None, hosts=None):
    kh = tmp_path / "known_hosts"
    kh.write_text(known_hosts_text)
    path = write_config(sandbox, tmp_path, ssh={"known_hosts": str(kh), **(ssh or {})}, hosts=hosts)
    return cli_json_err(capsys, "-c", str(path), *extra, "gpu-status", "--json", "--host", "sb1")


def test_cert_authority_line_for_other_hosts_does_not_disturb(sandbox, tmp_path, capsys):
    _, key_type, key_b64 = sb1_line(sandbox).split()
    text = f"@cert-authority *.corp.example {key_type} {key_b64}\n@bogus-marker x y z\n" + sb1_line(sandbox) + "\n"
    code, doc, err = gpu_status(sandbox, tmp_path, capsys, text)
    assert code == 0, err
    assert doc["hosts"][0]["exit_code"] == 0 and doc["hosts"][0]["ok"]


def test_revoked_host_key_is_refused_as_revoked(sandbox, tmp_path, capsys):
    _, key_type, key_b64 = sb1_line(sandbox).split()
    text = sb1_line(sandbox) + f"\n@revoked * {key_type} {key_b64}\n"
    code, doc, err = gpu_status(sandbox, tmp_path, capsys, text)
    assert code == 4
    assert "@revoked" in doc["hosts"][0]["error"] and doc["hosts"][0]["reachable"] is False


def test_revoked_key_is_not_recorded_by_accept_new(sandbox, tmp_path, capsys):
    _, key_type, key_b64 = sb1_line(sandbox).split()
    kh_text = f"@revoked * {key_type} {key_b64}\n"
    code, doc, err = gpu_status(sandbox, tmp_path, capsys, kh_text, "--accept-new-host-keys")
    assert code == 4 and "@revoked" in doc["hosts"][0]["error"]
    assert (tmp_path / "known_hosts").read_text() == kh_text      # nothing recorded
    assert "recorded new host key" not in err


def test_accept_new_prints_the_host_and_fingerprint(sandbox, tmp_path, capsys):
    code, doc, err = gpu_status(sandbox, tmp_path, capsys, "", "--accept-new-host-keys")
    assert code == 0, err
    assert f"recorded new host key for [{sandbox.host('sb1').address}]:" in err and "SHA256:" in err
    assert (tmp_path / "known_hosts").read_text().split()[1:] == sb1_line(sandbox).split()[1:]


def test_private_key_readable_by_others_is_refused(sandbox, tmp_path, capsys):
    import yaml

    key = tmp_path / "client_key"
    shutil.copy(sandbox.host("sb1").identity_file, key)
    key.chmod(0o644)
    config = yaml.safe_load(sandbox.config_path.read_text())
    hosts = [dict(h, identity_file=str(key)) for h in config["hosts"]]
    code, doc, err = gpu_status(sandbox, tmp_path, capsys, sb1_line(sandbox) + "\n", hosts=hosts)
    assert code == 4
    assert "UNPROTECTED PRIVATE KEY FILE" in doc["hosts"][0]["error"] and f"chmod 600 {key}" in doc["hosts"][0]["error"]


def test_host_side_fixer_error_comes_back_clean(clean_sandbox, tmp_path, capsys):
    """A drafter config.json nested 100k deep: exit 6 with the fixer's message, no traceback text."""
    drafter = clean_sandbox.host("sb1").drafter_dir
    result = clean_sandbox.run("sb1", f"python3 -c \"open('{drafter}/config.json','w').write('['*100000+']'*100000)\"")
    assert result.returncode == 0, result.stderr
    (tmp_path / "fix.yaml").write_text("name: fix\nsteps:\n  - step: ensure-helper\n  - step: fix-keys\n")
    path = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    code, doc, err = cli_json_err(capsys, "-c", str(path), "up", "--json", "--playbook", str(tmp_path / "fix.yaml"))
    assert code == 6, doc
    error = doc["hosts"][0]["error"]
    assert "config.json" in error and "nested" in error and "Traceback" not in error + err
