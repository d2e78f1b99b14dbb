"""Issue 12: connect the way the user's OpenSSH does (ssh_config, ProxyJump bastions, ssh-agent).

Over the jump sandbox (SIMULATED GPU hosts, a test double): a bastion ``jump`` on 127.0.0.30 and
two GPU hosts ``jt1``/``jt2`` on .31/.32, real OpenSSH sshd at LogLevel DEBUG. The YAML names the
targets by ssh_config aliases only (``gpu-a``, ``gpu-b``); HostName, User, Port, IdentityFile
and ProxyJump come from the ssh_config each test writes.

On one loopback network a target cannot tell the bastion's forwarded connection from a direct one
by source address (both come from 127.0.0.1), so "it went through the bastion" is proved from the
other side: the bastion's sshd logs one direct-tcpip channel per target, and while a connection
is open the TCP socket to the target's sshd belongs to a process of the bastion's Unix user.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from deploy.config import load_config
from deploy.base.errors import ExitCode, HostKeyRejected
from deploy.ssh.transport import HostConnection, JumpConnections
from tests.integration.helpers import TEST_LAUNCH_ENV, cli_json, cli_json_err

pytestmark = pytest.mark.sandbox

DIRECT_TCPIP = re.compile(r"server_request_direct_tcpip: originator .* target (\S+) port (\d+)")


def ssh_config_text(sb, *, key: Path | None = None, target_key: bool = True, extra: str = "") -> str:
    """The bastion and two aliases behind it; ``key`` replaces the sandbox client key."""
    j, a, b = sb.host("jump"), sb.host("jt1"), sb.host("jt2")
    identity = key or j.identity_file
    target_identity = f"  IdentityFile {identity}\n  IdentitiesOnly yes\n" if target_key else ""
    return f"""{extra}
Host bastion
  HostName {j.address}
  Port {j.port}
  User {j.user}
  IdentityFile {identity}
  IdentitiesOnly yes
  UserKnownHostsFile {sb.known_hosts}
  StrictHostKeyChecking yes

Host gpu-a
  HostName {a.address}
  Port {a.port}
  User {a.user}
{target_identity}
Host gpu-b
  HostName {b.address}
  Port {b.port}
  User {b.user}
{target_identity}
Host gpu-*
  ProxyJump bastion
  UserKnownHostsFile {sb.known_hosts}
  ConnectTimeout 7
"""


def write_configs(sb, tmp_path: Path, ssh_config: str, *, ssh: dict | None = None,
                  host_overrides: dict | None = None, agent_only: bool = False) -> Path:
    """deployctl.yaml with hosts named by alias only (plus what a test overrides)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(ssh_config)
    base = yaml.safe_load(Path(sb.config_path).read_text())
    hosts = []
    for name, alias in (("jt1", "gpu-a"), ("jt2", "gpu-b")):
        h = sb.host(name)
        entry = {"name": name, "address": alias, "gpus": h.gpu_count, "gpu_devices": h.gpu_glob,
                 "groups": ["sandbox"]}
        entry.update((host_overrides or {}).get(name, {}))
        hosts.append(entry)
    doc = {"ssh": {"config_file": str(cfg), "connect_retries": 0, **(ssh or {})},
           "hosts": hosts, "runs": [{**base["runs"][0], "env": {**TEST_LAUNCH_ENV, **(base["runs"][0].get("env") or {})}}]}
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def log_mark(sb, name: str) -> int:
    return sb.sshd_log(name).stat().st_size


def log_since(sb, name: str, mark: int) -> str:
    with open(sb.sshd_log(name), "rb") as f:
        f.seek(mark)
        return f.read().decode(errors="replace")


def marks(sb) -> dict[str, int]:
    return {n: log_mark(sb, n) for n in ("jump", "jt1", "jt2")}


@pytest.fixture
def jump_sb(jump_sandbox):
    jump_sandbox.reset()
    return jump_sandbox


