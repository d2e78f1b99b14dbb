"""Where each SSH setting of a host comes from: the YAML, the user's ssh_config, or a default.

A pure function (:func:`resolve_endpoint`) turns a YAML :class:`Host`, the YAML
:class:`SSHSettings` and the evaluated ssh_config (:class:`SSHConfigSource`) into a :class:`Endpoint`: the address,
user, port, keys, host key policy and jump hosts deployctl will use, each value tagged with its
source, so ``deployctl plan`` and ``gpu-status --json`` can show why a host is reached the way it
is. No file is read and nothing connects here (``load_ssh_config`` is the one reader); the
transport builds one connection per hop from an Endpoint.

Evaluating ssh_config is deploy/ssh/config_eval.py's, which follows OpenSSH's readconf.c (Host/
Match blocks, Include scoped to its block, first value wins, tokens) and refuses what it cannot
honour (``Match exec``, ``CanonicalizeHostname yes``); a generated test compares it with ``ssh -G``. Precedence follows the issue: a value set in the YAML wins over ssh_config,
ssh_config wins over deployctl's default. "Set in the YAML" means the key is present in the file
(pydantic's ``model_fields_set``), not that it differs from the default.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from deploy.config.models import Host, SSHSettings
from deploy.base.errors import ConfigError
from deploy.base.limits import InputTooLarge, read_bounded
from deploy.ssh.config_eval import OpenSSHConfig, expand_tokens, path_tokens

Source = Literal["yaml", "ssh_config", "default"]
T = TypeVar("T")

DEFAULT_SSH_CONFIG = "~/.ssh/config"
#: OpenSSH's default GlobalKnownHostsFile (pathnames.h _PATH_SSH_SYSTEM_HOSTFILE, _PATH_SSH_SYSTEM_HOSTFILE2)
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
#: A chain longer than this is a loop in ssh_config (a ProxyJump b, b ProxyJump a) or a mistake.
MAX_JUMP_HOPS = 8


@dataclass(frozen=True)
class Setting(Generic[T]):
    value: T
    source: Source

    def to_dict(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"value": value, "source": self.source}


@dataclass(frozen=True)
class Endpoint:
    """One SSH hop, fully resolved. ``jumps`` are the hops before it, outermost first."""

    #: what the YAML or ProxyJump called it (the name looked up in ssh_config)
    alias: str
    #: "target" for the host itself, "jump host" for a ProxyJump hop
    role: str
    hostname: Setting[str]
    user: Setting[str]
    port: Setting[int]
    identity_files: Setting[tuple[str, ...]]
    identities_only: Setting[bool]
    connect_timeout_s: Setting[float]
    known_hosts: Setting[tuple[str, ...]]
    host_key_policy: Setting[str]
    jumps: tuple[Endpoint, ...] = field(default=())
    #: OpenSSH's GlobalKnownHostsFile: read when verifying a key, never written
    global_known_hosts: Setting[tuple[str, ...]] = field(default_factory=lambda: Setting(GLOBAL_KNOWN_HOSTS, "default"))

    @property
    def label(self) -> str:
        return f"{self.role} {self.alias} ({self.user.value}@{self.hostname.value}:{self.port.value})"

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko use in known_hosts for this hop."""
        host, port = self.hostname.value, self.port.value
        return host if port == 22 else f"[{host}]:{port}"

    def chain_key(self) -> tuple:
        """Identity of this hop *and the path to it*: two targets share a jump connection when
        their chains up to it are equal (same address, user, port, keys, policy, earlier hops)."""
        return tuple(
            (j.hostname.value, j.port.value, j.user.value, j.identity_files.value,
             j.identities_only.value, j.known_hosts.value, j.global_known_hosts.value, j.host_key_policy.value,
             j.connect_timeout_s.value)
            for j in (*self.jumps, self)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "hostname": self.hostname.to_dict(),
            "user": self.user.to_dict(),
            "port": self.port.to_dict(),
            "identity_files": self.identity_files.to_dict(),
            "identities_only": self.identities_only.to_dict(),
            "connect_timeout_s": self.connect_timeout_s.to_dict(),
            "known_hosts": self.known_hosts.to_dict(),
            "global_known_hosts": self.global_known_hosts.to_dict(),
            "host_key_policy": self.host_key_policy.to_dict(),
            "jumps": [j.to_dict() | {"role": j.role} for j in self.jumps],
        }


@dataclass(frozen=True)
class SSHConfigSource:
    """A parsed ssh_config and where it came from (``path`` None: none is used)."""

    #: deploy/ssh/config_eval.OpenSSHConfig (or anything with its ``lookup(alias) -> dict``)
    config: Any
    path: str | None


