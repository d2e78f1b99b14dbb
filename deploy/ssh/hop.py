"""Opening SSH hops: host-key policy, authentication, the fabric Connection, jump hosts.

What deploy/ssh/transport.py's :class:`HostConnection` connects through (its module docstring says
why: fabric #1804/#2071 trust any key, so the policy and known_hosts are ours; tenacity retries
connecting, never a command). Each hop of a ProxyJump chain is its own fabric ``Connection``
used as the next one's ``gateway``, with its own keys and its own host key check;
:class:`JumpConnections` shares the jump hops among a run's targets.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.ssh import trust as ssh_trust
from deploy.base.errors import ConnectionFailed, HostKeyRejected
from deploy.ssh.config import Endpoint, expand_path

if TYPE_CHECKING:  # fabric/paramiko are imported lazily: `deployctl --help` must stay fast.
    import fabric
    import paramiko


def _readable(path: Path) -> bool:
    # /dev/null is how ssh users say "no file" (UserKnownHostsFile /dev/null): read as empty, as ssh does
    return path.exists() and str(path) != os.devnull


def known_hosts_files(hop: Endpoint) -> tuple[list[Path], list[Path]]:
    """(the hop's user known_hosts files, where a new key is recorded: the first; every file read to
    verify a key: those of them that exist, then the GlobalKnownHostsFile ones that exist, as ssh
    reads them, never written)."""
    files = [expand_path(f) for f in hop.known_hosts.value]
    system = [expand_path(f) for f in hop.global_known_hosts.value]
    return files, [f for f in files + system if _readable(f)]


def apply_host_key_policy(client: paramiko.SSHClient, hop: Endpoint, label: str) -> None:
    """Load the hop's known_hosts files and install the hop's policy for unknown keys.

    A changed key never reaches a policy: paramiko raises BadHostKeyException first. Jump hosts go
    through here exactly like targets (their own UserKnownHostsFile / StrictHostKeyChecking).
    The files are read by deploy/ssh/trust.py, not client.load_host_keys: paramiko misreads
    OpenSSH's @revoked/@cert-authority lines.
    """
    files, present = known_hosts_files(hop)
    if not present and hop.host_key_policy.value == "reject":
        named = [*map(str, files), *hop.global_known_hosts.value]
        raise HostKeyRejected(
            f"known_hosts file {', '.join(named) or '(none: UserKnownHostsFile none)'} does not exist; host keys "
            "cannot be verified (set ssh.known_hosts, or use accept-new once)"
        )
    known = ssh_trust.load_known_hosts_files(present) if present else None
    if known is not None:
        client._host_keys = known.host_keys  # type: ignore[attr-defined]  # what SSHClient.connect looks keys up in
    reject, accept_new = ssh_trust.make_policies(known, files[0] if files else Path(os.devnull), label)
    # UserKnownHostsFile none: a new key has nowhere to go (the GlobalKnownHostsFile is never
    # written), so only a key already known there is accepted
    if hop.host_key_policy.value == "accept-new" and files:
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
    from deploy.ssh.agent import timed_agent

    return list(timed_agent().get_keys())


def auth_kwargs(hop: Endpoint, label: str) -> dict:
    """paramiko connect() keyword arguments for the hop's identities and ssh-agent.

    No identity file (YAML or ssh_config): the agent's keys, then ~/.ssh/id_* (as OpenSSH).
    With identity files: those files; agent keys too unless IdentitiesOnly. A passphrase-protected
    file is used through the agent when the agent holds it, asked for on a terminal, and otherwise
    refused with a clear error: a cron job must never hang on a prompt nobody sees.
    """
    import paramiko

    from deploy.ssh.agent import check_agent_answers

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


class OrderedChannel:
    """The direct-tcpip channel a hop's SSH session rides on, with its CLOSE never ahead of its data.

    paramiko (3.x-5.1) builds a channel's DATA message under the channel's lock but sends it after
    releasing it (``Channel._send``), and so does ``Channel.close`` with CLOSE. The hop's transport
    thread writes on this channel (the target's protocol: its reply to the target's channel CLOSE at
    the end of a command, a window adjust) while the host's thread closes the hop: the CLOSE could leave
    first, and OpenSSH's sshd on the jump host then dropped the WHOLE shared bastion connection ("data
    packet referred to nonexistent channel 5", OpenSSH 9.2), failing every other host behind it with
    EOFError (2026-12-06, tests/integration/test_proxyjump.py under load). One lock around each send
    and the close keeps them in order; everything else is the channel's own."""

    def __init__(self, channel):
        self._channel = channel
        self._order = threading.Lock()

    def send(self, data):
        with self._order:
            return self._channel.send(data)

    def sendall(self, data):
        with self._order:
            return self._channel.sendall(data)

    def close(self):
        with self._order:
            self._channel.close()

    def __getattr__(self, name):
        return getattr(self._channel, name)


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
                return OrderedChannel(self.gateway.transport.open_channel(
                    kind="direct-tcpip", dest_addr=(self.host, int(self.port)), src_addr=("", 0),
                    timeout=self.connect_timeout,
                ))

        _hop_class = HopConnection
    return _hop_class


