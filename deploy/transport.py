"""The one module that talks SSH.

Everything else builds command strings and parses their output; it hands commands to a
:class:`HostConnection` and gets a :class:`CommandResult` back. Why this module looks the way it does:

* Host keys. Fabric's ``Connection`` installs paramiko's ``AutoAddPolicy`` and never loads
  known_hosts (fabric #1804, #2071): any key is trusted. We replace its client's policy with a
  rejecting one and load the configured known_hosts file ourselves. ``accept-new`` records an
  unknown key (like OpenSSH ``StrictHostKeyChecking=accept-new``); a changed key is always refused
  (paramiko raises ``BadHostKeyException`` before any policy is consulted).
* Timeouts. ``Connection.run(timeout=...)`` raises ``CommandTimedOut`` but with ``pty=False`` the
  remote process keeps running. Every command is therefore also wrapped in coreutils ``timeout``
  on the host, so a timed-out command does not linger there.
* ssh_config and jump hosts. The user's ``~/.ssh/config`` is resolved by deploy/ssh_config.py
  (paramiko's parser, YAML values first); each hop of a ProxyJump chain is its own fabric
  ``Connection`` used as the next one's ``gateway``, with its own keys and its own host key check.
  Jump connections are shared by all targets of a run (:class:`JumpConnections`).
* Retries. tenacity retries *connecting* (refused, timed out, banner errors), never a command:
  a command may have side effects (killing processes, launching a server).
* Held commands. ``hold`` starts a command on its own channel and leaves it running until we
  close the channel or the connection dies; the host lock hangs on it (see deploy/locks.py).
"""

from __future__ import annotations

import errno
import getpass
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from deploy import ssh_trust
from deploy.config.models import Host, SSHSettings
from deploy.errors import (DeployError, ExitCode, ConnectionFailed, HostKeyRejected, Interrupted, RemoteCommandFailed,
                           RemoteOutputError, StepTimeout)
from deploy.ssh_config import (
    Endpoint,
    SSHConfigSource,
    expand_path,
    load_ssh_config,
    resolve_endpoint,
    ssh_config_path,
)

if TYPE_CHECKING:  # fabric/paramiko are imported lazily: `deployctl --help` must stay fast.
    import fabric
    import paramiko


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class WatchResult:
    command: str
    #: None: deployctl stopped it (it had its answer)
    exit_code: int | None
    stderr: str


#: the longest line a host-side watch loop may print (deploy/bounded_channel.py)
_MAX_WATCH_LINE = 1 << 20


class ExecTimedOut(Exception):
    """Raised by a transport's ``_exec`` when its local deadline passed (mapped to StepTimeout)."""