def ssh_config_path(ssh: SSHSettings) -> str | None:
    """The ssh_config file to read: the YAML's, else ~/.ssh/config when it exists; None for none."""
    if ssh.config_file is not None:
        if ssh.config_file == "none":
            return None
        return os.path.expanduser(ssh.config_file)
    default = os.path.expanduser(DEFAULT_SSH_CONFIG)
    return default if os.path.isfile(default) else None


#: an ssh_config (with its Includes) is a few KB; OpenSSH itself refuses lines over 4 KB
MAX_SSH_CONFIG_BYTES = 1 << 20


def read_ssh_config_file(path: str, label: str) -> str:
    """The text of one ssh_config file: a regular file, at most MAX_SSH_CONFIG_BYTES, UTF-8.

    Non-blocking and bounded (deploy/base/limits.py): ``/dev/zero`` took 6 GB in 15 s and a FIFO hung.
    Every failure is a ConfigError (exit 3) naming the file.
    """
    try:
        data = read_bounded(Path(path), MAX_SSH_CONFIG_BYTES)
    except InputTooLarge as exc:
        raise ConfigError(f"{label}: refused: {exc} (an ssh_config is a few KB)") from None
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read: {exc.strerror or exc}") from None
    if b"\0" in data:
        # OpenSSH reads lines with getline and C strings: a NUL silently ends the line there, so
        # what it would use is not what the file shows (issue 31)
        at = data.index(b"\0")
        line = data.count(b"\n", 0, at) + 1
        raise ConfigError(f"{label}:{line}: a NUL byte (byte {at}); an ssh_config is text") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{label}: not UTF-8 text (byte {exc.start})") from None


def load_ssh_config(ssh: SSHSettings) -> SSHConfigSource:
    """Read the ssh_config named by the settings (deploy/ssh/config_eval.py evaluates it). Errors name the file."""
    path = ssh_config_path(ssh)
    if path is None:
        return SSHConfigSource(OpenSSHConfig.from_text("", "(no ssh_config)"), None)
    if not os.path.lexists(path):
        raise ConfigError(f"ssh.config_file: {path} does not exist (use `none` to ignore ssh_config)")
    text = read_ssh_config_file(path, f"ssh.config_file: {path}")
    config = OpenSSHConfig.from_text(text, path, read=read_ssh_config_file)
    config.preload()  # every Include read now (bounded, loops refused), whichever block it is in
    return SSHConfigSource(config, path)


# --------------------------------------------------------------------------------------------
# the resolution (pure)


def _where(source: SSHConfigSource, alias: str, key: str) -> str:
    return f"{source.path or 'ssh_config'}: Host {alias}: {key}"


def _port(raw: str, source: SSHConfigSource, alias: str, key: str = "Port") -> int:
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ConfigError(f"{_where(source, alias, key)} is {raw!r}; expected a port number 1-65535")
    return port


def _yes_no(raw: str, source: SSHConfigSource, alias: str, key: str) -> bool:
    value = raw.lower()
    if value not in ("yes", "no", "true", "false"):
        raise ConfigError(f"{_where(source, alias, key)} is {raw!r}; expected yes or no")
    return value in ("yes", "true")


def _host_key_policy(ssh: SSHSettings, options: dict, source: SSHConfigSource, alias: str) -> Setting[str]:
    if "host_key_policy" in ssh.model_fields_set:
        return Setting(ssh.host_key_policy, "yaml")
    raw = options.get("stricthostkeychecking")
    if raw is None:
        return Setting(ssh.host_key_policy, "default")
    value = raw.lower()
    # ``ask`` (OpenSSH's default) would prompt; deployctl never prompts, so it is ``yes``.
    if value in ("yes", "true", "ask"):
        return Setting("reject", "ssh_config")
    if value == "accept-new":
        return Setting("accept-new", "ssh_config")
    if value in ("no", "off", "false"):
        raise ConfigError(
            f"{_where(source, alias, 'StrictHostKeyChecking')} is {raw!r}: deployctl does not "
            "connect without checking host keys (anyone on the path could impersonate the host and "
            "receive the deploy's commands and tokens). Set ssh.host_key_policy in the YAML "
            "(reject or accept-new) to override ssh_config explicitly"
        )
    raise ConfigError(f"{_where(source, alias, 'StrictHostKeyChecking')} is {raw!r}; "
                      "expected yes, ask, accept-new or no")


