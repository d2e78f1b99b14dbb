"""Text from hosts and from local state files, made safe to print on a terminal.

A server log, an nvidia-smi process name, a history record or an error quoting host output may
carry terminal control sequences: ``ESC]0;...`` retitles the window, ``ESC]52;...`` writes the
clipboard, ``ESC[2K`` plus CR rewrites the line above (a log line forging deployctl's own
``12:00:00 [host] step: ok``). Before such text reaches a terminal every C0 control (but newline
and tab where the text is multi-line), DEL, every C1 control and the bidi overrides that make text
display as something else are shown escaped (``\\x1b``, ``\\r``, ``\\u202e``); the text itself stays
readable. ``--json`` output is not passed through here: it carries the raw text as JSON strings
(json.dumps escapes controls itself).
"""

from __future__ import annotations

import re

from deploy.base.secrets import mask_text

#: bidi overrides/isolates, line/paragraph separators, BOM (as deploy/base/limits.py refuses in paths)
_INVISIBLE = "\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff"
_UNSAFE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")
_UNSAFE_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    ch = match.group(0)
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_line(text: object) -> str:
    """One line: every control character escaped, newlines included; API keys masked (secrets.py)."""
    return _UNSAFE_LINE.sub(_escape, mask_text(str(text)))


def safe_text(text: object) -> str:
    """Several lines: newlines and tabs kept, every other control character escaped (CR too); API keys
    masked (secrets.py)."""
    return _UNSAFE_TEXT.sub(_escape, mask_text(str(text)))


#: ECMA-48 sequences: CSI (ESC [ params final), OSC / DCS / APC / PM / SOS strings (to BEL or ST),
#: and the two-byte ESC forms; the same with the 8-bit C1 introducers (CSI 0x9b, OSC 0x9d, ...)
_SEQUENCES = re.compile(
    "(?:\x1b\\[|\x9b)[0-?]*[ -/]*[@-~]"
    "|(?:\x1b[\\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\\\|\x9c)?"
    "|\x1b[ -/]*[0-~]")


def strip_escapes(text: object) -> str:
    """Host text (a log tail) without its terminal sequences: smg 1.13 colours its log file
    (``ESC[2m2026-...ESC[0m ESC[32m INFO``), and a message quoting it should read as the words.
    Whole sequences go, then any control left but newline and tab (CR, a lone ESC, C1)."""
    return _UNSAFE_TEXT.sub("", _SEQUENCES.sub("", str(text)).replace("\r\n", "\n"))


class SafeStream:
    """A text stream that escapes what it is given (a pty's CR LF becomes LF first), for ``logs -f``."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._cr = False

    def write(self, text: str) -> int:
        if self._cr:
            text = "\r" + text
        self._cr = text.endswith("\r")
        if self._cr:
            text = text[:-1]
        self._stream.write(safe_text(text.replace("\r\n", "\n")))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()
