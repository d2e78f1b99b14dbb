"""Issue 12: resolving a host's SSH settings from the YAML and ssh_config (no SSH at all).

Table tests of deploy.ssh.config.resolve_endpoint: precedence (YAML > ssh_config > default) and
provenance for every field, generated over all combinations; ProxyJump chains; ``none``;
StrictHostKeyChecking values.
"""

from __future__ import annotations

import itertools

import paramiko
import pytest

from deploy.config.models import Host, SSHSettings
from deploy.base.errors import ConfigError
from deploy.ssh.config_eval import OpenSSHConfig
from deploy.ssh.config import SSHConfigSource, load_ssh_config, resolve_endpoint, ssh_config_path


def source(text: str) -> SSHConfigSource:
    return SSHConfigSource(OpenSSHConfig.from_text(text, "/test/ssh_config"), "/test/ssh_config")


def host(**fields) -> Host:
    return Host.model_validate({"name": "h1", "address": "gpu-a", **fields})


# -- precedence and provenance, every combination ---------------------------------------------

# field: (yaml key and value, ssh_config line, expected value from each source)
TARGET_FIELDS = {
    "user": ({"user": "yamluser"}, "User cfguser", {"yaml": "yamluser", "ssh_config": "cfguser", "default": "root"}),
    "port": ({"port": 2201}, "Port 2202", {"yaml": 2201, "ssh_config": 2202, "default": 22}),
    "identity_files": ({"identity_file": "~/.ssh/yaml_key"}, "IdentityFile /keys/cfg_key",
                       {"yaml": ("~/.ssh/yaml_key",), "ssh_config": ("/keys/cfg_key",), "default": ()}),
}
SSH_FIELDS = {
    "known_hosts": ({"known_hosts": "/yaml/known"}, "UserKnownHostsFile /cfg/known1 /cfg/known2",
                    {"yaml": ("/yaml/known",), "ssh_config": ("/cfg/known1", "/cfg/known2"),
                     "default": ("~/.ssh/known_hosts",)}),
    "connect_timeout_s": ({"connect_timeout_s": 3}, "ConnectTimeout 4",
                          {"yaml": 3.0, "ssh_config": 4.0, "default": 10.0}),
    "host_key_policy": ({"host_key_policy": "reject"}, "StrictHostKeyChecking accept-new",
                        {"yaml": "reject", "ssh_config": "accept-new", "default": "reject"}),
}
ALL_FIELDS = {**TARGET_FIELDS, **SSH_FIELDS}


def _cases():
    names = sorted(ALL_FIELDS)
    # every field in each of (yaml+cfg, yaml only, cfg only, neither), fields varied together
    for combo in itertools.product(("both", "yaml", "cfg", "neither"), repeat=2):
        for a, b in itertools.combinations(names, 2):
            yield {a: combo[0], b: combo[1]}


@pytest.mark.parametrize("where", list(_cases()), ids=lambda w: ",".join(f"{k}={v}" for k, v in sorted(w.items())))
def test_yaml_wins_over_ssh_config_wins_over_default(where):
    host_fields, ssh_fields, lines = {}, {}, ["Host gpu-a", "  HostName 10.0.0.5"]
    for name, state in where.items():
        yaml_part, cfg_line, _ = ALL_FIELDS[name]
        if state in ("both", "yaml"):
            (host_fields if name in TARGET_FIELDS else ssh_fields).update(yaml_part)
        if state in ("both", "cfg"):
            lines.append("  " + cfg_line)
    endpoint = resolve_endpoint(host(**host_fields), SSHSettings(**ssh_fields), source("\n".join(lines)))
    for name, state in where.items():
        expected_source = {"both": "yaml", "yaml": "yaml", "cfg": "ssh_config", "neither": "default"}[state]
        setting = getattr(endpoint, name)
        assert setting.source == expected_source, name
        assert setting.value == ALL_FIELDS[name][2][expected_source], name
    assert endpoint.hostname.value == "10.0.0.5" and endpoint.hostname.source == "ssh_config"


