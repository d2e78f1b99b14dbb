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
* ssh_config and jump hosts (deploy/ssh/hop.py opens each hop: auth, host-key policy). The user's ``~/.ssh/config`` is resolved by deploy/ssh/config.py
  (paramiko's parser, YAML values first); each hop of a ProxyJump chain is its own fabric
  ``Connection`` used as the next one's ``gateway``, with its own keys and its own host key check.
  Jump connections are shared by all targets of a run (:class:`JumpConnections`).
* Retries. tenacity retries *connecting* (refused, timed out, banner errors), never a command:
  a command may have side effects (killing processes, launching a server).
* Held commands. ``hold`` starts a command on its own channel and leaves it running until we
  close the channel or the connection dies; the host lock hangs on it (see deploy/engine/locks.py).
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from deploy.config.models import Host, SSHSettings
from deploy.ssh.hop import JumpConnections, open_hop
from deploy.ssh.process_group import GROUP_TERM_WAIT_S, group_wrap, split_group_mark, stop_group_command
from deploy.base.errors import (DeployError, ConnectionFailed, ExitCode, Interrupted, RemoteCommandFailed,
                           RemoteOutputError, StepTimeout)
from deploy.ssh.config import (
    Endpoint,
    SSHConfigSource,
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


#: the longest line a host-side watch loop may print (deploy/ssh/bounded_channel.py)
_MAX_WATCH_LINE = 1 << 20


class ExecTimedOut(Exception):
    """Raised by a transport's ``_exec`` when its local deadline passed (mapped to StepTimeout)."""


class ExecCancelled(Exception):
    """Raised by a transport's ``_exec`` when ``Transport.cancelled`` was set while the command ran
    (mapped to Interrupted): the channel is closed at once, not when the command ends."""


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
        #: the run's Ctrl-C/SIGTERM event (engine.session sets it): a command running when it is set is
        #: stopped (its channel closed); one started after it still runs (the report's own reads)
        self.cancelled: threading.Event | None = None

    @property
    def label(self) -> str:
        return _host_label(self.host)

    # -- what a concrete transport provides ---------------------------------------------------
    def _exec(self, command: str, *, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run the (already wrapped) ``command`` under ``sh``: (exit code, stdout, stderr); ``stdin``
        its input, then EOF (None: none, EOF at once is not promised).

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
               cancelled: threading.Event, silence_s: float | None = None) -> tuple[int | None, str]:
        """Run the (already wrapped) ``command``, calling ``on_line`` with each stdout line as it comes.

        Returns (exit code, stderr) when the command ends, or (None, "") once ``on_line`` returned
        True or ``cancelled`` is set: the channel is then closed (the host-side loop dies on its
        next write). Raises like ``_exec``.
        """
        raise NotImplementedError

    def hold(self, command: str, *, timeout: float | None = None) -> HeldCommand:
        raise NotImplementedError(f"{type(self).__name__} cannot hold a command open")

    # -- what the steps call ------------------------------------------------------------------
    def run(self, command: str, *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        """Run ``command`` under ``sh`` on the host; never raises for a non-zero exit. ``stdin``: what
        it reads (a record to write: never on its command line)."""
        timeout = timeout or self.command_timeout_s
        wrapped = remote_timeout_wrap(command, timeout)
        started = time.monotonic()
        try:
            exit_code, stdout, stderr = (self._exec(wrapped, timeout=timeout + 10) if stdin is None
                                         else self._exec(wrapped, timeout=timeout + 10, stdin=stdin))
        except ExecTimedOut:
            raise StepTimeout(
                f"{self.label}: command did not finish within {timeout:.0f} s: {command[:200]}"
            ) from None
        except ExecCancelled:
            raise Interrupted(f"{self.label}: interrupted: the running remote command was stopped (its channel "
                              f"closed): {command[:160]}") from None
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

    def check(self, command: str, *, timeout: float | None = None, what: str = "command",
              stdin: bytes | None = None) -> CommandResult:
        """Like ``run``, but a non-zero exit is a RemoteCommandFailed naming ``what``."""
        result = self.run(command, timeout=timeout, stdin=stdin)
        if not result.ok:
            detail = (result.stderr.strip() or result.stdout.strip())[-800:]
            raise RemoteCommandFailed(
                f"{self.label}: {what} failed with exit code {result.exit_code}: {detail}"
            )
        return result

    def watch(self, command: str, on_line: Callable[[str], bool], *, timeout: float,
              cancelled: threading.Event, silence_s: float | None = None) -> WatchResult:
        """Run a host-side poll loop on one channel; ``on_line(line) -> True`` means "answered, stop".

        Bounded on the host (coreutils ``timeout``) and locally; Ctrl-C (``cancelled``) closes the
        channel at once and raises Interrupted.
        """
        wrapped = remote_timeout_wrap(command, timeout)
        try:
            exit_code, stderr = self._watch(wrapped, on_line, timeout=timeout + 10, cancelled=cancelled,
                                            silence_s=silence_s)
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
                from deploy.base.errors import RemoteOutputError

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


class HostConnection(Transport):
    """One SSH connection to one host, reused by every step of a command.

    ``jumps`` is the run's shared :class:`JumpConnections`; without one the connection keeps its
    own (closed with it).
    """

    def __init__(self, host: Host, ssh: SSHSettings, jumps: JumpConnections | None = None,
                 ssh_config: SSHConfigSource | None = None):
        super().__init__(host, ssh.command_timeout_s)
        self.ssh = ssh
        #: why the host counts as frozen (a command outlived its host-side bound); later commands fail at once
        self._frozen: str | None = None
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
        import paramiko

        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except (OSError, EOFError, paramiko.SSHException):
                # the connection died under it (its jump host dropped): what the host answered is
                # already in hand, and a close has nothing left to report (was "internal error: EOFError")
                pass
        if self._own_jumps:
            self._jumps.close()

    def __enter__(self) -> HostConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the wire ---------------------------------------------------------------------------
    def _exec(self, command: str, *, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        # HOSTILE (issue 22): one channel read within a byte limit (deploy/ssh/bounded_channel.py),
        # not fabric's run(hide=True), which kept a 60 MB nvidia-smi answer whole in memory.
        import paramiko

        from deploy.ssh import bounded_channel

        self._refuse_when_frozen()
        # a signal that came before this command started does not stop it (the report's own reads)
        cancelled = self.cancelled if self.cancelled is not None and not self.cancelled.is_set() else None
        try:
            channel = self._live().client.get_transport().open_session(timeout=self.ssh.connect_timeout_s)
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        try:
            status, out, err = bounded_channel.exec_bounded(channel, group_wrap(command),
                                                            deadline=time.monotonic() + timeout, cancelled=cancelled,
                                                            stdin=stdin)
            err = split_group_mark(err)[1]
            if status == -1 and not self._transport_alive(channel):
                # the channel closed with no exit status and the SSH session is gone: the host (or its sshd)
                # died mid-command; exit 4, not "the fixer printed no JSON" (exit 5)
                raise ConnectionError("the connection closed before the command ended (the host or its sshd "
                                      "went away)")
        except bounded_channel.DeadlinePassed:
            # the command is bounded on the host (coreutils timeout, --kill-after=5): a live host answers in
            # time, so the local deadline passing means the host or the network froze (exit 4, not 7)
            raise ConnectionError(self._freeze(f"no answer within {timeout:.0f} s to a command bounded on the "
                                               f"host")) from None
        except bounded_channel.Cancelled as cut:
            # issue 39: closing the channel alone left the host-side command running (the fix-keys store
            # 7.3 s after the lock was released, and a restart then failed on its half-written store entry):
            # its process group ends before this returns, so before the host lock is released
            self._stop_group(channel, cut.stderr)
            raise ExecCancelled(command) from None
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
        from deploy.base.terminal import SafeStream

        # the log is printed with its control characters escaped (HOSTILE, issue 22)
        result = self._live().run(command, hide=False, warn=True, in_stream=False, pty=True,
                                  out_stream=SafeStream(sys.stdout), err_stream=SafeStream(sys.stderr))
        return result.exited

    def _watch(self, command: str, on_line: Callable[[str], bool], *, timeout: float,
               cancelled: threading.Event, silence_s: float | None = None) -> tuple[int | None, str]:
        import paramiko

        self._refuse_when_frozen()
        deadline = time.monotonic() + timeout
        # a loop with a heartbeat silent for longer than a live host can be: the host or the network froze (a
        # stopped sshd took wait-ready 138 s against a 60 s ready timeout); never shorter than the connect timeout
        limit = max(float(self.ssh.connect_timeout_s), silence_s) if silence_s else None
        last_byte = time.monotonic()
        try:
            channel = self._live().client.get_transport().open_session(timeout=self.ssh.connect_timeout_s)
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        try:
            # short reads, so Ctrl-C and the local deadline are noticed within 0.1 s
            channel.settimeout(0.1)
            channel.exec_command(group_wrap(command))
            pending = line = b""
            while True:
                if cancelled.is_set():
                    self._end_watch(channel, wait_s=0.5)
                    # a loop busy in a query (nvidia-smi) reads its stdin's EOF only after it: issue 39 saw
                    # watch-gpus run 25 s after deployctl exited; its process group ends here, before the lock
                    self._stop_group(channel, b"")
                    return None, ""
                if time.monotonic() > deadline:
                    raise ConnectionError(self._freeze(f"no answer within {timeout:.0f} s to a host-side wait "
                                                       "bounded on the host"))
                if limit is not None and time.monotonic() - last_byte > limit:
                    raise ConnectionError(self._freeze(f"a host-side wait with a heartbeat sent nothing for "
                                                       f"{limit:.0f} s"))
                try:
                    chunk = channel.recv(65536)
                except socket.timeout:
                    continue
                last_byte = time.monotonic()
                if not chunk:
                    break
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if len(line) > _MAX_WATCH_LINE:
                        break
                    if on_line(line.decode("utf-8", "replace")):
                        self._end_watch(channel)
                        self._stop_group(channel, b"")
                        return None, ""
                if len(pending) > _MAX_WATCH_LINE or len(line) > _MAX_WATCH_LINE:  # HOSTILE (issue 22)
                    raise RemoteOutputError(f"{self.label}: a host-side loop printed a line of more than "
                                            f"{_MAX_WATCH_LINE} bytes: {bytes(max(line, pending, key=len)[:120])!r}")
            if pending.strip() and on_line(pending.decode("utf-8", "replace")):
                return None, ""
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise ConnectionError(self._freeze(f"no answer within {timeout:.0f} s to a host-side wait "
                                                   "bounded on the host"))
            stderr = b""
            while channel.recv_stderr_ready():
                stderr += channel.recv_stderr(65536)
            stderr = split_group_mark(stderr)[1]
            status = channel.recv_exit_status()
            if status == -1 and not self._transport_alive(channel):
                raise ConnectionError("the connection closed before the wait ended (the host or its sshd went away)")
            return status, stderr.decode("utf-8", "replace")
        except paramiko.SSHException as exc:
            raise ConnectionError(str(exc)) from exc
        finally:
            channel.close()

    def _freeze(self, why: str) -> str:
        self._frozen = why
        return f"the host stopped answering: {why}"

    def _refuse_when_frozen(self) -> None:
        """After a command outlived its own host-side bound (the host froze: a stopped sshd, a dead
        network), later commands fail at once instead of each waiting out its timeout: a frozen sshd
        during wait-ready took 138 s (the wait, then the server-state and log reads) against 60 s."""
        if self._frozen is not None:
            raise ConnectionError(f"not sent: the host stopped answering ({self._frozen})")

    @staticmethod
    def _transport_alive(channel, wait_s: float = 0.5) -> bool:
        """Whether the SSH session is still up; paramiko closes the channels of a dead session just before
        it marks the session inactive, so a channel closed without an exit status waits a moment for that."""
        deadline = time.monotonic() + wait_s
        try:
            transport = channel.get_transport()
            while transport is not None and transport.is_active() and time.monotonic() < deadline:
                time.sleep(0.02)
            return bool(transport is not None and transport.is_active())
        except Exception:  # noqa: BLE001 - a channel without a transport is a dead one
            return False

    def _stop_group(self, channel, stderr: bytes, wait_s: float = 0.5) -> None:
        """End the process group of the command running on ``channel`` (its mark on stderr: ``stderr`` read so
        far, else read from the channel, ``wait_s`` at most), unless it has exited already. Sent on a channel
        of its own; waits until nothing of the group is left (SIGTERM, SIGKILL after GROUP_TERM_WAIT_S).
        Best effort: a dead connection has taken the command's session with it."""
        from deploy.ssh import bounded_channel

        try:
            if channel.status_event.is_set():
                return
            deadline = time.monotonic() + wait_s
            while b"\n" not in stderr and len(stderr) < 256 and time.monotonic() < deadline:
                if channel.recv_stderr_ready():
                    stderr += channel.recv_stderr(256)
                elif channel.status_event.wait(0.02):
                    return
            pgid = split_group_mark(stderr)[0]
            if pgid is None or channel.status_event.is_set():
                return
            stopper = self._live().client.get_transport().open_session(timeout=self.ssh.connect_timeout_s)
            try:
                bounded_channel.exec_bounded(stopper, stop_group_command(pgid),
                                             deadline=time.monotonic() + 2 * GROUP_TERM_WAIT_S + 5)
            finally:
                stopper.close()
        except Exception:  # noqa: BLE001 - best effort: the report says what the run knows it left
            pass

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
