"""Quoting for every value that goes into a remote shell command.

Paths may start with ``~/`` (resolved by the host's shell): the tilde stays unquoted so the shell
expands it, the rest is one quoted word. Glob patterns keep only ``*`` and ``?`` live.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable


def quote(value: str) -> str:
    return shlex.quote(value)


def quote_path(path: str) -> str:
    if path == "~":
        return "~"
    if path.startswith("~/"):
        rest = path[2:]
        return "~/" + shlex.quote(rest) if rest else "~/"
    return shlex.quote(path)


def quote_glob(pattern: str) -> str:
    """Quote a device glob such as ``/dev/nvidia*`` so only ``*`` and ``?`` are expanded."""
    if any(ch in pattern for ch in "[]{}"):
        raise ValueError(f"glob {pattern!r}: only '*' and '?' wildcards are supported")
    prefix = ""
    if pattern.startswith("~/"):
        prefix, pattern = "~/", pattern[2:]
    pieces = re.split(r"([*?]+)", pattern)
    return prefix + "".join(p if re.fullmatch(r"[*?]+", p) else shlex.quote(p) for p in pieces if p)


def path_join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/")] + [p.strip("/") for p in parts])