def test_yaml_value_equal_to_the_default_still_wins():
    """`user: root` written in the YAML is a choice, not "unset": ssh_config's User must not win."""
    endpoint = resolve_endpoint(host(user="root", port=22), SSHSettings(),
                                source("Host gpu-a\n  User cfguser\n  Port 2222\n"))
    assert (endpoint.user.value, endpoint.user.source) == ("root", "yaml")
    assert (endpoint.port.value, endpoint.port.source) == (22, "yaml")


def test_address_not_in_ssh_config_is_the_yaml_address():
    endpoint = resolve_endpoint(host(address="10.1.2.3"), SSHSettings(), source("Host other\n  User x\n"))
    assert (endpoint.hostname.value, endpoint.hostname.source) == ("10.1.2.3", "yaml")
    assert endpoint.jumps == () and endpoint.known_hosts_name == "10.1.2.3"


def test_wildcards_and_first_value_wins_are_paramikos():
    text = "Host gpu-*\n  User first\n  Port 2200\nHost *\n  User second\n  IdentityFile /k/a\n"
    endpoint = resolve_endpoint(host(), SSHSettings(), source(text))
    assert endpoint.user.value == "first" and endpoint.port.value == 2200
    assert endpoint.identity_files.value == ("/k/a",)
    assert endpoint.known_hosts_name == "[gpu-a]:2200"


def test_hostname_token_is_expanded():
    endpoint = resolve_endpoint(host(), SSHSettings(), source("Host gpu-*\n  HostName %h.dc1.example\n"))
    assert endpoint.hostname.value == "gpu-a.dc1.example"


def test_identities_only():
    assert resolve_endpoint(host(), SSHSettings(), source("Host *\n  IdentitiesOnly yes\n")).identities_only.value
    assert not resolve_endpoint(host(), SSHSettings(), source("Host x\n")).identities_only.value
    with pytest.raises(ConfigError, match="IdentitiesOnly is 'maybe'; expected yes or no"):
        resolve_endpoint(host(), SSHSettings(), source("Host *\n  IdentitiesOnly maybe\n"))


# -- bad values name the file, the Host and the keyword ----------------------------------------

BAD_PORTS = ["0", "65536", "-1", "ssh", "22x", "99999999999"]


@pytest.mark.parametrize("value", BAD_PORTS)
@pytest.mark.parametrize("where", ["target", "jump"])
def test_bad_port_is_a_config_error_naming_file_and_host(value, where):
    if where == "target":
        text = f"Host gpu-a\n  Port {value}\n"
        alias = "gpu-a"
    else:
        text = f"Host gpu-a\n  ProxyJump bastion\nHost bastion\n  Port {value}\n"
        alias = "bastion"
    with pytest.raises(ConfigError, match=rf"^/test/ssh_config: Host {alias}: Port is '{value}'; expected a port"):
        resolve_endpoint(host(), SSHSettings(), source(text))


@pytest.mark.parametrize("value", ["0", "-5", "soon", "1.5"])
def test_bad_connect_timeout(value):
    with pytest.raises(ConfigError, match="ConnectTimeout"):
        resolve_endpoint(host(), SSHSettings(), source(f"Host *\n  ConnectTimeout {value}\n"))


def test_user_known_hosts_none_leaves_the_global_files_to_verify_with():
    """Issue 27: ssh accepts ``UserKnownHostsFile none`` (keys come from GlobalKnownHostsFile)."""
    endpoint = resolve_endpoint(host(), SSHSettings(), source("Host *\n  UserKnownHostsFile none\n"))
    assert endpoint.known_hosts.value == ()
    assert endpoint.global_known_hosts.value == ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
    endpoint = resolve_endpoint(host(), SSHSettings(), source(
        'Host *\n  GlobalKnownHostsFile "/etc/ssh/fleet known"\n'))
    assert endpoint.global_known_hosts == type(endpoint.global_known_hosts)(("/etc/ssh/fleet known",), "ssh_config")


# -- StrictHostKeyChecking --------------------------------------------------------------------

SHKC = {"yes": "reject", "YES": "reject", "ask": "reject", "accept-new": "accept-new", "true": "reject"}
REFUSED = ["no", "off", "No", "false"]


