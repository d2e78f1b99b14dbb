"""Whom deployctl trusts over SSH: known_hosts (with OpenSSH's markers) and private-key permissions.

Kept apart from the connection code in deploy/ssh/transport.py, which calls these functions.

* known_hosts markers. paramiko's ``HostKeys.load`` reads ``@cert-authority *.example.com
  ssh-ed25519 ...`` as a host named "@cert-authority" with key type "*.example.com" and, for some
  lines, raises; every host then failed with "internal error" while OpenSSH connects with the same
  file. We read the file ourselves, as OpenSSH's hostfile.c does: ``@revoked`` keys are never
  accepted (and win over a plain line for the same key), ``@cert-authority`` lines are skipped
  (paramiko cannot verify host certificates: such a host also needs a plain key line), malformed
  lines are skipped; each plain line goes through paramiko's own ``HostKeyEntry.from_line``, and
  hashed names (``|1|salt|hash``) are matched with paramiko's ``HostKeys.hash_host``.
* private keys. OpenSSH refuses a key file that group or others can read ("UNPROTECTED PRIVATE KEY
  FILE!", sshkey_perm_ok in authfile.c); paramiko uses it silently. We refuse it the same way.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deploy.base.errors import ConnectionFailed, HostKeyRejected

if TYPE_CHECKING:
    import paramiko

#: a known_hosts file of 64 MiB holds ~150k hosts; anything larger is not one.
MAX_KNOWN_HOSTS_BYTES = 64 << 20


@dataclass
class KnownHosts:
    path: Path
    #: plain entries for paramiko's client; a lookup leaves out keys revoked for the host
    host_keys: paramiko.HostKeys
    #: (host patterns, key) of every @revoked line
    revoked: list[tuple[list[str], paramiko.PKey]] = field(default_factory=list)
    #: line numbers skipped (malformed, unknown marker, @cert-authority)
    skipped: list[int] = field(default_factory=list)

    def revoked_for(self, hostname: str, key: paramiko.PKey) -> bool:
        return any(_key_equal(key, bad) and host_matches(patterns, hostname) for patterns, bad in self.revoked)


def _key_equal(a, b) -> bool:
    return a.get_name() == b.get_name() and a.asbytes() == b.asbytes()


def host_matches(patterns: list[str], hostname: str) -> bool:
    """OpenSSH host pattern list: ``*``/``?`` wildcards, ``!`` negation, hashed ``|1|`` names."""
    from paramiko.hostkeys import HostKeys

    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:]
        if pattern.startswith("|1|"):
            parts = pattern.split("|")
            ok = len(parts) == 4 and HostKeys.hash_host(hostname, parts[2]) == pattern
        else:
            ok = fnmatch.fnmatchcase(hostname.lower(), pattern.lower().replace("[", "[[]"))
        if ok and negated:
            return False
        matched = matched or ok
    return matched


#: (path, device, inode, size, mtime) -> (plain entries, revoked, skipped) of that version of the file
_parsed: dict[tuple, tuple[list, list, list[int]]] = {}
_parsed_lock = threading.Lock()


def load_known_hosts(path: Path) -> KnownHosts:
    """Read a known_hosts file the way OpenSSH does (see the module docstring).

    Raises ConnectionFailed (exit 4) when the file cannot be read or is not a known_hosts file
    by its size; a missing file is the caller's decision.

    Each version of a file is parsed once per process (issue 37: every host of a 100-host run parsed
    the same 100-line file, 10,000 key parses, a cost per host that grew with the fleet). The
    version is the file's identity, size and mtime: a key that accept-new records, or an edit,
    makes the next connection read the file again. Every caller gets its own entries: what
    paramiko adds for one host never reaches another's.
    """
    import paramiko
    from paramiko.hostkeys import HostKeyEntry

    try:
        st = os.stat(path)
        version: tuple | None = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        version = None  # read_bounded below says why
    with _parsed_lock:
        parsed = _parsed.get(version) if version is not None else None
    if parsed is None:
        parsed = _parse_known_hosts(path)
        if version is not None:
            with _parsed_lock:
                _parsed[version] = parsed
    plain, revoked, skipped = parsed
    known = KnownHosts(path=path, host_keys=paramiko.HostKeys(), revoked=list(revoked), skipped=list(skipped))
    known.host_keys = _revocation_aware(known)
    # the same bookkeeping as paramiko's HostKeys.load, for pre-parsed entries (fresh entry objects:
    # paramiko's HostKeys.add replaces an entry's key in place)
    known.host_keys._entries.extend(HostKeyEntry(list(e.hostnames), e.key) for e in plain)  # type: ignore[attr-defined]  # paramiko has no public API for it
    return known


def _parse_known_hosts(path: Path) -> tuple[list, list, list[int]]:
    """(plain entries, (host patterns, key) of each @revoked line, skipped line numbers) of the file."""
    from paramiko.hostkeys import HostKeyEntry

    from deploy.base.limits import InputTooLarge, read_bounded

    try:
        raw = read_bounded(path, MAX_KNOWN_HOSTS_BYTES)
    except InputTooLarge as exc:
        raise ConnectionFailed(f"known_hosts file {path}: refused: {exc}") from None
    except OSError as exc:
        raise ConnectionFailed(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from None
    text = raw.decode("utf-8", errors="replace")
    plain: list = []
    revoked: list = []
    skipped: list[int] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
            line = line.strip()
            if marker not in ("@revoked", "@cert-authority"):
                skipped.append(lineno)  # OpenSSH skips a line with an unknown marker
                continue
            if marker == "@cert-authority":
                skipped.append(lineno)  # host certificates: not verified by paramiko
                continue
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except Exception:  # malformed base64, a truncated key: OpenSSH skips the line too
            entry = None
        if entry is None or entry.key is None:
            skipped.append(lineno)
            continue
        if marker == "@revoked":
            revoked.append((list(entry.hostnames), entry.key))
        else:
            plain.append(entry)
    return plain, revoked, skipped


def load_known_hosts_files(paths: list[Path]) -> KnownHosts:
    """Several known_hosts files (ssh_config's UserKnownHostsFile may name more than one) as one.

    Revocations from any file apply to the keys of every file, as in OpenSSH.
    """
    first = load_known_hosts(paths[0])
    for path in paths[1:]:
        more = load_known_hosts(path)
        first.revoked.extend(more.revoked)
        first.host_keys._entries.extend(more.host_keys._entries)  # type: ignore[attr-defined]
    return first


def _revocation_aware(known: KnownHosts):
    """paramiko HostKeys whose lookup(host) leaves out keys revoked for that host.

    Per lookup, not at load time: a @revoked line may name some hosts only (``!a,*``), and a
    plain line may list a host under a hashed name that only a lookup can match.
    """
    import paramiko

    class RevocationAwareHostKeys(paramiko.HostKeys):
        def lookup(self, hostname):
            view = paramiko.HostKeys()
            view._entries = [e for e in self._entries if e.key is not None and not known.revoked_for(hostname, e.key)]
            return view.lookup(hostname)

    return RevocationAwareHostKeys()


def revoked_message(label: str, hostname: str, key, path: Path) -> str:
    prefix = f"{label}: " if label else ""
    return (f"{prefix}host key {key.get_name()} {key.fingerprint} for {hostname} is marked @revoked in "
            f"{path}; refusing to connect (the host must get a new key)")


def make_policies(known: KnownHosts | None, known_hosts_path: Path, label: str):
    """(reject, accept_new) paramiko policies for unknown keys; both refuse a revoked key first."""
    import paramiko

    def refuse_revoked(hostname: str, key) -> None:
        if known is not None and known.revoked_for(hostname, key):
            raise HostKeyRejected(revoked_message("", hostname, key, known_hosts_path))  # caller adds the host

    class RejectUnknownHost(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            refuse_revoked(hostname, key)
            raise HostKeyRejected(
                f"host key for {hostname} is not in known_hosts "
                f"({key.get_name()} {key.fingerprint}); verify it and add it, "
                "or set ssh.host_key_policy: accept-new (or --accept-new-host-keys) to record it"
            )

    class AcceptNewHost(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            refuse_revoked(hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)
            known_hosts_path.parent.mkdir(parents=True, exist_ok=True)
            line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
            fd = os.open(known_hosts_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            # Like OpenSSH's "Permanently added ... to the list of known hosts": a key trusted on
            # first use is said out loud, with the fingerprint to compare out of band.
            sys.stderr.write(f"{label}: recorded new host key for {hostname}: {key.get_name()} "
                             f"{key.fingerprint} in {known_hosts_path}\n")
            sys.stderr.flush()

    return RejectUnknownHost, AcceptNewHost


def check_private_key_file(path: Path, label: str) -> None:
    """Refuse a private key that group or others may read, as OpenSSH does (exit 4)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConnectionFailed(f"{label}: identity_file {path} does not exist") from None
    except OSError as exc:
        raise ConnectionFailed(f"{label}: identity_file {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConnectionFailed(f"{label}: identity_file {path} is not a regular file")
    # sshkey_perm_ok (OpenSSH authfile.c): only a key owned by the user is judged by its mode
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise ConnectionFailed(
            f"{label}: UNPROTECTED PRIVATE KEY FILE: permissions {mode:04o} for {path} are too open "
            f"(group or others can read it); OpenSSH refuses such a key, and so does deployctl. "
            f"Fix: chmod 600 {path}"
        )
    if not os.access(path, os.R_OK):
        raise ConnectionFailed(f"{label}: identity_file {path} is not readable by this user")