class Transport:
    """A connection to one host, as the steps see it.

    The base class owns everything but the wire (invoke's Runner habit): ``check``, the coreutils
    ``timeout`` wrapper that bounds every command on the host itself, ``~`` resolution, and the
    mapping of failures to deployctl's errors (exit codes). A concrete transport overrides only
    ``_exec``, ``_put`` and ``_stream`` (and ``hold``, for the host lock's held channel):
    :class:`HostConnection` sends them over SSH; the tests' recording transport answers from a script.
    """

    def __init__(self, host: Host, command_timeout_s: float = 60.0) -> None:
        self.host = host
        self.command_timeout_s = command_timeout_s
        self._home: str | None = None

    @property
    def label(self) -> str:
        return _host_label(self.host)

    # -- what a concrete transport provides ---------------------------------------------------
    def _exec(self, command: str, *, timeout: float) -> tuple[int, str, str]:
        """Run the (already wrapped) ``command`` under ``sh``: (exit code, stdout, stderr).

        Raises ExecTimedOut when ``timeout`` passes locally, OSError/EOFError when the connection is lost.
        """
        raise NotImplementedError

    def _put(self, local: Path, remote: str) -> None:
        """Upload ``local`` to the absolute path ``remote``; OSError on failure."""
        raise NotImplementedError

    def _stream(self, command: str) -> int:
        """Run ``command`` printing its output as it comes, until it ends or Ctrl-C; its exit code."""
        raise NotImplementedError

    def _upload(self, directory: str, files: list[tuple[bytes, str, int]]) -> None:
        """Over one SFTP session: create ``directory`` (0700) when missing, then write each
        (content, path, mode) under a temporary name, check its size and rename it into place.
        Paths are absolute or start with ``~/`` (the session's home). OSError on failure."""
        raise NotImplementedError

    def _watch(self, command: str, on_line: Callable[[str], bool], *, timeout: float,
               cancelled: threading.Event) -> tuple[int | None, str]:
        """Run the (already wrapped) ``command``, calling ``on_line`` with each stdout line as it comes.

        Returns (exit code, stderr) when the command ends, or (None, "") once ``on_line`` returned
        True or ``cancelled`` is set: the channel is then closed (the host-side loop dies on its
        next write). Raises like ``_exec``.
        """
        raise NotImplementedError

    def hold(self, command: str, *, timeout: float | None = None) -> HeldCommand:
        raise NotImplementedError(f"{type(self).__name__} cannot hold a command open")

    # -- what the steps call ------------------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run ``command`` under ``sh`` on the host; never raises for a non-zero exit."""
        timeout = timeout or self.command_timeout_s
        wrapped = remote_timeout_wrap(command, timeout)
        started = time.monotonic()
        try:
            exit_code, stdout, stderr = self._exec(wrapped, timeout=timeout + 10)
        except ExecTimedOut:
            raise StepTimeout(
                f"{self.label}: command did not finish within {timeout:.0f} s: {command[:200]}"
            ) from None
        except (OSError, EOFError) as exc:
            raise ConnectionFailed(
                f"{self.label}: connection lost while running a command ({exc}); "
                "it was not retried because it may have had side effects"
            ) from None
        duration = time.monotonic() - started
        if exit_code == 124 and duration >= timeout - 1:
            raise StepTimeout(
                f"{self.label}: command did not finish within {timeout:.0f} s: {command[:200]}"
            )
        return CommandResult(command=command, exit_code=exit_code, stdout=stdout, stderr=stderr,
                             duration_s=duration)

    def check(self, command: str, *, timeout: float | None = None, what: str = "command") -> CommandResult:
        """Like ``run``, but a non-zero exit is a RemoteCommandFailed naming ``what``."""
        result = self.run(command, timeout=timeout)
        if not result.ok:
            detail = (result.stderr.strip() or result.stdout.strip())[-800:]
            raise RemoteCommandFailed(
                f"{self.label}: {what} failed with exit code {result.exit_code}: {detail}"
            )
        return result

    def watch(self, command: str, on_line: Callable[[str], bool], *, timeout: float,
              cancelled: threading.Event) -> WatchResult:
        """Run a host-side poll loop on one channel; ``on_line(line) -> True`` means "answered, stop".

        Bounded on the host (coreutils ``timeout``) and locally; Ctrl-C (``cancelled``) closes the
        channel at once and raises Interrupted.
        """
        wrapped = remote_timeout_wrap(command, timeout)
        try:
            exit_code, stderr = self._watch(wrapped, on_line, timeout=timeout + 10, cancelled=cancelled)
        except ExecTimedOut:
            raise StepTimeout(f"{self.label}: command did not finish within {timeout:.0f} s: {command[:200]}") from None
        except (OSError, EOFError) as exc:
            raise ConnectionFailed(f"{self.label}: connection lost while waiting on the host ({exc})") from None
        if cancelled.is_set():
            raise Interrupted(f"{self.host.name}: interrupted")
        return WatchResult(command=command, exit_code=exit_code, stderr=stderr)

    def stream(self, command: str) -> int:
        """Run a long-lived command (``tail -F``) printing its output as it comes; Ctrl-C ends it."""
        return self._stream(command)

    def put(self, local: Path, remote: str) -> None:
        """Upload to an absolute remote path (SFTP does not expand ``~``: ``resolve`` it first)."""
        if not remote.startswith("/"):
            raise ValueError(f"remote path must be absolute, got {remote!r}")
        try:
            self._put(local, remote)
        except OSError as exc:
            raise RemoteCommandFailed(
                f"{self.label}: SFTP upload of {local} to {remote} failed: {exc}"
            ) from None

    def upload(self, directory: str, files: list[tuple[bytes, str, int]]) -> None:
        """Install files on the host over SFTP (see ``_upload``); a failure is RemoteCommandFailed
        and leaves no partial file under the final name."""
        for path in [directory] + [remote for _, remote, _ in files]:
            if not (path.startswith("/") or path.startswith("~/")):
                raise ValueError(f"remote path must be absolute or start with ~/, got {path!r}")
        try:
            self._upload(directory, files)
        except OSError as exc:
            names = ", ".join(remote for _, remote, _ in files)
            # read-only, full or over quota (SFTP maps ENOSPC to a bare "Failure"): exit 10 (HOSTILE, issue 22)
            io = exc.errno in (errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS, errno.EDQUOT) or \
                str(exc).strip() in ("Failure", "Permission denied")
            raise RemoteCommandFailed(f"{self.label}: SFTP upload of {names} failed: {exc}"
                                      + (" (read-only, full or not writable)" if io else ""),
                                      exit_code=ExitCode.IO if io else None) from None

    @property
    def home(self) -> str:
        if self._home is None:
            result = self.check('printf "%s" "$HOME"', what="reading $HOME")
            home = result.stdout
            if not home.startswith("/") or "\n" in home:
                from deploy.errors import RemoteOutputError

                raise RemoteOutputError(
                    f"{self.label}: $HOME is {home!r}; expected an absolute path"
                )
            self._home = home.rstrip("/") or "/"
        return self._home

    def resolve(self, path: str) -> str:
        """Expand a leading ``~`` with the remote user's home (SFTP and quoting never do)."""
        if path == "~":
            return self.home
        if path.startswith("~/"):
            return f"{self.home}/{path[2:]}"
        return path