@pytest.mark.parametrize("hop", ["target", "jump"])
@pytest.mark.parametrize("yaml_policy", [None, "reject", "accept-new"])
@pytest.mark.parametrize("value", [*SHKC, *REFUSED, "sometimes"])
def test_strict_host_key_checking(value, yaml_policy, hop):
    block = f"  StrictHostKeyChecking {value}\n"
    text = (f"Host gpu-a\n{block}" if hop == "target"
            else f"Host gpu-a\n  ProxyJump bastion\nHost bastion\n{block}")
    ssh = SSHSettings(host_key_policy=yaml_policy) if yaml_policy else SSHSettings()

    def policy():
        endpoint = resolve_endpoint(host(), ssh, source(text))
        return (endpoint if hop == "target" else endpoint.jumps[0]).host_key_policy

    if yaml_policy is not None:  # an explicit YAML policy always wins, for every hop
        assert (policy().value, policy().source) == (yaml_policy, "yaml")
    elif value in SHKC:
        assert (policy().value, policy().source) == (SHKC[value], "ssh_config")
    elif value in REFUSED:
        with pytest.raises(ConfigError, match="does not connect without checking host keys.*ssh.host_key_policy"):
            policy()
    else:
        with pytest.raises(ConfigError, match="expected yes, ask, accept-new or no"):
            policy()


def test_cli_accept_new_counts_as_an_explicit_yaml_override():
    """--accept-new-host-keys goes through model_copy(update=...), which marks the field set."""
    ssh = SSHSettings().model_copy(update={"host_key_policy": "accept-new"})
    endpoint = resolve_endpoint(host(), ssh, source("Host *\n  StrictHostKeyChecking no\n"))
    assert (endpoint.host_key_policy.value, endpoint.host_key_policy.source) == ("accept-new", "yaml")


# -- ProxyJump chains -------------------------------------------------------------------------

JUMP_CFG = """
Host gpu-*
  ProxyJump {jump}
Host bastion
  HostName 192.0.2.1
  User jumper
  Port 2222
  IdentityFile /keys/bastion
  UserKnownHostsFile /known/bastion
  StrictHostKeyChecking accept-new
Host inner
  HostName 10.0.0.1
Host outer
  HostName 198.51.100.9
  ProxyJump edge
Host edge
  HostName 203.0.113.7
"""


def chain(jump: str) -> list[tuple[str, str, int, str]]:
    endpoint = resolve_endpoint(host(), SSHSettings(), source(JUMP_CFG.format(jump=jump)))
    out = []
    for i, j in enumerate(endpoint.jumps):
        assert [x.alias for x in j.jumps] == [x.alias for x in endpoint.jumps[:i]]  # each via the ones before
        out.append((j.alias, j.hostname.value, j.port.value, j.user.value))
    return out


@pytest.mark.parametrize("jump, expected", [
    ("bastion", [("bastion", "192.0.2.1", 2222, "jumper")]),
    ("bastion,inner", [("bastion", "192.0.2.1", 2222, "jumper"), ("inner", "10.0.0.1", 22, None)]),
    ("ops@bastion:2200", [("bastion", "192.0.2.1", 2200, "ops")]),
    ("ops@inner", [("inner", "10.0.0.1", 22, "ops")]),
    ("ssh://ops@inner:2022", [("inner", "10.0.0.1", 2022, "ops")]),
    ("[2001:db8::1]:2200", [("2001:db8::1", "2001:db8::1", 2200, None)]),
    # the first hop's own ProxyJump is honoured (like `ssh -J outer gpu-a`)
    ("outer", [("edge", "203.0.113.7", 22, None), ("outer", "198.51.100.9", 22, None)]),
    ("outer,inner", [("edge", "203.0.113.7", 22, None), ("outer", "198.51.100.9", 22, None),
                     ("inner", "10.0.0.1", 22, None)]),
    ("none", []),
])
def test_jump_chains(jump, expected):
    from deploy.ssh.config import _local_user

    got = chain(jump)
    assert [(a, h, p, u if u is not None else _local_user()) for a, h, p, u in got] == \
        [(a, h, p, u if u is not None else _local_user()) for a, h, p, u in expected]


