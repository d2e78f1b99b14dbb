"""What ``importlib.metadata`` answers about the installed SGLang, without importing it when a plain
look at ``sys.path`` can tell. Standard library only, Python 3.8+, run on the GPU host (doctor's SGLang
part, under the run's sglang_python).

Why: ``import importlib.metadata`` pulls in ``email`` (and through it ``socket``, ``datetime``,
``urllib``), ``zipfile``, ``pathlib`` and ``csv``: 27 of the 70 ms of CPU the doctor's SGLang part took
on every host and every run (Python 3.11, 2026-12-07), and ``entry_points()`` then parses the
entry_points.txt of every distribution on the path (hundreds in a real SGLang environment).

Exactness: each answer here is either the one importlib.metadata would give, by a rule that holds for
every version of it (3.8 to 3.13), or ``None``, and then the caller asks importlib.metadata itself.

* Entry points of a group can only come from an ``entry_points.txt`` in a distribution's metadata
  directory (``*.dist-info``, ``*.egg-info``, an ``.egg``'s ``EGG-INFO``) in a directory on
  ``sys.path``, and only when that text contains the group's name (a section is ``[group]``). So when
  no such file mentions any of the groups, the answer is "none"; any other case (a path entry that is
  a file, such as a zip; an ``.egg`` entry; another finder on ``sys.meta_path`` that can list
  distributions; an unreadable file; a mention) is importlib.metadata's to answer.
* The version: when exactly one metadata directory on the whole path could be SGLang's under any
  version's name rules, its name is the canonical ``sglang-<version>.dist-info``, and its ``METADATA``
  is plain (header lines as email reads them, LF line ends, one ``Version`` header with nothing folded into it),
  its value is what ``email`` would give for the ``Version`` header. Anything else: importlib.metadata.
"""

import os
import sys

if __package__:  # imported locally, as deploy.remote.package_metadata
    from .state_files import read_regular
else:  # inline, beside state_files (deploy/facts/doctor.py)
    from state_files import read_regular  # type: ignore[no-redef]

