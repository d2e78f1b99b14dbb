"""ssh_config evaluated the way OpenSSH's client does (readconf.c, OpenSSH 9.x), for one alias.

paramiko's ``SSHConfig`` disagreed with ``ssh -G`` on real configs (issue 22): an ``Include``
inside a ``Host`` block was applied to every host, the alias kept its case, ``%%`` stayed in a
HostName and ``UserKnownHostsFile`` tokens were never expanded. This module follows readconf.c:

* keywords are case-insensitive, ``Keyword value`` or ``Keyword=value``; the first value of a
  keyword wins (IdentityFile accumulates, duplicates dropped); ``ProxyJump`` and ``ProxyCommand``
  exclude each other, whichever comes first;
* ``Host`` patterns (``*``, ``?``, ``!negation``, several per line) match the alias as typed,
  case-sensitively (as OpenSSH 9.2 does); ``Match`` criteria ``all``, ``host`` (the HostName set so far,
  ``%h`` expanded, else the alias), ``originalhost``, ``user`` (the User set so far, else the local
  user), ``localuser``, each negatable, all of a line must hold;
* ``Include`` (glob, sorted; relative names under ~/.ssh) inside a ``Host``/``Match`` block
  applies only when that block does: the included file starts active exactly when the block is,
  its own blocks are never active when the block is not, and the block's state resumes after it;
* HostName: ``%h`` is the alias, ``%%`` a percent, the result lowercased, as ssh.c does; with no
  HostName, the alias lowercased (the name ssh connects to and looks up in known_hosts).

Refused (ConfigError naming file and line) rather than guessed: ``Match exec`` (deployctl runs no
command from ssh_config: ``plan`` and ``gpu-status`` promise to change nothing; the criterion is
refused when the evaluation reaches it, and a Match whose earlier criterion already failed is
skipped exactly as OpenSSH skips running it), ``Match canonical``/``final``/``localnetwork``/
``tagged`` and ``CanonicalizeHostname yes``/``always`` (OpenSSH would resolve the name in DNS
and evaluate the config again; write the full name as HostName instead).

Token expansion of ``IdentityFile`` and ``UserKnownHostsFile`` (``%d %h %u %r %p %n %i %l %L %%``
and ``~``) needs the effective user and port, which the YAML may override: :func:`expand_tokens`
is called by deploy/ssh/config.py once those are known.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

from deploy.base.errors import ConfigError

#: ``Include`` nesting deeper than this is a loop (OpenSSH's READCONF_MAX_DEPTH is 16)
MAX_INCLUDE_DEPTH = 16
#: keywords that take several arguments kept as one space-joined value
_MULTI = {"canonicaldomains", "sendenv", "setenv"}
#: keywords whose arguments are several files, kept as a list
_FILES = {"userknownhostsfile", "globalknownhostsfile"}
_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)(?:\s*=\s*|\s+|$)(.*)$")


@dataclass(frozen=True)
class Line:
    origin: str
    number: int
    keyword: str
    args: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.origin}:{self.number}"


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry and no $USER
        return "root"


def argv_split(text: str) -> list[str]:
    """A config line's arguments as OpenSSH's misc.c ``argv_split(s, &ac, &av, 1)`` splits them
    (readconf.c since 8.7): blanks separate words; ``"..."`` and ``'...'`` quote (a quote mid-word
    too: ``a"b c"`` is ``ab c``); a backslash escapes a quote, a backslash, or (unquoted) a space,
    and is kept before anything else; ``#`` ends the line only where a word would start
    (``User ops#x`` is ``ops#x``). An unterminated quote is an error (ValueError)."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t":
            i += 1
            continue
        if text[i] == "#":
            break
        quote, word = "", []
        while i < n:
            ch = text[i]
            if ch == "\\":
                following = text[i + 1:i + 2]
                if following in ("'", '"', "\\") or (not quote and following == " "):
                    i += 1
                    word.append(following)
                else:
                    word.append(ch)  # unrecognised escape: kept
            elif not quote and ch in " \t":
                break
            elif not quote and ch in "\"'":
                quote = ch
            elif quote and ch == quote:
                quote = ""
            else:
                word.append(ch)
            i += 1
        if quote:
            raise ValueError("invalid quotes")
        words.append("".join(word))
    return words


def parse_lines(text: str, origin: str) -> list[Line]:
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _LINE.match(raw)
        if not match:
            raise ConfigError(f"{origin}:{number}: ssh_config line not understood: {stripped[:120]!r}")
        try:
            args = argv_split(match.group(2))
        except ValueError as exc:
            raise ConfigError(f"{origin}:{number}: ssh_config line not understood ({exc}): {stripped[:120]!r}") from None
        lines.append(Line(origin, number, match.group(1).lower(), tuple(args)))
    return lines


def match_pattern(value: str, pattern: str, ignore_case: bool = True) -> bool:
    """OpenSSH's match_pattern: ``*`` and ``?`` wildcards, nothing else special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z"
    return re.match(regex, value, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


def match_pattern_list(value: str, patterns: str, ignore_case: bool = True) -> bool:
    """OpenSSH's match_pattern_list: a matching ``!pattern`` is a definite no; else any positive match."""
    found = False
    for pattern in (p for p in patterns.split(",") if p):
        negated = pattern.startswith("!")
        if match_pattern(value, pattern[1:] if negated else pattern, ignore_case):
            if negated:
                return False
            found = True
    return found


def expand_hostname(value: str, alias: str, where: str) -> str:
    """ssh.c: ``percent_expand(hostname, "h", host)`` then lowercase; another token is an error there too."""
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        token = value[i + 1:i + 2]
        if token == "%":
            out.append("%")
        elif token == "h":
            out.append(alias)
        else:
            raise ConfigError(f"{where}: HostName {value!r}: %{token} is not a HostName token (only %h and %%)")
        i += 2
    return "".join(out).lower()


def expand_tokens(value: str, tokens: dict[str, str], where: str, keyword: str) -> str:
    """``~`` and ``%x`` tokens as ssh expands them in IdentityFile and UserKnownHostsFile."""
    if value.startswith("~"):
        value = os.path.expanduser(value)
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        token = value[i + 1:i + 2]
        if token == "%":
            out.append("%")
        elif token in tokens:
            out.append(tokens[token])
        else:
            raise ConfigError(f"{where}: {keyword} {value!r}: token %{token} is not supported by deployctl "
                              f"(supported: {' '.join('%' + t for t in sorted(tokens))} %%)")
        i += 2
    return "".join(out)


def path_tokens(alias: str, hostname: str, user: str, port: int) -> dict[str, str]:
    """The tokens ssh expands in IdentityFile and UserKnownHostsFile (ssh_config(5) TOKENS)."""
    host = socket.gethostname()
    return {"d": os.path.expanduser("~"), "h": hostname, "u": _local_user(), "r": user, "p": str(port),
            "n": alias, "i": str(os.getuid()), "l": host, "L": host.split(".")[0]}


_REFUSED_MATCH = {"canonical", "final", "localnetwork", "tagged"}


class OpenSSHConfig:
    """One ssh_config file with its Includes read in advance; ``lookup(alias)`` evaluates it."""

    def __init__(self, lines: list[Line], read: Callable[[str, str], str], origin: str):
        self._lines = lines
        self._read = read
        self._origin = origin
        self._files: dict[str, list[Line]] = {}

    @classmethod
    def from_text(cls, text: str, origin: str = "ssh_config",
                  read: Callable[[str, str], str] | None = None) -> OpenSSHConfig:
        def refuse(path: str, label: str) -> str:
            raise ConfigError(f"{label}: Include is not read here")

        return cls(parse_lines(text, origin), read or refuse, origin)

    def _included(self, line: Line) -> list[tuple[str, list[Line]]]:
        files = []
        for pattern in line.args:
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
            for path in sorted(glob.glob(pattern)):
                if os.path.isdir(path):
                    continue  # readconf.c: an Include glob's directories are skipped
                if path not in self._files:
                    self._files[path] = parse_lines(self._read(path, f"{line.where}: Include {path}"), path)
                files.append((path, self._files[path]))
        return files

    def preload(self) -> None:
        """Read every Include (in any block) now: a missing loop or unreadable file fails at load."""
        def walk(lines: list[Line], depth: int) -> None:
            for line in lines:
                if line.keyword != "include":
                    continue
                if depth >= MAX_INCLUDE_DEPTH:
                    raise ConfigError(f"{line.where}: Include nested more than {MAX_INCLUDE_DEPTH} deep (a loop?)")
                for _, included in self._included(line):
                    walk(included, depth + 1)

        walk(self._lines, 0)

    def lookup(self, alias: str) -> dict:
        """The options ssh would use for ``alias`` (keys lowercased; ``hostname`` always set)."""
        state = _Evaluation(alias, self)
        state.run(self._lines, active=True, never=False, depth=0)
        options = state.options
        canonical = options.get("canonicalizehostname", "no").lower()
        if canonical in ("yes", "always"):
            raise ConfigError(f"{state.where.get('canonicalizehostname', self._origin)}: CanonicalizeHostname "
                              f"{canonical} is not supported by deployctl (OpenSSH would look the name up in DNS "
                              "and read the config again); write the full name as HostName instead")
        raw = options.get("hostname")
        host = state.host
        options["hostname"] = expand_hostname(raw, host, state.where["hostname"]) if raw is not None else host.lower()
        options["_where"] = dict(state.where)
        return options


class _Evaluation:
    def __init__(self, alias: str, config: OpenSSHConfig):
        self.original = alias
        # Host patterns match the alias as typed, case-sensitively (OpenSSH 9.2: "Host beta" does not
        # apply to "ssh Beta"); Match host/originalhost compare case-insensitively; the HostName
        # ssh finally connects to is lowercased (ssh.c), alias included.
        self.host = alias
        self.config = config
        self.options: dict = {}
        self.where: dict[str, str] = {}

    def run(self, lines: list[Line], active: bool, never: bool, depth: int) -> bool:
        if depth > MAX_INCLUDE_DEPTH:
            raise ConfigError(f"{lines[0].origin if lines else '?'}: Include nested more than {MAX_INCLUDE_DEPTH} "
                              "deep (a loop?)")
        for line in lines:
            if line.keyword == "host":
                active = not never and self._host_matches(line)
            elif line.keyword == "match":
                active = self._match(line) and not never
            elif line.keyword == "include":
                for _, included in self.config._included(line):
                    # readconf.c: the included file starts as the block is; the block resumes after it
                    self.run(included, active, never or not active, depth + 1)
            elif active:
                self._set(line)
        return active

    def _host_matches(self, line: Line) -> bool:
        if not line.args:
            raise ConfigError(f"{line.where}: Host needs at least one pattern")
        found = False
        for pattern in line.args:
            negated = pattern.startswith("!")
            if match_pattern(self.host, pattern[1:] if negated else pattern, ignore_case=False):
                if negated:
                    return False
                found = True
        return found

    def _match(self, line: Line) -> bool:
        args = list(line.args)
        if not args:
            raise ConfigError(f"{line.where}: Match needs criteria (e.g. Match host NAME, Match all)")
        result = True
        i = 0
        while i < len(args):
            word = args[i].lower()
            negated = word.startswith("!")
            name = word[1:] if negated else word
            if name == "all":
                result = result and not negated
                i += 1
                continue
            if name in _REFUSED_MATCH:
                raise ConfigError(f"{line.where}: Match {name} is not supported by deployctl; use Match host/user "
                                  "or set the host's settings in deployctl's YAML")
            if i + 1 >= len(args):
                raise ConfigError(f"{line.where}: Match {name} needs an argument")
            value = args[i + 1]
            i += 2
            if name == "exec":
                if not result:
                    continue  # OpenSSH skips running it once an earlier criterion failed
                raise ConfigError(f"{line.where}: Match exec {value!r}: deployctl never runs commands from "
                                  "ssh_config (plan and gpu-status promise to change nothing); use Match host/user "
                                  "or set the host's settings in deployctl's YAML")
            if name == "host":
                subject = self.options.get("hostname")
                subject = expand_hostname(subject, self.host, line.where) if subject is not None else self.host
                hit = match_pattern_list(subject, value)
            elif name == "originalhost":
                hit = match_pattern_list(self.original, value)
            elif name == "user":
                hit = match_pattern_list(self.options.get("user", _local_user()), value, ignore_case=False)
            elif name == "localuser":
                hit = match_pattern_list(_local_user(), value, ignore_case=False)
            else:
                raise ConfigError(f"{line.where}: Match {name} is not a criterion deployctl knows")
            if hit == negated:
                result = False
        return result

    def _set(self, line: Line) -> None:
        key = line.keyword
        if not line.args:
            raise ConfigError(f"{line.where}: {key} needs a value")
        if key == "identityfile":
            files = self.options.setdefault("identityfile", [])
            if line.args[0] not in files:
                files.append(line.args[0])
            self.where.setdefault(key, line.where)
            return
        if key in ("proxyjump", "proxycommand") and ("proxyjump" in self.options or "proxycommand" in self.options):
            return
        if key in self.options:
            return
        if key in _FILES:  # each argument a file (argv_split: a quoted name may hold spaces)
            if "none" in line.args and len(line.args) > 1:
                raise ConfigError(f'{line.where}: {key} "none" argument must appear alone (as ssh says)')
            self.options[key] = list(line.args)
        else:
            self.options[key] = " ".join(line.args) if key in _MULTI or key == "proxycommand" else line.args[0]
        self.where[key] = line.where
