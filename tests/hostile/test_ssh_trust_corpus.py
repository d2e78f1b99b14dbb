"""Hostile known_hosts and key files: OpenSSH's markers handled as OpenSSH does, bad files a clean
exit 4 naming the file, key files readable by others refused with the chmod that fixes them, and
no file changed (except accept-new recording a key, which must say so).

No sshd needed: the files are parsed by deploy.ssh.trust, and the CLI cases fail before connecting.
The real-sshd cases are in tests/integration/test_ssh_trust.py.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import paramiko
import pytest
import yaml

from deploy.ssh import trust as ssh_trust
from deploy.cli.main import main
from deploy.base.errors import ConnectionFailed, ExitCode, HostKeyRejected
from tests.hostile.tree import assert_clean_failure, tree_state

HOST = "gpu-a.example"
PORT_HOST = "[10.1.2.3]:2222"


@pytest.fixture(scope="module")
def keys():
    return [paramiko.ECDSAKey.generate() for _ in range(3)]


def line(names: str, key, marker: str = "") -> str:
    return (marker + " " if marker else "") + f"{names} {key.get_name()} {key.get_base64()}\n"


def hashed(name: str) -> str:
    return paramiko.HostKeys.hash_host(name)


def load(tmp_path: Path, text: str | bytes) -> ssh_trust.KnownHosts:
    path = tmp_path / "known_hosts"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return ssh_trust.load_known_hosts(path)


def found(known: ssh_trust.KnownHosts, name: str, key) -> bool:
    entry = known.host_keys.lookup(name)
    return entry is not None and entry.get(key.get_name()) == key


# (id, known_hosts text builder(keys), host, key index the host presents, accepted, revoked)
CASES = [
    ("plain", lambda k: line(HOST, k[0]), HOST, 0, True, False),
    ("ca-other-domain-first", lambda k: line("*.other.example", k[1], "@cert-authority") + line(HOST, k[0]), HOST, 0, True, False),
    ("ca-for-this-host", lambda k: line(HOST, k[1], "@cert-authority") + line(HOST, k[0]), HOST, 0, True, False),
    ("ca-only", lambda k: line(HOST, k[0], "@cert-authority"), HOST, 0, False, False),
    ("revoked-same-key-as-plain", lambda k: line(HOST, k[0]) + line(HOST, k[0], "@revoked"), HOST, 0, False, True),
    ("revoked-before-plain", lambda k: line(HOST, k[0], "@revoked") + line(HOST, k[0]), HOST, 0, False, True),
    ("revoked-wildcard", lambda k: line("*", k[0], "@revoked") + line(HOST, k[0]), HOST, 0, False, True),
    ("revoked-hashed", lambda k: line(hashed(HOST), k[0], "@revoked") + line(HOST, k[0]), HOST, 0, False, True),
    ("revoked-other-host", lambda k: line("other.example", k[0], "@revoked") + line(HOST, k[0]), HOST, 0, True, False),
    ("revoked-negated", lambda k: line(f"!{HOST},*", k[0], "@revoked") + line(HOST, k[0]), HOST, 0, True, False),
    ("revoked-other-key", lambda k: line(HOST, k[1], "@revoked") + line(HOST, k[0]), HOST, 0, True, False),
    ("unknown-marker", lambda k: line(HOST, k[0], "@bogus") + line(HOST, k[1]), HOST, 1, True, False),
    ("marker-only", lambda k: "@revoked\n" + line(HOST, k[0]), HOST, 0, True, False),
    ("malformed-base64", lambda k: f"{HOST} ecdsa-sha2-nistp256 !!!notbase64\n" + line(HOST, k[0]), HOST, 0, True, False),
    ("truncated-key", lambda k: f"{HOST} ecdsa-sha2-nistp256 {k[1].get_base64()[:20]}\n" + line(HOST, k[0]), HOST, 0, True, False),
    ("two-fields", lambda k: f"{HOST} ecdsa-sha2-nistp256\n" + line(HOST, k[0]), HOST, 0, True, False),
    ("unknown-key-type", lambda k: f"{HOST} ssh-future AAAAB3NzaC1yc2E=\n" + line(HOST, k[0]), HOST, 0, True, False),
    ("hashed-plain", lambda k: line(hashed(HOST), k[0]), HOST, 0, True, False),
    ("port-form", lambda k: line(PORT_HOST, k[0]), PORT_HOST, 0, True, False),
    ("crlf", lambda k: line(HOST, k[0]).replace("\n", "\r\n"), HOST, 0, True, False),
    ("comments-and-blank", lambda k: "# c\n\n   \n" + line(HOST, k[0]) + "# end", HOST, 0, True, False),
    ("tabs", lambda k: line(HOST, k[0]).replace(" ", "\t"), HOST, 0, True, False),
    ("garbage-then-good", lambda k: "\x00\xff garbage\n" + line(HOST, k[0]), HOST, 0, True, False),
]


@pytest.mark.parametrize("name,build,host,presented,accepted,revoked", CASES, ids=[c[0] for c in CASES])
def test_known_hosts_like_openssh(tmp_path, keys, name, build, host, presented, accepted, revoked):
    known = load(tmp_path, build(keys))
    key = keys[presented]
    assert found(known, host, key) is accepted
    assert known.revoked_for(host, key) is revoked
    before = tree_state(tmp_path)
    reject, accept_new = ssh_trust.make_policies(known, tmp_path / "known_hosts", "gpu-a")
    if not accepted:
        # what paramiko does for a key it does not find: ask the policy, which must refuse it
        for policy in (reject(), accept_new()) if revoked else (reject(),):
            with pytest.raises(HostKeyRejected) as err:
                policy.missing_host_key(paramiko.SSHClient(), host, key)
            assert err.value.exit_code == ExitCode.CONNECTION
            assert ("@revoked" in str(err.value)) is revoked
        assert tree_state(tmp_path) == before


def test_binary_known_hosts_is_an_empty_trust_store(tmp_path, keys):
    known = load(tmp_path, bytes(range(256)) * 64)
    assert known.host_keys.lookup(HOST) is None


@pytest.mark.parametrize("kind", ["sparse-65mib", "fifo", "directory"])
def test_known_hosts_file_kinds(tmp_path, capsys, kind):
    path = tmp_path / "known_hosts"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as handle:
            handle.truncate(65 << 20)
    config = write_config(tmp_path, known_hosts=str(path))
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "gpu-status"])
    captured = capsys.readouterr()
    assert_clean_failure(code, 4, captured.out, captured.err, ("known_hosts",), before, tree_state(tmp_path))


def test_accept_new_says_what_it_recorded(tmp_path, keys, capsys):
    path = tmp_path / "known_hosts"
    path.write_text(line("other.example", keys[1]))
    known = ssh_trust.load_known_hosts(path)
    _, accept_new = ssh_trust.make_policies(known, path, "gpu-a (deploy@10.1.2.3:22)")
    client = paramiko.SSHClient()
    accept_new().missing_host_key(client, HOST, keys[0])
    err = capsys.readouterr().err
    assert HOST in err and keys[0].fingerprint in err and str(path) in err
    assert path.read_text().endswith(line(HOST, keys[0]))
    assert found(ssh_trust.load_known_hosts(path), HOST, keys[0])


def test_accept_new_never_records_a_revoked_key(tmp_path, keys):
    path = tmp_path / "known_hosts"
    path.write_text(line("*", keys[0], "@revoked"))
    before = tree_state(tmp_path)
    _, accept_new = ssh_trust.make_policies(ssh_trust.load_known_hosts(path), path, "gpu-a")
    with pytest.raises(HostKeyRejected, match="@revoked"):
        accept_new().missing_host_key(paramiko.SSHClient(), HOST, keys[0])
    assert tree_state(tmp_path) == before


def test_a_known_hosts_file_is_parsed_once_per_version(tmp_path, keys, monkeypatch):
    """Issue 37: each host of a run parsed the whole file again (100 hosts, 100 lines: 10,000 key parses).
    Parsed once per version of the file; a key that is replaced (same size, same mtime second) or
    revoked after that is what the next connection sees."""
    path = tmp_path / "known_hosts"
    path.write_text(line(HOST, keys[0]) + line("other.example", keys[1]))
    parses = []
    real = ssh_trust._parse_known_hosts
    monkeypatch.setattr(ssh_trust, "_parse_known_hosts", lambda p: parses.append(p) or real(p))
    for _ in range(5):
        assert found(ssh_trust.load_known_hosts(path), HOST, keys[0])
    assert len(parses) == 1
    stat = path.stat()
    path.write_text(line(HOST, keys[2]) + line("other.example", keys[1]))  # the same length
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    known = ssh_trust.load_known_hosts(path)
    assert found(known, HOST, keys[2]) and not found(known, HOST, keys[0])
    path.write_text(path.read_text() + line(HOST, keys[2], "@revoked"))
    assert not found(ssh_trust.load_known_hosts(path), HOST, keys[2])
    assert len(parses) == 3


def test_what_one_connection_adds_to_its_host_keys_never_reaches_another(tmp_path, keys):
    path = tmp_path / "known_hosts"
    path.write_text(line(HOST, keys[0]))
    first = ssh_trust.load_known_hosts(path)
    first.host_keys.add(HOST, keys[1].get_name(), keys[1])  # paramiko replaces the entry's key in place
    first.host_keys.add("new.example", keys[2].get_name(), keys[2])
    again = ssh_trust.load_known_hosts(path)
    assert found(again, HOST, keys[0]) and not found(again, "new.example", keys[2])


# -- private keys -------------------------------------------------------------------------------
def write_config(tmp_path: Path, *, known_hosts: str | None = None, identity_file: str | None = None) -> Path:
    host = {"name": "gpu-a", "address": "127.0.0.1", "port": 9, "user": "deploy"}
    if identity_file:
        host["identity_file"] = identity_file
    document = {"ssh": {"known_hosts": known_hosts or str(tmp_path / "known_hosts"), "connect_retries": 0,
                        "connect_timeout_s": 2}, "hosts": [host]}
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def private_key(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "id_ecdsa"
    buffer = io.StringIO()
    paramiko.ECDSAKey.generate().write_private_key(buffer)
    path.write_text(buffer.getvalue())
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606, 0o700, 0o777, 0o620])
def test_private_key_readable_by_others_is_refused(tmp_path, capsys, mode):
    key = private_key(tmp_path, mode)
    (tmp_path / "known_hosts").write_text("")
    config = write_config(tmp_path, identity_file=str(key))
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "gpu-status"])
    captured = capsys.readouterr()
    if mode & 0o077 == 0:   # 0700: OpenSSH accepts it; the failure is then the closed port
        assert "UNPROTECTED" not in captured.err
        return
    assert_clean_failure(code, 4, captured.out, captured.err,
                         ("UNPROTECTED PRIVATE KEY FILE", f"{mode:04o}", f"chmod 600 {key}"), before, tree_state(tmp_path))


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_key_modes_openssh_accepts(tmp_path, mode):
    ssh_trust.check_private_key_file(private_key(tmp_path, mode), "gpu-a")


@pytest.mark.parametrize("kind,fragment", [("missing", "does not exist"), ("directory", "not a regular file"),
                                           ("fifo", "not a regular file")])
def test_identity_file_kinds(tmp_path, capsys, kind, fragment):
    path = tmp_path / "id"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    (tmp_path / "known_hosts").write_text("")
    config = write_config(tmp_path, identity_file=str(path))
    before = tree_state(tmp_path)
    code = main(["-c", str(config), "gpu-status"])
    captured = capsys.readouterr()
    assert_clean_failure(code, 4, captured.out, captured.err, ("identity_file", fragment), before, tree_state(tmp_path))


def test_corpus_floor():
    assert len(CASES) + 3 + 8 + 3 >= 10


def test_connection_failed_is_exit_4():
    assert ConnectionFailed("x").exit_code == ExitCode.CONNECTION == 4
