"""Issue: foundation. gpu-status and the SSH transport over the real-sshd sandbox."""

from __future__ import annotations

import subprocess

import pytest

from deploy.config import load_config
from deploy.base.errors import ConnectionFailed, ExitCode, HostKeyRejected
from deploy.base.shell import quote, quote_path
from deploy.ssh.transport import HostConnection
from tests.integration.helpers import cli_json, gpu_used, hold_gpu_program, start_stray, wait_until, write_config

pytestmark = pytest.mark.sandbox


def test_gpu_status_on_three_hosts_in_parallel(clean_sandbox, capsys):
    code, doc = cli_json(capsys, "-c", str(clean_sandbox.config_path), "gpu-status", "--json")
    assert code == 0 and doc["ok"]
    assert [h["host"] for h in doc["hosts"]] == ["sb1", "sb2", "sb3"]
    for host in doc["hosts"]:
        assert host["all_free"] and [g["index"] for g in host["gpus"]] == list(range(8))
        assert all(g["used_mib"] == 0 and g["total_mib"] > 0 and g["holders"] == [] for g in host["gpus"])


def test_gpu_status_is_one_exec_channel_per_host(clean_sandbox, capsys, monkeypatch):
    """Both nvidia-smi queries travel as one remote command: one exec channel per host."""
    sent: list[tuple[str, str]] = []
    original = HostConnection._exec

    def counted(self, command, *, timeout):
        sent.append((self.host.name, command))
        return original(self, command, timeout=timeout)

    monkeypatch.setattr(HostConnection, "_exec", counted)
    code, doc = cli_json(capsys, "-c", str(clean_sandbox.config_path), "gpu-status", "--json")
    assert code == 0 and doc["ok"]
    assert sorted(name for name, _ in sent) == ["sb1", "sb2", "sb3"]
    assert all(command.count("nvidia-smi ") == 2 for _, command in sent)


def test_stray_process_holding_gpu3_is_its_holder(clean_sandbox, capsys):
    home = str(clean_sandbox.host("sb2").home)
    pid = start_stray(clean_sandbox, "sb2", hold_gpu_program(home, 3))
    wait_until(lambda: gpu_used(clean_sandbox, "sb2")[3] > 0, what="GPU 3 in use")
    code, doc = cli_json(capsys, "-c", str(clean_sandbox.config_path), "gpu-status", "--json", "--host", "sb2")
    assert code == 0
    [host] = doc["hosts"]
    busy = [g for g in host["gpus"] if g["used_mib"] > 0]
    assert [g["index"] for g in busy] == [3]
    assert [h["pid"] for h in busy[0]["holders"]] == [pid]
    assert "python3" in busy[0]["holders"][0]["process_name"]
    assert host["all_free"] is False


def test_human_table_lists_holder(clean_sandbox, capsys):
    from deploy.cli.main import main

    home = str(clean_sandbox.host("sb1").home)
    pid = start_stray(clean_sandbox, "sb1", hold_gpu_program(home, 5))
    wait_until(lambda: gpu_used(clean_sandbox, "sb1")[5] > 0, what="GPU 5 in use")
    assert main(["-c", str(clean_sandbox.config_path), "gpu-status", "--host", "sb1"]) == 0
    out = capsys.readouterr().out
    assert "7/8 free" in out and str(pid) in out


def test_unreachable_host_is_reported_and_others_still_answer(clean_sandbox, tmp_path, capsys):
    dead = {"name": "dead", "address": "127.0.0.99", "port": 1, "user": "nobody",
            "identity_file": str(clean_sandbox.host("sb1").identity_file), "gpus": 8}
    path = write_config(clean_sandbox, tmp_path, ssh={"connect_retries": 0, "connect_timeout_s": 3},
                        extra_hosts=[dead])
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == ExitCode.CONNECTION
    by_name = {h["host"]: h for h in doc["hosts"]}
    assert by_name["dead"]["ok"] is False and "cannot connect" in by_name["dead"]["error"]
    assert all(by_name[n]["ok"] for n in ("sb1", "sb2", "sb3"))


