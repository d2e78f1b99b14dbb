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
* Retries. tenacity retries *connecting* (refused, timed out, banner errors), never a command:
  a command may have side effects (killing processes, launching a server).
* Held commands. ``hold`` starts a command on its own channel and leaves it running until we
  close the channel or the connection dies; the host lock hangs on it (see deploy/locks.py).
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from deploy.config.models import Host, SSHSettings
from deploy.errors import ConnectionFailed, HostKeyRejected, RemoteCommandFailed, StepTimeout

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


class Transport(Protocol):
    """What steps need from a host connection (tests may hand in another implementation)."""

    host: Host

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...

    def stream(self, command: str) -> int:
        """Run a long-lived command (``tail -F``) printing its output as it comes; Ctrl-C ends it.

        A pty, so fabric's Ctrl-C handling (it writes ``\x03`` to the channel) reaches the remote
        command as SIGINT; without one the remote tail never hears it and the call never returns.
        """
        result = self._live().run(command, hide=False, warn=True, in_stream=False, pty=True)
        return result.exited

    def put(self, local: Path, remote: str) -> None: ...

    def hold(self, command: str, *, timeout: float | None = None) -> "HeldCommand": ...

    def resolve(self, path: str) -> str: ...


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

    def close(self, farewell: bytes = b"release\n") -> None:
        """Say ``farewell`` on its stdin (a clean release, as opposed to our death), then EOF."""
        try:
            if not self._channel.closed:
                if farewell:
                    self._channel.sendall(farewell)
                self._channel.shutdown_write()
                self._channel.close()
        except Exception:  # noqa: BLE001 - best effort: a dead channel has released the lock already
            pass


def remote_timeout_wrap(command: str, timeout_s: float) -> str:
    """Bound a command on the host itself: SIGTERM at the deadline, SIGKILL 5 s later."""
    seconds = max(1, int(timeout_s + 0.999))
    return f"timeout --kill-after=5 {seconds} sh -c {shlex.quote(command)}"


def _host_label(host: Host) -> str:
    return f"{host.name} ({host.user}@{host.address}:{host.port})"