def _refuse_unsupported(options: dict, source: SSHConfigSource, alias: str) -> None:
    """ssh_config options that change where or how OpenSSH connects and deployctl cannot honour.

    Ignoring them would connect somewhere else than ``ssh`` does (ProxyCommand: directly instead
    of through the command), check the wrong known_hosts name (HostKeyAlias) or use another agent
    (IdentityAgent): refused with the way out instead.
    """
    command = options.get("proxycommand")
    if command is not None and command.lower() != "none":
        raise ConfigError(f"{_where(source, alias, 'ProxyCommand')}: not supported by deployctl "
                          "(it would connect directly instead); use ProxyJump")
    if "hostkeyalias" in options:
        raise ConfigError(f"{_where(source, alias, 'HostKeyAlias')}: not supported by deployctl "
                          "(host keys are checked under the HostName); remove it for this host")
    agent = options.get("identityagent")
    if agent is not None and agent not in ("SSH_AUTH_SOCK", "$SSH_AUTH_SOCK"):
        wanted = os.path.expanduser(agent)
        if agent.lower() != "none" and wanted != os.environ.get("SSH_AUTH_SOCK"):
            raise ConfigError(f"{_where(source, alias, 'IdentityAgent')} is {agent!r}: deployctl "
                              f"uses the agent at $SSH_AUTH_SOCK; run it with SSH_AUTH_SOCK={wanted}")


def _common(ssh: SSHSettings, options: dict, source: SSHConfigSource, alias: str,
            tokens: dict[str, str]) -> dict[str, Setting]:
    """Settings a target and a jump host resolve the same way: timeouts, known_hosts, policy."""
    _refuse_unsupported(options, source, alias)
    if "connect_timeout_s" in ssh.model_fields_set or "connecttimeout" not in options:
        timeout = Setting(float(ssh.connect_timeout_s),
                          "yaml" if "connect_timeout_s" in ssh.model_fields_set else "default")
    else:
        raw = options["connecttimeout"]
        try:
            seconds = float(int(raw))
        except ValueError:
            seconds = 0.0
        if seconds <= 0:
            raise ConfigError(f"{_where(source, alias, 'ConnectTimeout')} is {raw!r}; expected whole seconds > 0")
        timeout = Setting(seconds, "ssh_config")
    known: Setting[tuple[str, ...]]
    if "known_hosts" in ssh.model_fields_set or "userknownhostsfile" not in options:
        known = Setting((ssh.known_hosts,), "yaml" if "known_hosts" in ssh.model_fields_set else "default")
    else:
        where = _where(source, alias, "UserKnownHostsFile")
        # "none" (readconf.c): no user file; keys are then verified against GlobalKnownHostsFile only
        files = tuple(expand_tokens(f, tokens, where, "UserKnownHostsFile")
                      for f in options["userknownhostsfile"] if f.lower() != "none")
        known = Setting(files, "ssh_config")
    global_known: Setting[tuple[str, ...]]
    if "globalknownhostsfile" in options:
        # read for verification, never written (as ssh); "none": no system file
        global_known = Setting(tuple(os.path.expanduser(f) for f in options["globalknownhostsfile"]
                                     if f.lower() != "none"), "ssh_config")
    else:
        global_known = Setting(GLOBAL_KNOWN_HOSTS, "default")
    identities_only = Setting(False, "default")
    if "identitiesonly" in options:
        identities_only = Setting(_yes_no(options["identitiesonly"], source, alias, "IdentitiesOnly"),
                                  "ssh_config")
    return {
        "connect_timeout_s": timeout,
        "known_hosts": known,
        "global_known_hosts": global_known,
        "host_key_policy": _host_key_policy(ssh, options, source, alias),
        "identities_only": identities_only,
    }