def test_each_hop_has_its_own_ssh_config_settings():
    endpoint = resolve_endpoint(host(), SSHSettings(), source(JUMP_CFG.format(jump="bastion,inner")))
    bastion, inner = endpoint.jumps
    assert bastion.identity_files.value == ("/keys/bastion",) and bastion.identity_files.source == "ssh_config"
    assert bastion.known_hosts.value == ("/known/bastion",)
    assert bastion.host_key_policy.value == "accept-new"
    assert inner.identity_files.value == () and inner.host_key_policy.value == "reject"
    assert bastion.role == "jump host" and "jump host bastion (jumper@192.0.2.1:2222)" == bastion.label
    # the target's own settings are not the bastion's
    assert endpoint.identity_files.value == () and endpoint.host_key_policy.source == "default"


def test_yaml_identity_file_is_not_given_to_jump_hosts():
    """Like `ssh -i key -J bastion`: -i is the target's; the bastion uses its own config/agent."""
    endpoint = resolve_endpoint(host(identity_file="/yaml/key"), SSHSettings(),
                                source(JUMP_CFG.format(jump="inner")))
    assert endpoint.identity_files.value == ("/yaml/key",)
    assert endpoint.jumps[0].identity_files.value == ()


def test_targets_behind_the_same_bastion_share_its_chain_key():
    cfg = source(JUMP_CFG.format(jump="bastion"))
    a = resolve_endpoint(host(address="gpu-a"), SSHSettings(), cfg)
    b = resolve_endpoint(Host(name="h2", address="gpu-b"), SSHSettings(), cfg)
    assert a.jumps[0].chain_key() == b.jumps[0].chain_key()
    assert a.chain_key() != b.chain_key()
    c = resolve_endpoint(Host(name="h3", address="gpu-c"), SSHSettings(), source(JUMP_CFG.format(jump="ops@bastion")))
    assert c.jumps[0].chain_key() != a.jumps[0].chain_key()  # another user: another connection


@pytest.mark.parametrize("text, alias", [
    ("Host gpu-a\n  ProxyJump gpu-a\n", "gpu-a"),
    ("Host gpu-a\n  ProxyJump j1\nHost j1\n  ProxyJump j2\nHost j2\n  ProxyJump j1\n", "j2"),
    ("".join(f"Host j{i}\n  ProxyJump j{i + 1}\n" for i in range(12)) + "Host gpu-a\n  ProxyJump j0\n", None),
])
def test_jump_loops_and_overlong_chains_are_config_errors(text, alias):
    with pytest.raises(ConfigError, match="loops or is longer than 8 hops"):
        resolve_endpoint(host(), SSHSettings(), source(text))


@pytest.mark.parametrize("spec", ["@bastion", "ops@", "bastion:", "bastion:notaport", "ops@bastion:0"])
def test_bad_jump_specs(spec):
    with pytest.raises(ConfigError, match="ProxyJump"):
        resolve_endpoint(host(), SSHSettings(), source(f"Host gpu-a\n  ProxyJump {spec}\n"))


def test_to_dict_reports_every_value_with_its_source():
    endpoint = resolve_endpoint(host(user="deploy"), SSHSettings(), source(JUMP_CFG.format(jump="bastion")))
    doc = endpoint.to_dict()
    assert doc["user"] == {"value": "deploy", "source": "yaml"}
    assert doc["jumps"][0]["alias"] == "bastion" and doc["jumps"][0]["role"] == "jump host"
    assert doc["jumps"][0]["known_hosts"] == {"value": ["/known/bastion"], "source": "ssh_config"}
    for key in ("hostname", "user", "port", "identity_files", "identities_only", "connect_timeout_s",
                "known_hosts", "host_key_policy"):
        assert set(doc[key]) == {"value", "source"}


# -- which file: default, explicit, none ------------------------------------------------------


def test_config_file_none_ignores_ssh_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host gpu-a\n  User fromconfig\n")
    assert ssh_config_path(SSHSettings()) == str(tmp_path / ".ssh" / "config")
    default = resolve_endpoint(host(), SSHSettings(), load_ssh_config(SSHSettings()))
    assert default.user.value == "fromconfig"
    none = SSHSettings(config_file="none")
    assert ssh_config_path(none) is None
    ignored = resolve_endpoint(host(), none, load_ssh_config(none))
    assert (ignored.user.value, ignored.user.source) == ("root", "default")


def test_no_default_file_means_no_ssh_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ssh_config_path(SSHSettings()) is None
    assert load_ssh_config(SSHSettings()).path is None