def test_nvidia_smi_failure_is_an_error_not_free(clean_sandbox, capsys):
    host = clean_sandbox.host("sb3")
    clean_sandbox.run("sb3", f"touch {quote_path(str(host.sim_dir))}/driver_failed")
    code, doc = cli_json(capsys, "-c", str(clean_sandbox.config_path), "gpu-status", "--json", "--host", "sb3")
    assert code == ExitCode.REMOTE_OUTPUT
    assert "couldn't communicate with the NVIDIA driver" in doc["hosts"][0]["error"]


def test_wrong_gpu_count_is_an_error(clean_sandbox, tmp_path, capsys):
    config = load_config(clean_sandbox.config_path)
    hosts = [h.model_dump() | {"gpus": 4} for h in config.hosts if h.name == "sb1"]
    path = write_config(clean_sandbox, tmp_path, hosts=hosts)
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == ExitCode.REMOTE_OUTPUT and "expected GPUs 0..3" in doc["hosts"][0]["error"]


def _host(sandbox, tmp_path, **ssh):
    config = load_config(write_config(sandbox, tmp_path, ssh=ssh))
    return config.host("sb1"), config.ssh


def test_unknown_host_key_is_refused(sandbox, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host, ssh = _host(sandbox, tmp_path, known_hosts=str(empty), connect_retries=0)
    with pytest.raises(HostKeyRejected, match="not in known_hosts"):
        HostConnection(host, ssh).connect()
    assert empty.read_text() == ""


def test_accept_new_records_the_key_then_checks_it(sandbox, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    host, ssh = _host(sandbox, tmp_path, known_hosts=str(known), host_key_policy="accept-new")
    with HostConnection(host, ssh) as conn:
        assert conn.run("echo hi").stdout == "hi\n"
    recorded = known.read_text()
    assert recorded.startswith(f"[{host.address}]:{host.port} ssh-ed25519 ")
    # The recorded key is what the real OpenSSH client accepts under strict checking.
    argv = sandbox.ssh_argv("sb1", "true", multiplex=False)
    argv[argv.index(f"UserKnownHostsFile={sandbox.known_hosts}")] = f"UserKnownHostsFile={known}"
    assert subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    # ...and deployctl now connects with plain reject.
    host, ssh = _host(sandbox, tmp_path, known_hosts=str(known), host_key_policy="reject")
    with HostConnection(host, ssh) as conn:
        assert conn.run("true").ok


def test_the_ssh_socket_has_nagle_off_so_a_command_does_not_wait_for_a_delayed_ack(sandbox, tmp_path):
    """paramiko leaves Nagle's algorithm on; deploy/ssh/hop.py turns it off on every hop's TCP socket
    (a command then takes ~5 ms against sshd here instead of ~48 ms: docs/benchmarks.md)."""
    import socket

    host, ssh = _host(sandbox, tmp_path)
    with HostConnection(host, ssh) as conn:
        assert conn.run("true").ok
        sock = conn._live().client.get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_an_idle_connection_wakes_about_once_a_second_and_ends_at_once_when_closed(sandbox, tmp_path):
    """paramiko's transport thread woke every 0.1 s to see whether close() was called, ~1 ms of CPU per
    second per open connection (`status` holds one per host through its window, issue 37). Connected,
    it wakes every SETTLED_WAKE_S; close() shuts the socket down first, so the thread does not sit
    out that wait: it ends as when a server hangs up."""
    import threading
    import time

    from deploy.ssh.hop import SETTLED_WAKE_S

    host, ssh = _host(sandbox, tmp_path)
    conn = HostConnection(host, ssh)
    assert conn.run("true").ok
    transport = conn._live().client.get_transport()
    wakes = 0
    woke = threading.Event()
    check = transport.packetizer._check_keepalive  # what paramiko calls on every wake-up with nothing read

    def counted() -> None:
        nonlocal wakes
        wakes += 1
        woke.set()
        check()

    transport.packetizer._check_keepalive = counted
    time.sleep(2.0)
    assert SETTLED_WAKE_S >= 1.0 and wakes <= 3, f"{wakes} wake-ups in 2 s of an idle connection"
    woke.clear()
    assert woke.wait(2 * SETTLED_WAKE_S), "no wake-up at all"
    time.sleep(0.05)  # the thread is back in its poll, a whole SETTLED_WAKE_S from its next wake-up
    closed = time.monotonic()
    conn.close()
    transport.join(SETTLED_WAKE_S / 2)
    assert not transport.is_alive(), "the transport thread outlived close() by half a wake-up interval"
    assert time.monotonic() - closed < SETTLED_WAKE_S / 2

def test_changed_host_key_is_always_refused(sandbox, tmp_path):
    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    host = load_config(sandbox.config_path).host("sb1")
    forged = tmp_path / "known_hosts"
    forged.write_text(f"[{host.address}]:{host.port} {other_key.with_suffix('.pub').read_text().split(' ')[0]} "
                      f"{other_key.with_suffix('.pub').read_text().split(' ')[1]}\n")
    before = forged.read_text()
    for policy in ("reject", "accept-new"):
        host, ssh = _host(sandbox, tmp_path, known_hosts=str(forged), host_key_policy=policy, connect_retries=0)
        with pytest.raises(HostKeyRejected, match="HOST KEY CHANGED"):
            HostConnection(host, ssh).connect()
    assert forged.read_text() == before


def test_changed_key_via_cli_exits_4(sandbox, tmp_path, capsys):
    forged = tmp_path / "kh"
    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    config = load_config(sandbox.config_path)
    lines = [f"[{h.address}]:{h.port} " + " ".join(other_key.with_suffix(".pub").read_text().split()[:2]) for h in config.hosts]
    forged.write_text("\n".join(lines) + "\n")
    path = write_config(sandbox, tmp_path, ssh={"known_hosts": str(forged), "connect_retries": 0})
    code, doc = cli_json(capsys, "-c", str(path), "gpu-status", "--json")
    assert code == ExitCode.CONNECTION
    assert all("HOST KEY CHANGED" in h["error"] for h in doc["hosts"])


HOSTILE = ["with space", "it's", 'd"q', "$(touch pwned)", "`touch pwned2`", "a;touch pwned3", "*", "-n", "x\ny", "ünï"]


def test_hostile_strings_stay_one_argument(clean_sandbox, tmp_path):
    host, ssh = _host(clean_sandbox, tmp_path)
    with HostConnection(host, ssh) as conn:
        for value in HOSTILE:
            result = conn.run(f"printf '%s\\0' {quote(value)}")
            assert result.stdout == value + "\0"
        # a hostile path through the tilde-aware quoting, and over SFTP
        weird = "~/dir with 'quotes' and $(touch pwned4)/f;x"
        local = tmp_path / "payload"
        local.write_text("payload")
        conn.check(f"mkdir -p -- {quote_path(weird.rsplit('/', 1)[0])}")
        conn.put(local, conn.resolve(weird))
        assert conn.run(f"cat -- {quote_path(weird)}").stdout == "payload"
        assert conn.run("ls -a ~ | grep -cx 'pwned[0-9]*' || true").stdout.strip() == "0"


def test_remote_command_timeout_kills_the_remote_process(clean_sandbox, tmp_path):
    from deploy.base.errors import StepTimeout

    host, ssh = _host(clean_sandbox, tmp_path)
    with HostConnection(host, ssh) as conn:
        with pytest.raises(StepTimeout):
            conn.run("exec python3 -c 'import time; time.sleep(300)' deployctl-timeout-probe", timeout=1)
        wait_until(lambda: "deployctl-timeout-probe" not in conn.run('ps -u "$(id -u)" -o args=').stdout, timeout=15,
                   what="the timed-out remote process to be gone")


def test_reconnects_between_commands_after_a_dropped_connection(clean_sandbox, tmp_path):
    host, ssh = _host(clean_sandbox, tmp_path)
    with HostConnection(host, ssh) as conn:
        first = conn.run("echo $PPID").stdout.strip()
        # kill this session's sshd process: the connection drops under us. Whether the kill's own exit status
        # gets out before the drop is a race, so the command may end either way; the next one must reconnect.
        try:
            conn.run("kill -9 $(ps -o ppid= -p $PPID)")
        except ConnectionFailed:
            pass
        wait_until(lambda: not conn._conn.client.get_transport().is_active(), timeout=10, what="the drop")
        assert conn.run("echo $PPID").stdout.strip() != first