def _split_jump(spec: str, source: SSHConfigSource, alias: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` (OpenSSH's ProxyJump hop syntax) -> (user, host, port)."""
    raw = spec
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://"):]
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = _port(rest[1:], source, alias, "ProxyJump")
    elif spec.count(":") == 1:
        host, port_text = spec.split(":")
        port = _port(port_text, source, alias, "ProxyJump")
    else:
        host = spec
    if not host or not user and user is not None:
        raise ConfigError(f"{_where(source, alias, 'ProxyJump')} has hop {raw!r}; expected [user@]host[:port]")
    return user, host, port


def _jump_chain(proxyjump: str | None, ssh: SSHSettings, source: SSHConfigSource, alias: str,
                seen: tuple[str, ...]) -> tuple[Endpoint, ...]:
    """The hops of a ProxyJump value, outermost first, each with its own ssh_config settings.

    Like OpenSSH (``ssh -J a,b target`` runs ``ssh -J a b``): the first hop's own ProxyJump is
    honoured, the later hops are reached through the earlier ones.
    """
    if not proxyjump or proxyjump.lower() == "none":
        return ()
    hops: list[Endpoint] = []
    for spec in proxyjump.split(","):
        spec = spec.strip()
        user, name, port = _split_jump(spec, source, alias)
        if name in seen or len(seen) + len(hops) >= MAX_JUMP_HOPS:
            raise ConfigError(f"{_where(source, alias, 'ProxyJump')}: jump chain "
                              f"{' -> '.join((*seen, name))} loops or is longer than {MAX_JUMP_HOPS} hops")
        hop = _resolve_jump(user, name, port, ssh, source, (*seen, name), outermost=not hops)
        if hops:
            hop = _with_jumps(hop, tuple(hops))
        else:
            hops.extend(hop.jumps)
            hop = _with_jumps(hop, ())
        hops.append(hop)
    return tuple(_with_jumps(h, tuple(hops[:i])) for i, h in enumerate(hops))


def _with_jumps(endpoint: Endpoint, jumps: tuple[Endpoint, ...]) -> Endpoint:
    from dataclasses import replace

    return replace(endpoint, jumps=jumps)


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry and no $USER: OpenSSH would fail too
        return "root"


def _resolve_jump(user: str | None, name: str, port: int | None, ssh: SSHSettings,
                  source: SSHConfigSource, seen: tuple[str, ...], outermost: bool) -> Endpoint:
    options = source.config.lookup(name)
    if user is not None:
        user_s = Setting(user, "ssh_config")
    elif "user" in options:
        user_s = Setting(options["user"], "ssh_config")
    else:
        # OpenSSH logs in to a jump host as the local user unless told otherwise.
        user_s = Setting(_local_user(), "default")
    if port is not None:
        port_s = Setting(port, "ssh_config")
    elif "port" in options:
        port_s = Setting(_port(options["port"], source, name), "ssh_config")
    else:
        port_s = Setting(22, "default")
    tokens = path_tokens(name, options["hostname"], user_s.value, port_s.value)
    common = _common(ssh, options, source, name, tokens)
    files = _identity_files(options, source, name, tokens)
    jumps = _jump_chain(options.get("proxyjump"), ssh, source, name, seen) if outermost else ()
    return Endpoint(
        alias=name, role="jump host",
        # the hop's name itself came from a ProxyJump line: ssh_config either way
        hostname=Setting(options["hostname"], "ssh_config"),
        user=user_s, port=port_s,
        identity_files=Setting(files, "ssh_config" if files else "default"),
        jumps=jumps, **common,
    )


def _identity_files(options: dict, source: SSHConfigSource, alias: str, tokens: dict[str, str]) -> tuple[str, ...]:
    where = _where(source, alias, "IdentityFile")
    return tuple(expand_tokens(f, tokens, where, "IdentityFile") for f in options.get("identityfile", [])
                 if f.lower() != "none")


def resolve_endpoint(host: Host, ssh: SSHSettings, source: SSHConfigSource) -> Endpoint:
    """The effective SSH settings of ``host`` with their provenance. Pure: reads no file.

    Raises ConfigError (naming the ssh_config file, Host block and keyword) for values deployctl
    cannot honour: a bad Port, StrictHostKeyChecking no without a YAML override, a ProxyJump loop.
    """
    alias = host.address
    options = source.config.lookup(alias)
    explicit = host.model_fields_set
    # ssh lowercases the name (and so does its known_hosts lookup)
    if options["hostname"] != alias.lower():
        hostname = Setting(options["hostname"], "ssh_config")
    else:
        hostname = Setting(options["hostname"], "yaml")
    if "user" in explicit or "user" not in options:
        user = Setting(host.user, "yaml" if "user" in explicit else "default")
    else:
        user = Setting(options["user"], "ssh_config")
    if "port" in explicit or "port" not in options:
        port = Setting(host.port, "yaml" if "port" in explicit else "default")
    else:
        port = Setting(_port(options["port"], source, alias), "ssh_config")
    # %r/%p/%h are the values deployctl connects with (the YAML may override ssh_config's)
    tokens = path_tokens(alias, hostname.value, user.value, port.value)
    common = _common(ssh, options, source, alias, tokens)
    identity: Setting[tuple[str, ...]]
    if host.identity_file:
        identity = Setting((host.identity_file,), "yaml")
    elif options.get("identityfile"):
        identity = Setting(_identity_files(options, source, alias, tokens), "ssh_config")
    else:
        identity = Setting((), "default")
    jumps = _jump_chain(options.get("proxyjump"), ssh, source, alias, (alias,))
    return Endpoint(alias=alias, role="host", hostname=hostname, user=user, port=port,
                    identity_files=identity, jumps=jumps, **common)


def expand_path(path: str) -> Path:
    return Path(os.path.expanduser(path))