@pytest.fixture
def no_agent(monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def test_gpu_status_through_proxyjump_one_bastion_login_one_channel_per_target(jump_sb, tmp_path, capsys,
                                                                               no_agent):
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb))
    before = marks(jump_sb)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == 0, doc
    assert [h["host"] for h in doc["hosts"]] == ["jt1", "jt2"]
    for entry, name in zip(doc["hosts"], ("jt1", "jt2")):
        assert entry["all_free"] and len(entry["gpus"]) == 2
        target = jump_sb.host(name)
        ssh = entry["ssh"]
        assert ssh["hostname"] == {"value": target.address, "source": "ssh_config"}
        assert ssh["user"] == {"value": target.user, "source": "ssh_config"}
        assert ssh["port"] == {"value": target.port, "source": "ssh_config"}
        assert ssh["connect_timeout_s"] == {"value": 7.0, "source": "ssh_config"}
        [jump] = ssh["jumps"]
        assert jump["alias"] == "bastion" and jump["hostname"]["value"] == jump_sb.host("jump").address
    jump_log = log_since(jump_sb, "jump", before["jump"])
    # ONE login on the bastion serves both targets, one forwarded channel each.
    assert jump_log.count(f"Accepted publickey for {jump_sb.host('jump').user}") == 1, jump_log
    channels = sorted(DIRECT_TCPIP.findall(jump_log))
    assert channels == sorted((jump_sb.host(n).address, str(jump_sb.host(n).port)) for n in ("jt1", "jt2"))
    for name in ("jt1", "jt2"):
        assert log_since(jump_sb, name, before[name]).count(f"Accepted publickey for {jump_sb.host(name).user}") == 1


def _socket_owner_uids(address: str, port: int) -> set[int]:
    """Unix users of the processes holding an established TCP connection to address:port."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", "dst", f"{address}:{port}"],
                         capture_output=True, text=True, timeout=10).stdout
    pids = {int(p) for p in re.findall(r"pid=(\d+)", out)}
    uids = set()
    for pid in pids:
        try:
            uids.add(os.stat(f"/proc/{pid}").st_uid)
        except OSError:
            pass
    return uids


def test_target_connection_is_opened_by_the_bastion_not_by_us(jump_sb, tmp_path, no_agent):
    config = load_config(write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb)))
    target = jump_sb.host("jt1")
    with JumpConnections() as jumps, HostConnection(config.host("jt1"), config.ssh, jumps) as conn:
        assert conn.run("id -un").stdout.strip() == target.user
        owners = _socket_owner_uids(target.address, target.port)
    assert owners == {pwd.getpwnam(jump_sb.host("jump").user).pw_uid}


def test_up_through_proxyjump(jump_sb, tmp_path, capsys, no_agent):
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb))
    before = marks(jump_sb)
    code, doc, err = cli_json_err(capsys, "-c", str(path), "up", "--json")
    assert code == 0, (doc, err)
    assert all(h["ok"] for h in doc["hosts"])
    jump_log = log_since(jump_sb, "jump", before["jump"])
    assert jump_log.count(f"Accepted publickey for {jump_sb.host('jump').user}") == 1
    assert len(DIRECT_TCPIP.findall(jump_log)) == 2
    # the server really runs on the targets (its health endpoint answers there)
    for name in ("jt1", "jt2"):
        res = jump_sb.run(name, "python3 -c \"import urllib.request as u; "
                                f"print(u.urlopen('http://{jump_sb.host(name).address}:30000/health').status)\"")
        assert res.stdout.strip() == "200", res.stderr


def test_plan_shows_effective_values_and_their_sources(jump_sb, tmp_path, capsys):
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb),
                         host_overrides={"jt1": {"user": jump_sb.host("jt1").user, "port": jump_sb.host("jt1").port}})
    code, doc = cli_json(capsys, "-c", str(path), "plan", "--json")
    assert code == 0
    ssh = {h["host"]: h["ssh"] for h in doc["hosts"]}
    assert ssh["jt1"]["user"]["source"] == "yaml" and ssh["jt2"]["user"]["source"] == "ssh_config"
    assert ssh["jt1"]["hostname"]["source"] == "ssh_config"
    assert ssh["jt1"]["host_key_policy"] == {"value": "reject", "source": "default"}
    from deploy.cli.main import main

    assert main(["-c", str(path), "plan"]) == 0
    text = capsys.readouterr().out
    assert "via jump host bastion" in text and f"user={jump_sb.host('jt1').user} [yaml]" in text


def test_yaml_overrides_ssh_config(jump_sb, tmp_path, capsys, no_agent):
    """ssh_config says a wrong port and user for gpu-a; the YAML's values are the ones used."""
    wrong = ssh_config_text(jump_sb).replace(f"Port {jump_sb.host('jt1').port}", "Port 1", 1)
    wrong = wrong.replace(f"User {jump_sb.host('jt1').user}", "User nobody-here")
    path = write_configs(jump_sb, tmp_path, wrong,
                         host_overrides={"jt1": {"user": jump_sb.host("jt1").user, "port": jump_sb.host("jt1").port}})
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt1")
    assert code == 0, doc
    ssh = doc["hosts"][0]["ssh"]
    assert ssh["port"] == {"value": jump_sb.host("jt1").port, "source": "yaml"}
    assert ssh["user"] == {"value": jump_sb.host("jt1").user, "source": "yaml"}