class HeldCommand:
    """A remote command that keeps running while its SSH channel stays open (see ``HostConnection.hold``).

    ``first_line`` is what it printed first (its answer); ``close()`` writes a farewell and EOF on
    its stdin and closes the channel; when this process dies, the kernel closes the connection and
    the command sees EOF without the farewell.
    """

    def __init__(self, channel, first_line: str, stderr: str, exit_code: int | None):
        self._channel = channel
        self.first_line = first_line
        self.stderr = stderr
        self.exit_code = exit_code

    @property
    def running(self) -> bool:
        return not self._channel.closed and not self._channel.exit_status_ready()

    def close(self, farewell: bytes = b"release\n", wait_s: float = 10.0) -> None:
        """Say ``farewell`` on its stdin (a clean release, as opposed to our death), then EOF.

        Waits (bounded) for the command to exit before closing: the lock helper removes its owner
        file and drops the flock only then, and a script's next deployctl, started the moment this
        one returns, must find the lock free (not refused with exit 9 by our own leftover).
        """
        try:
            if not self._channel.closed:
                if farewell:
                    self._channel.sendall(farewell)
                self._channel.shutdown_write()
                self._channel.status_event.wait(wait_s)
                self._channel.close()
        except Exception:  # noqa: BLE001 - best effort: a dead channel has released the lock already
            pass


def remote_timeout_wrap(command: str, timeout_s: float) -> str:
    """Bound a command on the host itself: SIGTERM at the deadline, SIGKILL 5 s later."""
    seconds = max(1, int(timeout_s + 0.999))
    return f"timeout --kill-after=5 {seconds} sh -c {shlex.quote(command)}"


def _host_label(host: Host) -> str:
    return f"{host.name} ({host.user}@{host.address}:{host.port})"


_config_cache: dict[tuple, SSHConfigSource] = {}
_config_lock = threading.Lock()


def cached_ssh_config(ssh: SSHSettings) -> SSHConfigSource:
    """The ssh_config of these settings, parsed once per file version (hosts share it)."""
    path = ssh_config_path(ssh)
    try:
        stat = os.stat(path) if path else None
    except OSError:
        stat = None
    key = (path, stat.st_mtime_ns if stat else None, stat.st_size if stat else None)
    with _config_lock:
        if key not in _config_cache:
            _config_cache[key] = load_ssh_config(ssh)
        return _config_cache[key]


