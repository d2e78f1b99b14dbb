"""deployctl's ssh_config resolution against OpenSSH's own (``ssh -G``), on a generated corpus.

Each case is a config written by a seeded generator: Host patterns (wildcards, several per line,
negation), Match host/user/originalhost/all (negated too), Include absolute, relative (to ~/.ssh)
and globbed, at top level and inside Host/Match blocks, HostName with %h and %%, Port, User,
IdentityFile and UserKnownHostsFile with tokens, ProxyJump; every case is looked up for aliases of
mixed case. Compared: hostname, port, user, identityfile (as ssh -G prints it, unexpanded),
userknownhostsfile (expanded), proxyjump. IdentityFile's token expansion is compared with what
``ssh -v`` reports loading, against a local listener.

Skipped (with the reason) when the OpenSSH client is not installed.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from deploy.config.models import Host, SSHSettings
from deploy.base.errors import ConfigError
from deploy.ssh.config import load_ssh_config, resolve_endpoint

SSH = shutil.which("ssh")
pytestmark = pytest.mark.skipif(SSH is None, reason="the OpenSSH client (ssh) is not installed")

ALIASES = ("alpha", "Beta", "GPU-1", "gpu-2.example.com", "db", "Web01", "x.y", "jump1", "UPPER", "gpu-b")
# issue 27: OpenSSH's argv_split: "#" starts a comment only where a word would start ("gpu-b#x" is
# one pattern, "ops#x" one user), quotes group a file name with a space; "none" and /dev/null
PATTERNS = ("alpha", "beta", "gpu-*", "GPU-?", "*.example.com", "db", "web0?", "*", "x.*", "jump*", "upper",
            "*a*", "nomatch")
#: Host lines only: OpenSSH 9.2 still splits a Match line with strdelim (no single quotes, no "#")
HOST_PATTERNS = PATTERNS + ("gpu-b#x", "'gpu-b'", "db #comment")
USERS = ("deploy", "ops", "Admin", "root", "svc_1", "ops#x", '"svc 2"')
KNOWN_TOKENS = ("%d/.k/%h", "/kh/%h_%p_%r", "/kh/%u/%n", "/kh/100%%/%h", "/kh/static", "~/kh/%r@%h",
                '"/kh/with space/%h"', "/dev/null")
GLOBAL_FILES = ("/etc/ssh/fleet_known_hosts", '"/etc/ssh/with space"', "none")
ID_FILES = ("~/.ssh/id_%h", "/keys/%r/%h", "/keys/static", "~/.ssh/id_%u_%%", "/keys/%n.key")
LOCAL_USER = pwd.getpwuid(os.getuid()).pw_name
HOME = pwd.getpwuid(os.getuid()).pw_dir


def _options(rng: random.Random, limit: int = 3) -> list[str]:
    choices = [
        lambda: f"HostName {rng.choice(['10.0.0.%d' % rng.randint(1, 250), '%h.Example.COM', 'Real-%h', 'a%%b', 'node.lan'])}",
        lambda: f"Port {rng.choice([22, 2200, 2222, 40022])}",
        lambda: f"User {rng.choice(USERS)}",
        lambda: f"IdentityFile {rng.choice(ID_FILES)}",
        lambda: f"UserKnownHostsFile {' '.join(rng.sample(KNOWN_TOKENS, rng.randint(1, 2)))}",
        lambda: "UserKnownHostsFile none",  # alone: ssh refuses "none" beside a file
        lambda: f"GlobalKnownHostsFile {rng.choice(GLOBAL_FILES)}",
        lambda: f"ProxyJump {rng.choice(['jump1', 'ops@jump1:2222', 'none', 'jump1,db'])}",
    ]
    return ["  " + rng.choice(choices)() for _ in range(rng.randint(1, limit))]


def _block_header(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.55:
        patterns = rng.sample(HOST_PATTERNS, rng.randint(1, 3))
        if rng.random() < 0.25:
            patterns.append("!" + rng.choice(PATTERNS[:7]))
        return "Host " + " ".join(patterns)
    criteria = []
    for _ in range(rng.randint(1, 2)):
        neg = "!" if rng.random() < 0.2 else ""
        which = rng.choice(["host", "originalhost", "user", "all"])
        if which == "all":
            return "Match all"
        value = rng.choice(USERS[:5]) if which == "user" else ",".join(rng.sample(PATTERNS, rng.randint(1, 2)))
        criteria.append(f"{neg}{which} {value}")
    return "Match " + " ".join(criteria)


def generate(seed: int, root: Path, rel_base: str | None) -> Path:
    rng = random.Random(seed)
    inc_dir = root / "inc"
    inc_dir.mkdir()
    (inc_dir / "a-directory.conf").mkdir()  # an Include glob skips directories (readconf.c), as ssh -G shows
    included = []
    for i in range(rng.randint(1, 3)):
        body = _options(rng, 2) if rng.random() < 0.5 else []
        for _ in range(rng.randint(0, 2)):
            body += [_block_header(rng)] + _options(rng)
        path = inc_dir / f"part{i}.conf"
        path.write_text("\n".join(body) + "\n")
        included.append(path)

    def include_line() -> str:
        choice = rng.random()
        if choice < 0.4:
            return f"Include {rng.choice(included)}"
        if choice < 0.7:
            return f"Include {inc_dir}/*.conf"
        if rel_base is not None:
            return f"Include {rel_base}/inc/{rng.choice(included).name}"
        return "Include no-such-dir/*.conf"  # relative to ~/.ssh: matches nothing on either side

    lines = []
    if rng.random() < 0.3:
        lines += _options(rng, 2)
    for _ in range(rng.randint(2, 6)):
        lines.append(_block_header(rng))
        lines += _options(rng)
        if rng.random() < 0.3:
            lines.append("  " + include_line())
    if rng.random() < 0.5:
        lines.insert(rng.randint(0, len(lines)), include_line())
    config = root / "ssh_config"
    config.write_text("\n".join(lines) + "\n")
    return config


def ssh_g(config: Path, alias: str) -> dict[str, list[str]]:
    out = subprocess.run([SSH, "-G", "-F", str(config), alias], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ.get("PATH", ""), "HOME": HOME})
    if out.returncode != 0 and "jumphost loop" in out.stderr:
        return {"loop": [out.stderr]}
    assert out.returncode == 0, out.stderr
    values: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key, []).append(value)
    return values


SEEDS = list(range(80))


@pytest.fixture
def home(monkeypatch):
    monkeypatch.setenv("HOME", HOME)  # deployctl's ~ must be ssh's (the passwd entry's home)


@pytest.mark.parametrize("seed", SEEDS)
def test_resolution_matches_ssh_G(tmp_path, home, seed):
    ssh_dir = Path(HOME) / ".ssh"
    rel_base = os.path.relpath(tmp_path, ssh_dir) if ssh_dir.is_dir() else None
    config = generate(seed, tmp_path, rel_base)
    settings = SSHSettings(config_file=str(config))
    source = load_ssh_config(settings)
    for alias in ALIASES:
        theirs = ssh_g(config, alias)
        options = source.config.lookup(alias)
        context = f"seed {seed}, alias {alias}\n{config.read_text()}"
        try:
            ours = resolve_endpoint(Host(name="h", address=alias), settings, source)
        except ConfigError as exc:
            # a ProxyJump chain that loops (jump1's own ProxyJump is jump1) is refused; ssh would
            # loop connecting. Everything else the generator writes is resolved.
            assert "jump chain" in str(exc), f"{exc}\n{context}"
            ours = None
        if "loop" in theirs:  # ssh refuses it too ("jumphost loop via ...")
            assert ours is None, context
            continue
        assert options["hostname"] == theirs["hostname"][0], context
        assert int(options.get("port", 22)) == int(theirs["port"][0]), context
        assert options.get("user", LOCAL_USER) == theirs["user"][0], context
        if ours is not None:
            assert ours.hostname.value == theirs["hostname"][0], context
            assert ours.port.value == int(theirs["port"][0]), context
            if "user" in options:
                assert ours.user.value == theirs["user"][0], context
            if "userknownhostsfile" in options:
                assert " ".join(ours.known_hosts.value) or "none" == theirs["userknownhostsfile"][0], context
            assert " ".join(ours.global_known_hosts.value) or "none" == theirs["globalknownhostsfile"][0], context
        if options.get("identityfile"):
            assert options["identityfile"] == theirs["identityfile"], context
        jump = options.get("proxyjump")
        assert (None if jump == "none" else jump) == (theirs.get("proxyjump") or [None])[0], context  # none: no jump


def test_corpus_exercises_every_feature(tmp_path):
    text = ""
    for seed in SEEDS:
        root = tmp_path / str(seed)
        root.mkdir()
        config = generate(seed, root, None)
        text += config.read_text() + "".join(p.read_text() for p in (root / "inc").iterdir() if p.is_file())
    for feature in ("Host ", "Match host", "Match originalhost", "Match user", "Match all", "!", "  Include",
                    "\nInclude", "*.conf", "%h", "%%", "%r", "%p", "%n", "%u", "%d", "ProxyJump", "Port ",
                    "User ", "IdentityFile", "UserKnownHostsFile", "ops#x", "gpu-b#x", '"/kh/with space/%h"',
                    "UserKnownHostsFile none", "/dev/null", "GlobalKnownHostsFile", "'gpu-b'", "db #comment"):
        assert feature in text, feature


# --- IdentityFile tokens: what ssh really loads (ssh -v), against a local listener -------------
class Listener:
    """Accepts TCP connections on 127.0.0.1 and closes them: enough for ssh to load its identities."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()