def test_explicit_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"ssh.config_file: .*nope does not exist \(use `none`"):
        load_ssh_config(SSHSettings(config_file=str(tmp_path / "nope")))


# -- Include (paramiko keeps it as an option and never opens the file) ------------------------


def test_include_is_inlined_relative_to_dot_ssh_with_globs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    ssh_dir = tmp_path / ".ssh"
    (ssh_dir / "config.d").mkdir(parents=True)
    (ssh_dir / "config.d" / "10-gpu").write_text("Host gpu-a\n  HostName 10.9.9.9\n  User fromd\n")
    (ssh_dir / "config.d" / "20-nested").write_text(f"Include {tmp_path}/abs.conf\n")
    (tmp_path / "abs.conf").write_text("Host gpu-b\n  Port 2022\n")
    (ssh_dir / "config").write_text("Include config.d/*\nInclude nothing-matches-*\nHost *\n  User fallback\n")
    src = load_ssh_config(SSHSettings())
    a = resolve_endpoint(host(), SSHSettings(), src)
    assert (a.hostname.value, a.user.value) == ("10.9.9.9", "fromd")
    b = resolve_endpoint(Host(name="b", address="gpu-b"), SSHSettings(), src)
    assert (b.port.value, b.user.value) == (2022, "fallback")


def test_include_loop_is_a_config_error(tmp_path):
    loop = tmp_path / "loop.conf"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(ConfigError, match="Include nested more than 16 deep"):
        load_ssh_config(SSHSettings(config_file=str(loop)))


# -- options deployctl cannot honour are refused, never ignored -------------------------------

@pytest.mark.parametrize("line, keyword", [
    ("ProxyCommand ssh -W %h:%p bastion", "ProxyCommand"),
    ("HostKeyAlias other", "HostKeyAlias"),
    ("IdentityAgent ~/.1password/agent.sock", "IdentityAgent"),
])
@pytest.mark.parametrize("where", ["target", "jump"])
def test_unsupported_options_are_refused(line, keyword, where, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    text = (f"Host gpu-a\n  {line}\n" if where == "target"
            else f"Host gpu-a\n  ProxyJump bastion\nHost bastion\n  {line}\n")
    with pytest.raises(ConfigError, match=rf"Host {'gpu-a' if where == 'target' else 'bastion'}: {keyword}"):
        resolve_endpoint(host(), SSHSettings(), source(text))


def test_proxycommand_none_and_identity_agent_matching_the_environment_are_fine(monkeypatch, tmp_path):
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    text = f"Host gpu-a\n  ProxyCommand none\n  IdentityAgent {tmp_path}/agent.sock\n"
    assert resolve_endpoint(host(), SSHSettings(), source(text)).jumps == ()


def test_docs_ssh_say_who_evaluates_ssh_config_and_it_is_true():
    # issue 25: docs/ssh.md still said paramiko's parser read ssh_config and that Include was
    # inlined before it; deploy/ssh/config_eval.py evaluates it (readconf.c), Include scoped to its block
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "ssh.md").read_text()
    assert "parsed by paramiko" not in text and "inlined before paramiko" not in text
    assert "deploy/ssh/config_eval.py" in text
    assert not [p for p in (root / "deploy").rglob("*.py") if "paramiko.SSHConfig" in p.read_text()
                or "from paramiko import SSHConfig" in p.read_text()]


# -- issue 27: OpenSSH's argv_split, known_hosts "none" and /dev/null, GlobalKnownHostsFile -----

from deploy.ssh.config_eval import argv_split  # noqa: E402

ARGV_SPLIT = [  # misc.c argv_split(s, ..., terminate_on_comment=1), as readconf.c calls it since 8.7
    ("ops#x", ["ops#x"]), ("a #c d", ["a"]), ("#all", []), ('"/p/known hosts" /x', ["/p/known hosts", "/x"]),
    ("'single q' b", ["single q", "b"]), ('a"b c"d', ["ab cd"]), ("a\\ b", ["a b"]), ('\\"q', ['"q']),
    ("x\\y", ["x\\y"]), ('"a\\ b"', ["a\\ b"]), ("\ta\t b ", ["a", "b"]), ('""', [""]), ("a#b #c", ["a#b"]),
]