def describe_endpoints(hosts, ssh: SSHSettings) -> dict[str, dict]:
    """Per host name: the effective SSH settings and their sources, or the error resolving them."""
    out: dict[str, dict] = {}
    for host in hosts:
        try:
            out[host.name] = resolve_endpoint(host, ssh, cached_ssh_config(ssh)).to_dict()
        except DeployError as exc:
            out[host.name] = {"error": str(exc), "exit_code": int(exc.exit_code)}
    return out


# -- one hop: host key policy, keys, the fabric Connection ----------------------------------------


def known_hosts_files(hop: Endpoint) -> tuple[list[Path], list[Path]]:
    """(every known_hosts file of the hop, those that exist)."""
    files = [expand_path(f) for f in hop.known_hosts.value]
    return files, [f for f in files if f.exists()]


def apply_host_key_policy(client: paramiko.SSHClient, hop: Endpoint, label: str) -> None:
    """Load the hop's known_hosts files and install the hop's policy for unknown keys.

    A changed key never reaches a policy: paramiko raises BadHostKeyException first. Jump hosts go
    through here exactly like targets (their own UserKnownHostsFile / StrictHostKeyChecking).
    The files are read by deploy/ssh_trust.py, not client.load_host_keys: paramiko misreads
    OpenSSH's @revoked/@cert-authority lines.
    """
    files, present = known_hosts_files(hop)
    if not present and hop.host_key_policy.value == "reject":
        raise HostKeyRejected(
            f"known_hosts file {', '.join(map(str, files))} does not exist; host keys cannot be "
            "verified (set ssh.known_hosts, or use accept-new once)"
        )
    known = ssh_trust.load_known_hosts_files(present) if present else None
    if known is not None:
        client._host_keys = known.host_keys  # type: ignore[attr-defined]  # what SSHClient.connect looks keys up in
    reject, accept_new = ssh_trust.make_policies(known, files[0], label)
    if hop.host_key_policy.value == "accept-new":
        client.set_missing_host_key_policy(accept_new())
    else:
        client.set_missing_host_key_policy(reject())


_passphrases: dict[str, str] = {}
_passphrase_lock = threading.Lock()


def _public_blob(key_file: Path) -> bytes | None:
    """The public key of a private key file, from the ``.pub`` beside it (None when absent)."""
    import base64
    import binascii

    try:
        fields = key_file.with_name(key_file.name + ".pub").read_text().split()
        return base64.b64decode(fields[1], validate=True) if len(fields) >= 2 else None
    except (OSError, UnicodeDecodeError, binascii.Error):
        return None


def _agent_keys() -> list:
    """Keys of the ssh-agent at $SSH_AUTH_SOCK (none when no agent runs).

    The agent connection stays open (closed when the keys are garbage-collected): an AgentKey
    signs through it during authentication. One connection per call, never shared between
    threads: the agent protocol has no request ids, concurrent signatures would interleave.
    """
    if not os.environ.get("SSH_AUTH_SOCK"):
        return []
    from deploy.ssh_agent import timed_agent

    return list(timed_agent().get_keys())