_INFO_SUFFIXES = (".dist-info", ".egg-info")
#: a wheel's canonical metadata directory for SGLang (PEP 427/491: the normalised name, the version)
_VERSION_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+!_")
#: what email's feedparser takes as a header name (headerRE: printable ASCII but ':' and space)
_HEADER_NAME_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F) if c != 0x3A)
#: str.splitlines' line boundaries but LF (email's feedparser splits on some of them in some versions)
_OTHER_LINE_ENDS = ("\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_MAX_METADATA_BYTES = 4 << 20
_MAX_ENTRY_POINTS_BYTES = 1 << 20


class Undecided(Exception):
    """The plain look cannot tell: importlib.metadata must answer."""


def _path_finders_only():
    """True when no finder but the standard path finder could list distributions (importlib.metadata
    asks every finder on sys.meta_path that has ``find_distributions``)."""
    import importlib.machinery

    for finder in sys.meta_path:
        if getattr(finder, "find_distributions", None) is None:
            continue
        if finder is not importlib.machinery.PathFinder:
            return False
    return True


def metadata_dirs():
    """Every metadata directory importlib.metadata could read on sys.path, in path order:
    (directory path, name lowercased). Raises Undecided where the plain look cannot list them."""
    if not _path_finders_only():
        raise Undecided("another finder lists distributions")
    found = []
    for entry in sys.path:
        root = entry or "."
        if not isinstance(entry, str) or os.path.basename(root).lower().endswith(".egg"):
            raise Undecided("an .egg or non-text path entry")
        try:
            children = os.listdir(root)
        except FileNotFoundError:
            continue  # nothing there: importlib.metadata finds nothing either
        except OSError:
            raise Undecided("path entry %r cannot be listed as a directory" % entry)
        for child in children:
            low = child.lower()
            if low.endswith(_INFO_SUFFIXES):
                found.append((os.path.join(root, child), low))
    return found


def _read(path, limit):
    """The text of a file, or None when there is none; Undecided for anything but a regular UTF-8 file
    within ``limit`` (state_files.read_regular: a FIFO planted there never blocks the look)."""
    text, problem = read_regular(path, limit)
    if problem is not None:
        raise Undecided(problem)
    if text is not None and "\ufffd" in text:  # read_regular decodes with "replace"; importlib.metadata strictly
        raise Undecided("%s is not UTF-8 (or holds U+FFFD)" % path)
    return text


def no_entry_points(groups):
    """True when no distribution on sys.path declares an entry point in any of ``groups``;
    None when only importlib.metadata can tell."""
    try:
        for directory, _ in metadata_dirs():
            text = _read(os.path.join(directory, "entry_points.txt"), _MAX_ENTRY_POINTS_BYTES)
            if text is not None and any(group in text for group in groups):
                return None
    except Undecided:
        return None
    return True


def _could_be_sglang(low):
    """A metadata directory name (lowercased) that some version's rules might read as SGLang's: the
    name before the version, separators left out, is ``sglang`` (3.8's pattern, 3.9's and 3.10's
    ``matches``, 3.11+'s PEP 503 ``normalize`` each accept a subset of these)."""
    name = low.rpartition(".")[0].partition("-")[0]
    return name.replace(".", "").replace("_", "") == "sglang"


def header_value(text, name):
    """The value email's parser gives header ``name`` of a plain METADATA text; Undecided otherwise."""
    block, blank, _ = text.partition("\n\n")
    if not blank and block.endswith("\n"):  # headers only, no body
        block = block[:-1]
    if any(mark in block for mark in _OTHER_LINE_ENDS):  # where email's parsers (by version) may split
        raise Undecided("a line end other than LF in the header block")
    values = []
    lines = block.split("\n")
    for index, line in enumerate(lines):
        if line[:1] in (" ", "\t"):
            continue  # a folded line of the header above
        field, colon, value = line.partition(":")
        if not colon or not field or not set(field) <= _HEADER_NAME_CHARS:
            raise Undecided("line %d is not a header" % (index + 1))
        if field.lower() == name.lower():
            if index + 1 < len(lines) and lines[index + 1][:1] in (" ", "\t"):
                raise Undecided("the %s header is folded" % name)
            values.append(value.lstrip(" \t"))
    if len(values) != 1:
        raise Undecided("%d %s headers" % (len(values), name))
    return values[0]


def plain_sglang_version():
    """SGLang's version as ``importlib.metadata.version("sglang")`` gives it, or None when only
    importlib.metadata can tell."""
    try:
        candidates = [(d, low) for d, low in metadata_dirs() if _could_be_sglang(low)]
        if len(candidates) != 1:
            return None
        directory, low = candidates[0]
        name = os.path.basename(directory)
        version = name[len("sglang-"):-len(".dist-info")]
        if not (name.startswith("sglang-") and name.endswith(".dist-info") and version
                and set(version) <= _VERSION_CHARS and "-" not in version):
            return None
        text = _read(os.path.join(directory, "METADATA"), _MAX_METADATA_BYTES)
        if not text:  # empty or missing: importlib.metadata goes on to PKG-INFO
            return None
        return header_value(text, "Version")
    except Undecided:
        return None


def sglang_version():
    """(version, error) as ``importlib.metadata.version("sglang")`` answers, asking it only when the
    plain look cannot tell."""
    version = plain_sglang_version()
    if version is not None:
        return version, None
    try:
        import importlib.metadata as metadata
    except ImportError:  # Python 3.7 and older: importlib_metadata is not stdlib
        return None, "importlib.metadata needs Python 3.8+"
    try:
        return metadata.version("sglang"), None
    except Exception as exc:  # PackageNotFoundError, or a broken dist-info
        return None, "%s: %s" % (type(exc).__name__, exc)