def test_alias_without_proxyjump_resolves_hostname_user_port_identity(jump_sb, tmp_path, capsys, no_agent):
    """A plain alias (no bastion): HostName/User/Port/IdentityFile all come from ssh_config."""
    j = jump_sb.host("jump")
    cfg = (f"Host bastion-direct\n  HostName {j.address}\n  Port {j.port}\n  User {j.user}\n"
           f"  IdentityFile {j.identity_file}\n  IdentitiesOnly yes\n")
    (tmp_path / "ssh_config").write_text(cfg)
    doc = {"ssh": {"config_file": str(tmp_path / "ssh_config"), "known_hosts": str(jump_sb.known_hosts),
                   "connect_retries": 0},
           "hosts": [{"name": "bastion", "address": "bastion-direct", "gpus": j.gpu_count,
                      "gpu_devices": j.gpu_glob}]}
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == 0, out
    ssh = out["hosts"][0]["ssh"]
    assert ssh["identity_files"] == {"value": [str(j.identity_file)], "source": "ssh_config"}
    assert ssh["jumps"] == [] and ssh["user"]["value"] == j.user


def test_unknown_jump_host_key_is_refused_naming_the_jump_host(jump_sb, tmp_path, capsys, no_agent):
    known = tmp_path / "known_hosts"
    jump = jump_sb.host("jump")
    lines = [ln for ln in jump_sb.known_hosts.read_text().splitlines()
             if not ln.startswith(f"[{jump.address}]:")]
    known.write_text("\n".join(lines) + "\n")
    text = ssh_config_text(jump_sb).replace(f"UserKnownHostsFile {jump_sb.known_hosts}",
                                            f"UserKnownHostsFile {known}")
    path = write_configs(jump_sb, tmp_path, text)
    before = marks(jump_sb)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == ExitCode.CONNECTION
    for entry in doc["hosts"]:
        assert entry["exit_code"] == 4
        assert "jump host bastion" in entry["error"] and "not in known_hosts" in entry["error"]
    assert known.read_text() == "\n".join(lines) + "\n"  # nothing recorded
    # the bastion was asked once for the run, and no target was reached
    assert log_since(jump_sb, "jump", before["jump"]).count("Connection from") == 1
    assert "Accepted publickey" not in log_since(jump_sb, "jt1", before["jt1"])


def test_unknown_target_key_behind_the_bastion_is_refused_naming_the_target(jump_sb, tmp_path, no_agent):
    known = tmp_path / "known_hosts"
    a = jump_sb.host("jt1")
    known.write_text("".join(ln + "\n" for ln in jump_sb.known_hosts.read_text().splitlines()
                             if not ln.startswith(f"[{a.address}]:")))
    text = ssh_config_text(jump_sb).replace(f"UserKnownHostsFile {jump_sb.known_hosts}\n  ConnectTimeout",
                                            f"UserKnownHostsFile {known}\n  ConnectTimeout")
    config = load_config(write_configs(jump_sb, tmp_path, text))
    with pytest.raises(HostKeyRejected, match=rf"^jt1 \({re.escape(jump_sb.host('jt1').user)}@{re.escape(jump_sb.host('jt1').address)}:\d+ via bastion\): .*not in known_hosts"):
        HostConnection(config.host("jt1"), config.ssh).connect()


def _keygen(path: Path, passphrase: str = "") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "issue-12-test", "-f", str(path)],
                   check=True, timeout=30)
    return path


@pytest.fixture
def authorized(jump_sb):
    """Authorise extra public keys on every jump-sandbox host for one test, then restore."""
    keys_file = jump_sb.root / "authorized_keys"
    original = keys_file.read_text()

    def add(pub: Path) -> None:
        with open(keys_file, "a") as f:
            f.write(pub.read_text())

    yield add
    keys_file.write_text(original)