def auth_kwargs(hop: Endpoint, label: str) -> dict:
    """paramiko connect() keyword arguments for the hop's identities and ssh-agent.

    No identity file (YAML or ssh_config): the agent's keys, then ~/.ssh/id_* (as OpenSSH).
    With identity files: those files; agent keys too unless IdentitiesOnly. A passphrase-protected
    file is used through the agent when the agent holds it, asked for on a terminal, and otherwise
    refused with a clear error: a cron job must never hang on a prompt nobody sees.
    """
    import paramiko

    from deploy.ssh_agent import check_agent_answers

    check_agent_answers()  # HOSTILE (issue 22): an agent that never answers
    files = [expand_path(f) for f in hop.identity_files.value]
    if not files:
        return {"allow_agent": True, "look_for_keys": True}
    if hop.identity_files.source == "yaml":
        for key_file in files:  # missing, not a regular file, or readable by group/others: refused
            ssh_trust.check_private_key_file(key_file, label)
    existing = [f for f in files if f.is_file()]
    for key_file in existing:
        ssh_trust.check_private_key_file(key_file, label)  # OpenSSH refuses group/other-readable keys
    if not existing:
        # OpenSSH skips IdentityFile entries that do not exist; so do we.
        return {"allow_agent": True, "look_for_keys": not hop.identities_only.value}
    kwargs: dict = {"look_for_keys": False, "allow_agent": not hop.identities_only.value}
    usable: list[str] = []
    agent_keys = None
    for key_file in existing:
        try:
            paramiko.PKey.from_path(key_file)
            usable.append(str(key_file))
            continue
        except (paramiko.PasswordRequiredException, TypeError):
            # an encrypted PEM key raises the former; an encrypted OpenSSH-format key the latter
            # (cryptography's "Key is password-protected, but password was not provided").
            pass
        except (paramiko.SSHException, ValueError, OSError) as exc:
            raise ConnectionFailed(f"{label}: identity file {key_file} is not a private key "
                                   f"deployctl can read: {exc}") from None
        if agent_keys is None:
            agent_keys = _agent_keys()
        blob = _public_blob(key_file)
        in_agent = [k for k in agent_keys if blob is not None and k.asbytes() == blob]
        if in_agent:
            kwargs["pkey"] = in_agent[0]
            continue
        if sys.stdin is not None and sys.stdin.isatty():
            with _passphrase_lock:
                if str(key_file) not in _passphrases:
                    _passphrases[str(key_file)] = getpass.getpass(f"Passphrase for {key_file}: ")
            kwargs["passphrase"] = _passphrases[str(key_file)]
            usable.append(str(key_file))
            continue
        if agent_keys and blob is None and not hop.identities_only.value:
            continue  # no .pub to compare with: let the agent's keys try
        raise ConnectionFailed(
            f"{label}: identity file {key_file} is protected by a passphrase and stdin is not a "
            "terminal, so deployctl does not ask for it; load it into ssh-agent "
            f"(`ssh-add {key_file}`, with SSH_AUTH_SOCK set for deployctl) or use a key without "
            "a passphrase"
        )
    if usable:
        kwargs["key_filename"] = usable
    elif "pkey" not in kwargs:
        kwargs["allow_agent"] = True  # only the agent's keys are left to try
    return kwargs


_hop_class = None


def _hop_connection_class():
    """fabric.Connection whose gateway channel honours the connect timeout.

    fabric 3.2's ``open_gateway`` opens the direct-tcpip channel without a timeout, and paramiko's
    default is an hour: a target the jump host cannot reach would hang the run.
    """
    global _hop_class
    if _hop_class is None:
        import fabric

        class HopConnection(fabric.Connection):
            def open_gateway(self):
                self.gateway.open()
                return self.gateway.transport.open_channel(
                    kind="direct-tcpip", dest_addr=(self.host, int(self.port)), src_addr=("", 0),
                    timeout=self.connect_timeout,
                )

        _hop_class = HopConnection
    return _hop_class


def build_hop_connection(hop: Endpoint, gateway: fabric.Connection | None, label: str) -> fabric.Connection:
    """An unopened fabric Connection for one hop, through ``gateway`` (the previous hop) if any."""
    import fabric

    timeout = hop.connect_timeout_s.value
    connect_kwargs: dict = {
        "banner_timeout": timeout,
        "auth_timeout": timeout,
        "channel_timeout": timeout,
        **auth_kwargs(hop, label),
    }
    # fabric's own ssh_config loading stays off: deployctl resolved the settings itself
    # (deploy/ssh_config.py) and fabric would apply ProxyJump without any host key check.
    config = fabric.Config(overrides={"load_ssh_configs": False})
    conn = _hop_connection_class()(
        hop.hostname.value, user=hop.user.value, port=hop.port.value, config=config,
        connect_timeout=timeout, connect_kwargs=connect_kwargs, gateway=gateway,
    )
    apply_host_key_policy(conn.client, hop, label)
    return conn


def _transient(exc: BaseException) -> bool:
    import paramiko

    if isinstance(exc, (HostKeyRejected, ConnectionFailed, paramiko.BadHostKeyException,
                        paramiko.AuthenticationException)):
        return False
    return isinstance(
        exc,
        (socket.timeout, TimeoutError, ConnectionError, EOFError,
         paramiko.ssh_exception.NoValidConnectionsError, paramiko.SSHException),
    )