def known_hosts_name(host: Host) -> str:
    """The name OpenSSH and paramiko use in known_hosts for this host."""
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def _make_policies():
    import paramiko

    class RejectUnknownHost(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            raise HostKeyRejected(
                f"host key for {hostname} is not in known_hosts "
                f"({key.get_name()} {key.fingerprint}); verify it and add it, "
                "or set ssh.host_key_policy: accept-new (or --accept-new-host-keys) to record it"
            )

    class AcceptNewHost(paramiko.MissingHostKeyPolicy):
        def __init__(self, known_hosts: Path):
            self.known_hosts = known_hosts

        def missing_host_key(self, client, hostname, key):
            client.get_host_keys().add(hostname, key.get_name(), key)
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    return RejectUnknownHost, AcceptNewHost


class HostConnection:
    """One SSH connection to one host, reused by every step of a command."""

    def __init__(self, host: Host, ssh: SSHSettings):
        self.host = host
        self.ssh = ssh
        self._conn: fabric.Connection | None = None
        self._home: str | None = None

    # -- connecting -------------------------------------------------------------------------
    def _new_connection(self) -> fabric.Connection:
        import fabric

        known_hosts = Path(os.path.expanduser(self.ssh.known_hosts))
        config = fabric.Config(overrides={"load_ssh_configs": False})
        connect_kwargs: dict = {
            "banner_timeout": self.ssh.connect_timeout_s,
            "auth_timeout": self.ssh.connect_timeout_s,
            "channel_timeout": self.ssh.connect_timeout_s,
        }
        if self.host.identity_file:
            key = Path(os.path.expanduser(self.host.identity_file))
            if not key.is_file():
                raise ConnectionFailed(f"{_host_label(self.host)}: identity_file {key} does not exist")
            connect_kwargs["key_filename"] = str(key)
            connect_kwargs["look_for_keys"] = False
        conn = fabric.Connection(
            self.host.address,
            user=self.host.user,
            port=self.host.port,
            config=config,
            connect_timeout=self.ssh.connect_timeout_s,
            connect_kwargs=connect_kwargs,
        )
        reject, accept_new = _make_policies()
        client = conn.client
        if known_hosts.exists():
            try:
                client.load_host_keys(str(known_hosts))
            except (OSError, UnicodeDecodeError) as exc:
                raise ConnectionFailed(f"cannot read known_hosts file {known_hosts}: {exc}") from None
        elif self.ssh.host_key_policy == "reject":
            raise HostKeyRejected(
                f"{_host_label(self.host)}: known_hosts file {known_hosts} does not exist; "
                "host keys cannot be verified (set ssh.known_hosts, or use accept-new once)"
            )
        if self.ssh.host_key_policy == "accept-new":
            client.set_missing_host_key_policy(accept_new(known_hosts))
        else:
            client.set_missing_host_key_policy(reject())
        return conn

    def connect(self) -> None:
        import paramiko
        from tenacity import (
            retry,
            retry_if_exception,
            stop_after_attempt,
            wait_exponential,
        )

        def transient(exc: BaseException) -> bool:
            if isinstance(exc, (HostKeyRejected, paramiko.BadHostKeyException, paramiko.AuthenticationException)):
                return False
            return isinstance(
                exc,
                (socket.timeout, TimeoutError, ConnectionError, EOFError,
                 paramiko.ssh_exception.NoValidConnectionsError, paramiko.SSHException),
            )

        @retry(
            retry=retry_if_exception(transient),
            stop=stop_after_attempt(self.ssh.connect_retries + 1),
            wait=wait_exponential(multiplier=0.5, max=5),
            reraise=True,
        )
        def attempt() -> fabric.Connection:
            conn = self._new_connection()
            try:
                conn.open()
            except BaseException:
                conn.close()
                raise
            return conn

        label = _host_label(self.host)
        try:
            self._conn = attempt()
        except HostKeyRejected as exc:
            raise HostKeyRejected(f"{label}: {exc}") from None
        except paramiko.BadHostKeyException as exc:
            raise HostKeyRejected(
                f"{label}: REMOTE HOST KEY CHANGED: got {exc.key.get_name()} {exc.key.fingerprint}, "
                f"known_hosts has {exc.expected_key.fingerprint}. Refusing to connect (possible "
                "man-in-the-middle, or the host was reinstalled: remove the old key to proceed)"
            ) from None
        except paramiko.AuthenticationException as exc:
            raise ConnectionFailed(f"{label}: authentication failed: {exc}") from None
        except socket.gaierror as exc:
            raise ConnectionFailed(f"{label}: cannot resolve address: {exc}") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionFailed(f"{label}: cannot connect: {exc or type(exc).__name__}") from None

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

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- commands ---------------------------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        """Run ``command`` under ``sh`` on the host; never raises for a non-zero exit."""
        from invoke.exceptions import CommandTimedOut

        import paramiko

        timeout = timeout or self.ssh.command_timeout_s
        conn = self._live()
        wrapped = remote_timeout_wrap(command, timeout)
        started = time.monotonic()
        try:
            result = conn.run(
                wrapped, hide=True, warn=True, in_stream=False, pty=False, timeout=timeout + 10
            )
        except CommandTimedOut:
            raise StepTimeout(
                f"{_host_label(self.host)}: command did not finish within {timeout:.0f} s: {command[:200]}"
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise ConnectionFailed(
                f"{_host_label(self.host)}: connection lost while running a command ({exc}); "
                "it was not retried because it may have had side effects"
            ) from None
        exit_code = result.exited
        duration = time.monotonic() - started
        if exit_code == 124 and duration >= timeout - 1:
            raise StepTimeout(
                f"{_host_label(self.host)}: command did not finish within {timeout:.0f} s: {command[:200]}"
            )
        return CommandResult(
            command=command,
            exit_code=exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            duration_s=duration,
        )

    def check(self, command: str, *, timeout: float | None = None, what: str = "command") -> CommandResult:
        result = self.run(command, timeout=timeout)
        if not result.ok:
            detail = (result.stderr.strip() or result.stdout.strip())[-800:]
            raise RemoteCommandFailed(
                f"{_host_label(self.host)}: {what} failed with exit code {result.exit_code}: {detail}"
            )
        return result

    def stream(self, command: str) -> int:
        """Run a long-lived command (``tail -F``) printing its output as it comes; Ctrl-C ends it.

        A pty, so fabric's Ctrl-C handling (it writes ``\x03`` to the channel) reaches the remote
        command as SIGINT; without one the remote tail never hears it and the call never returns.
        """
        result = self._live().run(command, hide=False, warn=True, in_stream=False, pty=True)
        return result.exited

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

    def put(self, local: Path, remote: str) -> None:
        """Upload over SFTP to an absolute remote path (SFTP does not expand ``~``)."""
        import paramiko

        if not remote.startswith("/"):
            raise ValueError(f"remote path must be absolute, got {remote!r}")
        conn = self._live()
        try:
            conn.put(str(local), remote=remote)
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteCommandFailed(
                f"{_host_label(self.host)}: SFTP upload of {local} to {remote} failed: {exc}"
            ) from None

    @property
    def home(self) -> str:
        if self._home is None:
            result = self.check('printf "%s" "$HOME"', what="reading $HOME")
            home = result.stdout
            if not home.startswith("/") or "\n" in home:
                from deploy.errors import RemoteOutputError

                raise RemoteOutputError(
                    f"{_host_label(self.host)}: $HOME is {home!r}; expected an absolute path"
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