#: how often a connected transport's thread wakes with nothing to read (paramiko: 0.1 s). Each wake-up
#: is ~0.1 ms of CPU (a socket.timeout raised and caught, paramiko 5.1), so every open connection
#: cost 1 ms of CPU per second: `status` holds one per host through its 2 s window, `up` through the
#: model load, a canary through its whole window. The wake-up only looks for a close() (woken at once
#: instead: _hop_transport_class) and times paramiko's keepalive, which deployctl does not use; the
#: banner and key exchange keep paramiko's 0.1 s (their timeouts are checked on it).
SETTLED_WAKE_S = 1.0

_transport_class = None


def _hop_transport_class():
    """paramiko's Transport, quiet once connected (SETTLED_WAKE_S) and woken at once by its close().

    paramiko's ``close()`` closes the socket while its thread sits in ``poll()`` on it; Linux does not
    wake that ``poll()``, so the thread would linger until its next wake-up. A shutdown first ends
    the ``poll()`` with EOF: the thread finishes as it does when a server hangs up (a hop through a
    jump host rides a channel, whose close already wakes the read)."""
    global _transport_class
    if _transport_class is None:
        import paramiko

        class HopTransport(paramiko.Transport):
            def settle(self) -> None:
                """After authentication: wake every SETTLED_WAKE_S instead of every 0.1 s."""
                try:
                    self.sock.settimeout(SETTLED_WAKE_S)
                except OSError:  # the server hung up already: the next command finds the connection gone
                    pass

            def close(self) -> None:
                if self.is_active() and isinstance(self.sock, socket.socket):
                    try:
                        self.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:  # not connected any more: close() has nothing to wake
                        pass
                super().close()

        _transport_class = HopTransport
    return _transport_class


def build_hop_connection(hop: Endpoint, gateway: fabric.Connection | None, label: str) -> fabric.Connection:
    """An unopened fabric Connection for one hop, through ``gateway`` (the previous hop) if any."""
    import fabric

    timeout = hop.connect_timeout_s.value
    connect_kwargs: dict = {
        "banner_timeout": timeout,
        "auth_timeout": timeout,
        "channel_timeout": timeout,
        "transport_factory": _hop_transport_class(),
        **auth_kwargs(hop, label),
    }
    # fabric's own ssh_config loading stays off: deployctl resolved the settings itself
    # (deploy/ssh/config.py) and fabric would apply ProxyJump without any host key check.
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


def silent_server(exc: BaseException, waited_s: float, timeout_s: float) -> bool:
    """An SSH server that accepted the connection but never sent its banner for the whole timeout
    (a quick banner error, e.g. sshd's MaxStartups dropping us, is worth a retry; this is not)."""
    text = str(exc)
    return waited_s >= 0.9 * timeout_s and ("No existing session" in text or "protocol banner" in text)


def no_delay(conn: fabric.Connection) -> None:
    """TCP_NODELAY on the hop's own TCP socket (a hop through a gateway rides a channel: its gateway has it).

    paramiko (3.x-5.x) leaves Nagle's algorithm on, unlike OpenSSH's client: each command's small
    requests (channel open, exec) then wait for the peer's delayed ACK (40 ms on Linux), so every
    command cost 48 ms of waiting against the sandbox's sshd, 4.5 ms with this (docs/benchmarks.md):
    a roll behind a router sends ~1,800 commands."""
    transport = conn.client.get_transport()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # only slower: the commands still run
            pass


def open_hop(hop: Endpoint, gateway: fabric.Connection | None, retries: int, label: str) -> fabric.Connection:
    """Connect one hop (retrying refused/timed-out connects); errors are DeployErrors naming ``label``."""
    import paramiko
    from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

    @retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(retries + 1),
           wait=wait_exponential(multiplier=0.5, max=5), reraise=True)
    def attempt() -> fabric.Connection:
        conn = build_hop_connection(hop, gateway, label)
        started = time.monotonic()
        try:
            conn.open()
        except paramiko.SSHException as exc:
            conn.close()
            waited = time.monotonic() - started
            if silent_server(exc, waited, hop.connect_timeout_s.value):
                # paramiko logs the banner timeout and then fails auth with "No existing session";
                # retrying a host that accepts TCP but never speaks SSH only multiplies the wait (44 s)
                raise ConnectionFailed(
                    f"{label}: the host accepted the TCP connection but its SSH server sent nothing within "
                    f"{waited:.0f} s (no SSH banner: a frozen host or network, or an overloaded sshd); not retried"
                ) from None
            raise
        except BaseException:
            conn.close()
            raise
        no_delay(conn)
        conn.client.get_transport().settle()
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
        import paramiko

        with self._lock:
            for key in reversed(self._order):  # innermost hops first
                try:
                    self._conns.pop(key).close()
                except (OSError, EOFError, paramiko.SSHException):
                    pass  # a hop that died under it (its own jump host dropped it): nothing left to close
            self._order.clear()

    def __enter__(self) -> JumpConnections:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