def open_hop(hop: Endpoint, gateway: fabric.Connection | None, retries: int, label: str) -> fabric.Connection:
    """Connect one hop (retrying refused/timed-out connects); errors are DeployErrors naming ``label``."""
    import paramiko
    from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

    @retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(retries + 1),
           wait=wait_exponential(multiplier=0.5, max=5), reraise=True)
    def attempt() -> fabric.Connection:
        conn = build_hop_connection(hop, gateway, label)
        try:
            conn.open()
        except BaseException:
            conn.close()
            raise
        return conn

    try:
        return attempt()
    except ConnectionFailed as exc:
        text = str(exc)
        if text.startswith(label):
            raise
        raise type(exc)(f"{label}: {text}") from None
    except paramiko.PasswordRequiredException as exc:
        raise ConnectionFailed(f"{label}: authentication failed: {exc} (load the key into ssh-agent)") from None
    except paramiko.BadHostKeyException as exc:
        present = known_hosts_files(hop)[1]
        known = ssh_trust.load_known_hosts_files(present) if present else None
        if known is not None and known.revoked_for(exc.hostname, exc.key):
            raise HostKeyRejected(ssh_trust.revoked_message(label, exc.hostname, exc.key, known.path)) from None
        raise HostKeyRejected(
            f"{label}: REMOTE HOST KEY CHANGED: got {exc.key.get_name()} {exc.key.fingerprint}, "
            f"known_hosts has {exc.expected_key.fingerprint}. Refusing to connect (possible "
            "man-in-the-middle, or the host was reinstalled: remove the old key to proceed)"
        ) from None
    except paramiko.AuthenticationException as exc:
        raise ConnectionFailed(f"{label}: authentication failed: {exc}") from None
    except socket.gaierror as exc:
        raise ConnectionFailed(f"{label}: cannot resolve address: {exc}") from None
    except paramiko.ChannelException as exc:
        raise ConnectionFailed(f"{label}: the jump host could not open a channel to it: {exc}") from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise ConnectionFailed(f"{label}: cannot connect: {exc or type(exc).__name__}") from None


def _hop_label(hop: Endpoint) -> str:
    return f"{hop.role} {hop.alias} ({hop.user.value}@{hop.hostname.value}:{hop.port.value})"