@pytest.mark.parametrize("text,words", ARGV_SPLIT)
def test_arguments_are_split_as_openssh_argv_split(text, words):
    assert argv_split(text) == words


@pytest.mark.parametrize("text", ['"open', "a 'b", 'x "y\\"'])
def test_an_unterminated_quote_is_refused_naming_the_line(text):
    with pytest.raises(ConfigError, match="ssh_config:2: ssh_config line not understood"):
        source(f"Host *\n  User {text}\n")


def test_user_and_host_keep_a_hash_inside_a_word():
    config = source("Host gpu-b#x\n  Port 2201\nHost *\n  User ops#x # a comment\n")
    assert resolve_endpoint(host(address="gpu-b"), SSHSettings(), config).port.value == 22   # not gpu-b's block
    assert resolve_endpoint(host(address="gpu-b"), SSHSettings(), config).user.value == "ops#x"


def test_none_beside_a_file_is_refused_as_ssh_does():
    with pytest.raises(ConfigError, match='"none" argument must appear alone'):
        resolve_endpoint(host(), SSHSettings(), source("Host *\n  UserKnownHostsFile none /k\n"))


def test_known_hosts_are_read_from_user_then_global_files_and_dev_null_is_empty(tmp_path):
    from deploy.ssh.hop import known_hosts_files

    user, system = tmp_path / "user hosts", tmp_path / "ssh_known_hosts"
    user.write_text("")
    system.write_text("")
    text = f'Host *\n  UserKnownHostsFile /dev/null "{user}"\n  GlobalKnownHostsFile {system} {tmp_path}/absent\n'
    endpoint = resolve_endpoint(host(), SSHSettings(), source(text))
    files, read = known_hosts_files(endpoint)
    assert [str(f) for f in files] == ["/dev/null", str(user)]      # a new key is recorded in files[0]
    assert read == [user, system]                                    # /dev/null reads as nothing; absent skipped


class _KeyOnlyServer:
    """An in-process SSH server (paramiko) that shows its host key and refuses every login: how far
    a client gets tells whether it trusted the key (authentication failed) or not (host key refused)."""

    def __init__(self):
        import socket
        import threading

        self.key = paramiko.Ed25519Key.generate() if hasattr(paramiko.Ed25519Key, "generate") else None
        if self.key is None:
            self.key = paramiko.ECDSAKey.generate()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        class Refuse(paramiko.ServerInterface):
            def get_allowed_auths(self, username):
                return "password"

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(self.key)
            try:
                transport.start_server(server=Refuse())
            except Exception:  # noqa: BLE001 - the client went away
                pass

    def line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.key.get_name()} {self.key.get_base64()}\n"


@pytest.mark.parametrize("where", ["global", "user-after-dev-null", "nowhere"])
def test_a_key_only_in_the_global_known_hosts_file_is_trusted_and_never_written(tmp_path, where):
    from deploy.ssh.hop import apply_host_key_policy
    from deploy.base.errors import HostKeyRejected

    server = _KeyOnlyServer()
    system, user = tmp_path / "ssh_known_hosts", tmp_path / "user_hosts"
    system.write_text(server.line() if where == "global" else "")
    user.write_text(server.line() if where == "user-after-dev-null" else "")
    files = "none" if where == "global" else f"/dev/null {user}"
    endpoint = resolve_endpoint(host(address="127.0.0.1", port=server.port), SSHSettings(), source(
        f"Host *\n  UserKnownHostsFile {files}\n  GlobalKnownHostsFile {system}\n"))
    client = paramiko.SSHClient()
    apply_host_key_policy(client, endpoint, "host h1")
    before = system.read_text()
    try:
        if where == "nowhere":
            with pytest.raises(HostKeyRejected, match="not in known_hosts"):
                client.connect("127.0.0.1", server.port, username="u", password="x", timeout=10,
                               allow_agent=False, look_for_keys=False)
        else:  # the key was trusted: it got as far as the login, which this server refuses
            with pytest.raises(paramiko.AuthenticationException):
                client.connect("127.0.0.1", server.port, username="u", password="x", timeout=10,
                               allow_agent=False, look_for_keys=False)
    finally:
        client.close()
        server.sock.close()
    assert system.read_text() == before