IDENTITY_CASES = ["~/.ssh/id_%h", "/keys/%r/%h/%p", "/keys/%u_%n", "/keys/100%%_%h", "%d/k/%r", "/keys/%i_%L"]


@pytest.mark.parametrize("pattern", IDENTITY_CASES)
@pytest.mark.parametrize("alias", ["Tok-Host", "tok"])
def test_identity_file_tokens_expand_as_ssh_loads_them(tmp_path, home, pattern, alias):
    listener = Listener()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host tok* Tok*\n  HostName 127.0.0.1\n  Port {listener.port}\n  User bob\n"
                      f"  IdentityFile {pattern}\n  IdentitiesOnly yes\n")
    out = subprocess.run([SSH, "-v", "-F", str(config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                          "-o", "UserKnownHostsFile=/dev/null", alias, "true"], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    loaded = [line.split("identity file ", 1)[1].split(" type ")[0] for line in out.stderr.splitlines()
              if "debug1: identity file " in line]
    settings = SSHSettings(config_file=str(config))
    ours = resolve_endpoint(Host(name="h", address=alias), settings, load_ssh_config(settings))
    assert loaded, out.stderr
    assert list(ours.identity_files.value) == loaded[:1]
    listener.sock.close()


# --- what is refused, clearly ----------------------------------------------------------------
@pytest.mark.parametrize("text,fragment", [
    ("Match exec \"touch /tmp/x\"\n  User u\n", "Match exec"),
    ("Host a\n  User u\nMatch host a exec true\n  Port 1\n", "Match exec"),
    ("Match canonical\n  User u\n", "Match canonical"),
    ("Match final\n  User u\n", "Match final"),
    ("Match localnetwork 10.0.0.0/8\n  User u\n", "Match localnetwork"),
    ("CanonicalizeHostname yes\n", "CanonicalizeHostname"),
    ("Host a\n  CanonicalizeHostname always\n", "CanonicalizeHostname"),
    ("Host a\n  HostName %l.lan\n", "%l"),
    ("Host a\n  UserKnownHostsFile /k/%C\n", "%C"),
])
def test_refused_with_file_and_line(tmp_path, text, fragment):
    config = tmp_path / "ssh_config"
    config.write_text(text)
    settings = SSHSettings(config_file=str(config))
    with pytest.raises(ConfigError) as caught:
        resolve_endpoint(Host(name="h", address="a"), settings, load_ssh_config(settings))
    assert fragment in str(caught.value) and str(config) in str(caught.value)


@pytest.mark.parametrize("prefix", ["Host nomatch\n", "Match host nomatch\n", "Match !host a\n", "Match user nobody-x\n", "Match originalhost b\n"])
def test_match_exec_after_a_failed_criterion_is_never_reached(tmp_path, prefix):
    """As OpenSSH: exec is not run once an earlier criterion failed, and an inactive block's is never run."""
    marker = tmp_path / "ran"
    config = tmp_path / "ssh_config"
    line = prefix.strip() + f" exec \"touch {marker}\"\n" if prefix.startswith("Match") else \
        prefix + f"Match host nomatch exec \"touch {marker}\"\n"
    config.write_text(line + "  User u\n")
    settings = SSHSettings(config_file=str(config))
    resolve_endpoint(Host(name="h", address="a"), settings, load_ssh_config(settings))
    assert not marker.exists()


def test_plan_refusing_match_exec_runs_nothing_and_exits_3(tmp_path, capsys):
    from deploy.cli.main import main
    from tests.hostile.test_config_corpus import BASE, dump

    marker = tmp_path / "ran"
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Match exec \"touch {marker}\"\n  User u\n")
    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE | {"ssh": BASE["ssh"] | {"config_file": str(ssh_config)}}))
    code = main(["-c", str(config), "plan"])
    captured = capsys.readouterr()
    assert code == 3, captured.out + captured.err
    assert "Match exec" in captured.out + captured.err and not marker.exists()


def test_relative_include_is_under_home_ssh(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    (home / ".ssh" / "conf.d" / "a.conf").write_text("Host a\n  Port 2201\n")
    monkeypatch.setenv("HOME", str(home))
    config = home / ".ssh" / "config"
    config.write_text("Host a\n  Include conf.d/*.conf\n")
    settings = SSHSettings(config_file=str(config))
    assert resolve_endpoint(Host(name="h", address="a"), settings, load_ssh_config(settings)).port.value == 2201