class JumpConnections:
    """Jump-host connections shared by all targets of one run: one per distinct hop chain.

    Targets behind the same bastion each get a direct-tcpip channel on the ONE connection to it
    (paramiko's Transport multiplexes channels and is thread-safe), so 8 hosts behind a bastion
    cost the bastion one login, not 8. A jump host that failed is not retried by the next target
    of the same run: every target gets the same error.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hop_locks: dict[tuple, threading.Lock] = {}
        self._conns: dict[tuple, fabric.Connection] = {}
        self._failures: dict[tuple, ConnectionFailed] = {}
        self._order: list[tuple] = []

    def gateway_for(self, endpoint: Endpoint, retries: int) -> fabric.Connection | None:
        """The open connection to the last jump hop before ``endpoint`` (None: direct)."""
        return self._open(endpoint.jumps[-1], retries) if endpoint.jumps else None

    def _open(self, hop: Endpoint, retries: int) -> fabric.Connection:
        key = hop.chain_key()
        with self._lock:
            lock = self._hop_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._failures:
                raise self._failures[key]
            conn = self._conns.get(key)
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:
                conn.close()  # dropped: reconnect, between commands only
            gateway = self._open(hop.jumps[-1], retries) if hop.jumps else None
            try:
                conn = open_hop(hop, gateway, retries, _hop_label(hop))
            except ConnectionFailed as exc:
                self._failures[key] = exc
                raise
            self._conns[key] = conn
            if key not in self._order:
                self._order.append(key)
            return conn

    def close(self) -> None:
        with self._lock:
            for key in reversed(self._order):  # innermost hops first
                self._conns.pop(key).close()
            self._order.clear()

    def __enter__(self) -> JumpConnections:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HostConnection(Transport):
    """One SSH connection to one host, reused by every step of a command.

    ``jumps`` is the run's shared :class:`JumpConnections`; without one the connection keeps its
    own (closed with it).
    """

    def __init__(self, host: Host, ssh: SSHSettings, jumps: JumpConnections | None = None,
                 ssh_config: SSHConfigSource | None = None):
        super().__init__(host, ssh.command_timeout_s)
        self.ssh = ssh
        self._conn: fabric.Connection | None = None
        self._own_jumps = jumps is None
        self._jumps = jumps if jumps is not None else JumpConnections()
        self._ssh_config = ssh_config
        self._endpoint: Endpoint | None = None

    # -- connecting -------------------------------------------------------------------------
    @property
    def endpoint(self) -> Endpoint:
        """The effective SSH settings of this host (YAML over ssh_config over defaults)."""
        if self._endpoint is None:
            source = self._ssh_config or cached_ssh_config(self.ssh)
            self._endpoint = resolve_endpoint(self.host, self.ssh, source)
        return self._endpoint

    @property
    def label(self) -> str:
        try:
            ep = self.endpoint
        except DeployError:
            return _host_label(self.host)
        via = f" via {', '.join(j.alias for j in ep.jumps)}" if ep.jumps else ""
        return f"{self.host.name} ({ep.user.value}@{ep.hostname.value}:{ep.port.value}{via})"

    def connect(self) -> None:
        endpoint = self.endpoint
        label = self.label
        try:
            gateway = self._jumps.gateway_for(endpoint, self.ssh.connect_retries)
        except ConnectionFailed as exc:
            raise type(exc)(f"{self.host.name}: {exc}") from None
        self._conn = open_hop(endpoint, gateway, self.ssh.connect_retries, label)

    def _live(self) -> fabric.Connection:
        transport = self._conn.client.get_transport() if self._conn else None
        if transport is None or not transport.is_active():
            # Reconnect only *between* commands; a command is never re-sent.
            if self._conn is not None:
                self._conn.close()
            self.connect()
        assert self._conn is not None
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._own_jumps:
            self._jumps.close()

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the wire ---------------------------------------------------------------------------
    def _exec(self, command: str, *, timeout: float) -> tuple[int, str, str]:
        # HOSTILE (issue 22): one channel read within a byte limit (deploy/bounded_channel.py),
        # not fabric's run(hide=True), which kept a 60 MB nvidia-smi answer whole in memory.
        import paramiko

        from deploy import bounded_channel

        try:
            channel = self._live().client.get_transport().open_session(timeout=self.ssh.connect_timeout_s)
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        try:
            status, out, err = bounded_channel.exec_bounded(channel, command, deadline=time.monotonic() + timeout)
        except bounded_channel.DeadlinePassed:
            raise ExecTimedOut(command) from None
        except bounded_channel.OutputTooLarge as exc:
            raise RemoteOutputError(f"{self.label}: refused the answer of {command[:200]!r}: it {exc} "
                                    "(every answer deployctl reads is far smaller)") from None
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        finally:
            channel.close()
        return status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def _stream(self, command: str) -> int:
        """A pty, so fabric's Ctrl-C handling (it writes ``\x03`` to the channel) reaches the remote
        command as SIGINT; without one the remote tail never hears it and the call never returns."""
        from deploy.terminal import SafeStream

        # the log is printed with its control characters escaped (HOSTILE, issue 22)
        result = self._live().run(command, hide=False, warn=True, in_stream=False, pty=True,
                                  out_stream=SafeStream(sys.stdout), err_stream=SafeStream(sys.stderr))
        return result.exited

    def _watch(self, command: str, on_line: Callable[[str], bool], *, timeout: float,
               cancelled: threading.Event) -> tuple[int | None, str]:
        import paramiko

        deadline = time.monotonic() + timeout
        try:
            channel = self._live().client.get_transport().open_session(timeout=self.ssh.connect_timeout_s)
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        try:
            # short reads, so Ctrl-C and the local deadline are noticed within 0.1 s
            channel.settimeout(0.1)
            channel.exec_command(command)
            pending = line = b""
            while True:
                if cancelled.is_set():
                    self._end_watch(channel, wait_s=0.5)
                    return None, ""
                if time.monotonic() > deadline:
                    raise ExecTimedOut(command)
                try:
                    chunk = channel.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if len(line) > _MAX_WATCH_LINE:
                        break
                    if on_line(line.decode("utf-8", "replace")):
                        self._end_watch(channel)
                        return None, ""
                if len(pending) > _MAX_WATCH_LINE or len(line) > _MAX_WATCH_LINE:  # HOSTILE (issue 22)
                    raise RemoteOutputError(f"{self.label}: a host-side loop printed a line of more than "
                                            f"{_MAX_WATCH_LINE} bytes: {bytes(max(line, pending, key=len)[:120])!r}")
            if pending.strip() and on_line(pending.decode("utf-8", "replace")):
                return None, ""
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise ExecTimedOut(command)
            stderr = b""
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
            return channel.recv_exit_status(), stderr.decode("utf-8", "replace")
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        finally:
            channel.close()

    @staticmethod
    def _end_watch(channel, wait_s: float = 3.0) -> None:
        """EOF on the loop's stdin (it stops at once, ``--until-stdin-eof``), then wait (bounded) for its
        exit, so no host-side poller outlives the step that started it."""
        try:
            channel.shutdown_write()
            channel.status_event.wait(wait_s)
        except Exception:  # noqa: BLE001 - a dead channel has no poller left to stop
            pass

    def hold(self, command: str, *, timeout: float | None = None) -> HeldCommand:
        """Start ``command`` on its own channel and return once it printed its first line.

        The command keeps running, with its stdin open, until ``close()`` or until the SSH
        connection dies (deployctl exits or is killed, the network drops the TCP session): sshd
        then closes the pipe and the command reads EOF. Host-side locks hang on this, so a lock
        can never outlive the deployctl that took it. Not wrapped in coreutils ``timeout``: its
        lifetime is the channel's; only the wait for the first line is bounded.
        """
        import paramiko

        timeout = timeout or self.ssh.command_timeout_s
        label = _host_label(self.host)
        try:
            transport = self._live().client.get_transport()
            channel = transport.open_session(timeout=self.ssh.connect_timeout_s)
            channel.settimeout(timeout)
            channel.exec_command(command)
            data = b""
            while b"\n" not in data and len(data) < 1 << 20:
                chunk = channel.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            raise StepTimeout(f"{label}: no answer within {timeout:.0f} s from: {command[:200]}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionFailed(f"{label}: connection lost while starting a held command ({exc})") from None
        line = data.split(b"\n", 1)[0].decode("utf-8", "replace")
        stderr, exit_code = "", None
        if b"\n" not in data:  # it ended without answering: collect why
            try:
                exit_code = channel.recv_exit_status()
                while channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(65536).decode("utf-8", "replace")
            except (OSError, EOFError, paramiko.SSHException):
                pass
            channel.close()
        return HeldCommand(channel, line, stderr, exit_code)

    def _upload(self, directory: str, files: list[tuple[bytes, str, int]]) -> None:
        import io
        import stat as stat_module

        import paramiko

        try:
            sftp = self._live().sftp()
            if self._home is None:
                self._home = (sftp.normalize(".").rstrip("/") or "/")

            def absolute(path: str) -> str:
                return f"{self._home}/{path[2:]}" if path.startswith("~/") else path

            target = absolute(directory).rstrip("/") or "/"
            parts = [p for p in target.split("/") if p]
            for depth in range(1, len(parts) + 1):
                path = "/" + "/".join(parts[:depth])
                try:
                    if not stat_module.S_ISDIR(sftp.stat(path).st_mode or 0):
                        raise NotADirectoryError(f"{path} exists and is not a directory")
                except FileNotFoundError:
                    sftp.mkdir(path, 0o700)
            for content, remote, mode in files:
                final = absolute(remote)
                temporary = final + ".upload"
                try:
                    with sftp.open(temporary, "wb") as handle:
                        handle.chmod(mode)  # before any byte is written: a secret is never world-readable
                        handle.set_pipelined(True)
                        handle.write(content)
                    size = sftp.stat(temporary).st_size
                    if size != len(content):
                        raise OSError(f"{temporary}: {size} bytes written of {len(content)}")
                    sftp.posix_rename(temporary, final)
                except (OSError, paramiko.SSHException):
                    try:
                        sftp.remove(temporary)
                    except (OSError, paramiko.SSHException):
                        pass
                    raise
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc

    def _put(self, local: Path, remote: str) -> None:
        """Upload over SFTP to an absolute remote path."""
        import paramiko

        conn = self._live()
        try:
            conn.put(str(local), remote=remote)
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
