"""SGLang's API keys, masked wherever deployctl prints an argv, a plan, a reason or a JSON document.

``--admin-api-key KEY`` and ``--api-key KEY`` are SGLang launch options (``extra_args``); they were
printed by ``plan``, ``up --dry-run``, ``restart --json`` and in a reload's reason ("drops
--admin-api-key KEY", issue 38). One function per shape, used at every place output leaves
deployctl: ``deploy/base/terminal.py`` (every text line), ``deploy/render/report.py`` ``print_json``
(every ``--json`` document) and the history rows. The value is replaced by ``***``; the flag stays,
so a reader still sees that the server has a key.

SGLang's own spelling is masked too: ``api_key='KEY'`` in the ServerArgs its log prints at start-up
(``deployctl logs``), ``"api_key": "KEY"`` in /server_info's JSON. The forms recognised: an argv list (``["--api-key", "KEY"]``, ``"--api-key=KEY"``), and text quoting
one: ``--api-key KEY``, ``--api-key=KEY``, shell-quoted (``--api-key 'K Y'``, ``'\\''`` and ``'"'"'``
inside), a JSON or Python list (``"--api-key", "KEY"``).
"""

from __future__ import annotations

import re
from typing import Any

#: SGLang options whose value is a secret (srt/server_args.py: api_key, admin_api_key)
SECRET_FLAGS = ("--admin-api-key", "--api-key")
MASK = "***"

_FLAG = re.compile(r"(?<![\w-])--(?:admin-api-key|api-key)(?![\w-])")
_QUOTES = "'\""


def _closing(text: str, i: int, quote: str) -> int:
    """The index of the quote that closes a string opened just before ``i`` (len(text): none).
    Backslash escapes (JSON, repr) and the shell's ``'"'"'`` / ``'\\''`` inside single quotes are skipped."""
    j = i
    while j < len(text):
        c = text[j]
        if c == "\\" and quote == '"':
            j += 2
            continue
        if c == "\\" and quote == "'" and text.startswith("\\'", j) and not text.startswith("\\''", j):
            j += 2  # repr's \' inside a single-quoted str
            continue
        if c == quote:
            if quote == "'" and text.startswith("'\"'\"'", j):
                j += 5
                continue
            if quote == "'" and text.startswith("'\\''", j):
                j += 4
                continue
            return j
        j += 1
    return len(text)


def _value_span(text: str, flag_start: int, flag_end: int) -> tuple[int, int] | None:
    """Where the value of the flag at ``text[flag_start:flag_end]`` is, by what quotes the flag."""
    opened = text[flag_start - 1] if flag_start > 0 and text[flag_start - 1] in _QUOTES else ""
    after = text[flag_end:flag_end + 1]
    if after == "=":
        start = flag_end + 1
        if opened:  # "--api-key=VALUE" as one quoted element: up to its closing quote
            return start, _closing(text, start, opened)
        if text[start:start + 1] in _QUOTES and text[start:start + 1]:
            return start, min(len(text), _closing(text, start + 1, text[start]) + 1)
        end = start
        while end < len(text) and not text[end].isspace():
            end += 1
        return start, end
    if opened and after == opened:  # a list: "--api-key", "VALUE" (or repr's mixed quotes)
        match = re.compile(r"\s*,\s*(['\"])").match(text, flag_end + 1)
        if match is None:
            return None
        return match.end(), _closing(text, match.end(), match.group(1))
    if not opened and after[:1].isspace():
        start = flag_end
        while start < len(text) and text[start].isspace():
            start += 1
        if start >= len(text):
            return None
        if text[start] in _QUOTES:  # shell- or JSON-quoted
            return start, min(len(text), _closing(text, start + 1, text[start]) + 1)
        end = start
        while end < len(text) and not text[end].isspace():
            end += 1
        while end > start + 1 and text[end - 1] in ";,)]":  # prose: "drops --api-key KEY; adds ..."
            end -= 1
        if text[start:end].startswith("--"):
            return None  # the flag without a value, then the next option
        return start, end
    return None


#: the same keys as SGLang names its fields: the ServerArgs repr its log prints at start-up
#: (``api_key='KEY', admin_api_key='KEY'``), /server_info's JSON (``"api_key": "KEY"``)
SECRET_FIELDS = ("admin_api_key", "api_key")
_FIELD = re.compile(r"(?<![\w])(?P<key>[\"']?(?:admin_api_key|api_key)[\"']?\s*[=:]\s*)"
                    r"(?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")


def mask_text(text: str) -> str:
    """``text`` with the value after every secret flag (or SGLang field) replaced by ``***``."""
    if "api_key" in text:
        text = _FIELD.sub(lambda m: m.group("key") + m.group("value")[0] + MASK + m.group("value")[0], text)
    if "-api-key" not in text:
        return text
    out, done = [], 0
    for match in _FLAG.finditer(text):
        if match.start() < done:
            continue
        span = _value_span(text, match.start(), match.end())
        if span is None or span[1] <= span[0]:
            continue
        out += [text[done:span[0]], MASK]
        done = span[1]
    return "".join(out) + text[done:]


def mask_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """An argv with the element after a secret flag (and ``--flag=value``'s value) masked."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append(MASK)
            hide = False
            continue
        hide = arg in SECRET_FLAGS
        flag, eq, _ = arg.partition("=")
        out.append(f"{flag}={MASK}" if eq and flag in SECRET_FLAGS else mask_text(arg))
    return out


def mask_secrets(value: Any) -> Any:
    """A JSON-like document with every secret value masked: strings as text, lists as argvs."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, (list, tuple)):
        if any(isinstance(item, str) and item.partition("=")[0] in SECRET_FLAGS for item in value):
            value = [mask_argv([item])[0] if isinstance(item, str) else item for item in value]
            masked: list[Any] = []
            hide = False
            for item in value:
                masked.append(MASK if hide and isinstance(item, str) else mask_secrets(item))
                hide = isinstance(item, str) and item in SECRET_FLAGS
            return masked
        return [mask_secrets(item) for item in value]
    if isinstance(value, dict):
        return {key: MASK if key in SECRET_FIELDS and isinstance(item, str) and item else mask_secrets(item)
                for key, item in value.items()}
    return value