@pytest.fixture
def ssh_agent(tmp_path, monkeypatch):
    """A real ssh-agent for this test only, killed by its PID at teardown."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline_polls = 200
        while not sock.exists() and deadline_polls:
            deadline_polls -= 1
            proc.poll()
            assert proc.returncode is None, "ssh-agent exited"
            import time

            time.sleep(0.025)
        assert sock.exists(), "ssh-agent did not create its socket"
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield sock
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)


def test_agent_only_key_works(jump_sb, tmp_path, capsys, authorized, ssh_agent):
    key = _keygen(tmp_path / "agent_only")
    authorized(key.with_name(key.name + ".pub"))
    subprocess.run(["ssh-add", "-q", str(key)], check=True, timeout=30, capture_output=True,
                   env={**os.environ, "SSH_AUTH_SOCK": str(ssh_agent)})
    key.unlink()  # only the agent has it now
    key.with_name(key.name + ".pub").unlink()
    text = ssh_config_text(jump_sb, target_key=False).replace(
        f"  IdentityFile {jump_sb.host('jump').identity_file}\n  IdentitiesOnly yes\n", "")
    path = write_configs(jump_sb, tmp_path, text)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == 0, doc
    assert doc["hosts"][0]["ssh"]["identity_files"] == {"value": [], "source": "default"}


def test_passphrase_key_without_agent_and_without_tty_is_a_clear_error(jump_sb, tmp_path, capsys, authorized,
                                                                        no_agent):
    key = _keygen(tmp_path / "locked", passphrase="correct horse battery")
    authorized(key.with_name(key.name + ".pub"))
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb),
                         host_overrides={"jt1": {"identity_file": str(key)}})
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt1")
    assert code == ExitCode.CONNECTION
    error = doc["hosts"][0]["error"]
    assert f"identity file {key} is protected by a passphrase" in error
    assert "stdin is not a terminal" in error and "ssh-add" in error


def test_passphrase_key_held_by_the_agent_is_used(jump_sb, tmp_path, capsys, authorized, ssh_agent):
    key = _keygen(tmp_path / "locked", passphrase="correct horse battery")
    authorized(key.with_name(key.name + ".pub"))
    env = {**os.environ, "SSH_AUTH_SOCK": str(ssh_agent), "SSH_ASKPASS_REQUIRE": "force",
           "SSH_ASKPASS": str(_askpass(tmp_path, "correct horse battery")), "DISPLAY": ":0"}
    subprocess.run(["setsid", "-w", "ssh-add", "-q", str(key)], check=True, timeout=30, env=env,
                   stdin=subprocess.DEVNULL, capture_output=True)
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb),
                         host_overrides={"jt1": {"identity_file": str(key)}})
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt1")
    assert code == 0, doc["hosts"][0].get("error")


def _askpass(tmp_path: Path, secret: str) -> Path:
    script = tmp_path / "askpass.sh"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{secret}'\n")
    script.chmod(0o700)
    return script


def test_strict_host_key_checking_no_is_refused_unless_the_yaml_overrides(jump_sb, tmp_path, capsys, no_agent):
    text = ssh_config_text(jump_sb).replace("StrictHostKeyChecking yes", "StrictHostKeyChecking no")
    path = write_configs(jump_sb, tmp_path, text)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt1")
    assert code == ExitCode.CONFIG
    assert "StrictHostKeyChecking is 'no'" in doc["hosts"][0]["error"]
    assert "Host bastion" in doc["hosts"][0]["error"]
    path = write_configs(jump_sb, tmp_path, text, ssh={"host_key_policy": "reject"})
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt1")
    assert code == 0, doc
    assert doc["hosts"][0]["ssh"]["jumps"][0]["host_key_policy"] == {"value": "reject", "source": "yaml"}


def test_a_missing_identity_file_from_yaml_names_it(jump_sb, tmp_path, capsys, no_agent):
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb),
                         host_overrides={"jt1": {"identity_file": str(tmp_path / "nope")}})
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt1")
    assert code == ExitCode.CONNECTION and "does not exist" in doc["hosts"][0]["error"]


def test_direct_connection_failure_behind_bastion_is_exit_4(jump_sb, tmp_path, capsys, no_agent):
    """The bastion cannot reach the target (nothing listens): a clear error naming the target."""
    text = ssh_config_text(jump_sb).replace(f"Port {jump_sb.host('jt2').port}", "Port 9", 1)
    path = write_configs(jump_sb, tmp_path, text)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == ExitCode.CONNECTION
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["jt1"]["ok"] and not by["jt2"]["ok"]
    assert by["jt2"]["error"].startswith(f"jt2 ({jump_sb.host('jt2').user}@{jump_sb.host('jt2').address}:9 via bastion)")



def test_human_gpu_status_names_the_resolved_address_and_bastion(jump_sb, tmp_path, capsys, no_agent):
    from deploy.cli.main import main

    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb))
    assert main(["-c", str(path), "gpu-status", "--host", "jt2"]) == 0
    out = capsys.readouterr().out
    b = jump_sb.host("jt2")
    assert f"jt2  {b.user}@{b.address}:{b.port} via bastion" in out and "2/2 free" in out


def test_changed_jump_host_key_is_refused_naming_the_jump_host(jump_sb, tmp_path, capsys, no_agent):
    other = _keygen(tmp_path / "other_host_key")
    jump = jump_sb.host("jump")
    forged_line = f"[{jump.address}]:{jump.port} " + " ".join(other.with_name(other.name + ".pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text("".join(ln + "\n" for ln in jump_sb.known_hosts.read_text().splitlines()
                             if not ln.startswith(f"[{jump.address}]:")) + forged_line + "\n")
    before = known.read_text()
    text = ssh_config_text(jump_sb).replace(f"UserKnownHostsFile {jump_sb.known_hosts}\n  StrictHostKeyChecking yes",
                                            f"UserKnownHostsFile {known}\n  StrictHostKeyChecking accept-new")
    path = write_configs(jump_sb, tmp_path, text)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == ExitCode.CONNECTION
    for entry in doc["hosts"]:
        assert "jump host bastion" in entry["error"] and "REMOTE HOST KEY CHANGED" in entry["error"]
    assert known.read_text() == before


def test_accept_new_on_the_jump_host_records_its_key_in_its_own_known_hosts(jump_sb, tmp_path, capsys, no_agent):
    jump_known = tmp_path / "bastion_known_hosts"  # does not exist yet
    text = ssh_config_text(jump_sb).replace(f"UserKnownHostsFile {jump_sb.known_hosts}\n  StrictHostKeyChecking yes",
                                            f"UserKnownHostsFile {jump_known}\n  StrictHostKeyChecking accept-new")
    path = write_configs(jump_sb, tmp_path, text)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == 0, doc
    jump = jump_sb.host("jump")
    [line] = jump_known.read_text().splitlines()
    expected = next(ln for ln in jump_sb.known_hosts.read_text().splitlines() if ln.startswith(f"[{jump.address}]:"))
    assert line.split()[:3] == expected.split()[:3]
    # the recorded key is then checked strictly
    strict = text.replace("StrictHostKeyChecking accept-new", "StrictHostKeyChecking yes")
    code, doc = cli_json(capsys, "-c", str(write_configs(jump_sb, tmp_path, strict)), "gpu-status", "--json")
    assert code == 0, doc


def test_two_hops_each_hop_forwards_one_channel(jump_sb, tmp_path, capsys, no_agent):
    """gpu-b behind `ProxyJump bastion,gpu-a`: bastion forwards to jt1, jt1 forwards to jt2."""
    a, b = jump_sb.host("jt1"), jump_sb.host("jt2")
    text = ssh_config_text(jump_sb).replace(
        f"Host gpu-b\n  HostName {b.address}",
        f"Host gpu-b\n  ProxyJump bastion,gpu-a\n  HostName {b.address}")
    path = write_configs(jump_sb, tmp_path, text)
    before = marks(jump_sb)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json", "--host", "jt2")
    assert code == 0, doc
    assert [j["alias"] for j in doc["hosts"][0]["ssh"]["jumps"]] == ["bastion", "gpu-a"]
    assert DIRECT_TCPIP.findall(log_since(jump_sb, "jump", before["jump"])) == [(a.address, str(a.port))]
    jt1_log = log_since(jump_sb, "jt1", before["jt1"])
    assert DIRECT_TCPIP.findall(jt1_log) == [(b.address, str(b.port))]
    assert f"Accepted publickey for {jump_sb.host('jt1').user}" in jt1_log
    assert f"Accepted publickey for {jump_sb.host('jt2').user}" in log_since(jump_sb, "jt2", before["jt2"])


def test_many_hosts_in_parallel_share_one_bastion_connection(jump_sb, tmp_path, capsys, no_agent):
    """Six host entries (alternating the two targets) connect concurrently over one bastion login."""
    path = write_configs(jump_sb, tmp_path, ssh_config_text(jump_sb))
    doc = yaml.safe_load(path.read_text())
    doc["hosts"] = [dict(doc["hosts"][i % 2], name=f"g{i}") for i in range(6)]
    doc["ssh"]["max_parallel"] = 6
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = marks(jump_sb)
    code, out = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == 0, json.dumps([h for h in out.get("hosts", []) if not h.get("ok")])[:4000]
    jump_log = log_since(jump_sb, "jump", before["jump"])
    assert jump_log.count(f"Accepted publickey for {jump_sb.host('jump').user}") == 1
    assert len(DIRECT_TCPIP.findall(jump_log)) == 6
