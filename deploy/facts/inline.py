"""Bundle several host-side modules into one ``python3 -c`` program (nothing is written on the host).

The doctor sends its fact gathering inline so a doctor run leaves no file behind, even on a host
that has never seen deployctl. When that program needs code that also lives in a shipped helper
(the fixer's safetensors header reader), it embeds that module's source instead of a copy of it.

The program carries the sources zlib-compressed and base64-encoded (no quote characters, so the
two layers of shell quoting, ``sh -c`` under coreutils ``timeout`` and sshd's login shell, do not
grow it). It puts a finder first on ``sys.meta_path`` that knows each module by its dotted name
(parent packages without a source are empty packages, so a module's relative imports inside its
package work) and compiles a module only when it is first imported, then runs the ``entry``
module as ``__main__``.

Linux refuses any single argument over MAX_ARG_STRLEN (32 pages, 128 KiB) with E2BIG
("Argument list too long"); the whole remote command is one argument to the login shell, so
``inline_program`` refuses to build a program over MAX_PROGRAM_CHARS.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zlib

#: Linux's MAX_ARG_STRLEN (include/uapi/linux/binfmts.h: 32 * PAGE_SIZE)
MAX_ARG_STRLEN = 128 * 1024
#: what an inline program may use, leaving room for the command around it (interpreter, spec JSON,
#: the timeout wrapper) after two layers of quoting
MAX_PROGRAM_CHARS = 96 * 1024

# Python 3.8+, no single quotes (each costs 4 more characters per quoting layer). Modules are
# compiled when first imported (a meta path finder ahead of sys.path, so the program's modules win
# as before), not all up front: the doctor's SGLang part compiled and imported host_ops and the
# fixer's reader it never calls (about 25 ms on each of its two interpreters, every doctor run).
_LOADER = """import base64, json, sys, types, zlib
from importlib.machinery import ModuleSpec
_modules, _entry = json.loads(zlib.decompress(base64.b64decode("PAYLOAD")).decode("utf-8"))
_sources = dict(_modules)
_packages = set(n.rsplit(".", i)[0] for n in _sources for i in range(1, n.count(".") + 1))
_codes = {}
def _code(name):
    if name not in _codes:
        _codes[name] = compile(_sources[name], "<inline %s>" % name, "exec")
    return _codes[name]
CACHE
class _Inline:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name in _packages or (name in _sources and name != _entry):
            return ModuleSpec(name, cls, origin="<inline %s>" % name, is_package=name in _packages)
        return None
    @staticmethod
    def create_module(spec):
        return None
    @staticmethod
    def exec_module(module):
        name = module.__spec__.name
        if name not in _sources:
            return
        module.__file__ = "<inline %s>" % name
        exec(_code(name), module.__dict__)
sys.meta_path.insert(0, _Inline)
_main = types.ModuleType("__main__")
_main.__file__ = "<inline %s>" % _entry
_main.__package__ = _entry.rpartition(".")[0]
sys.modules["__main__"] = _main
exec(_code(_entry), _main.__dict__)
"""

# A program installed as a file (ensure-helper's host_ops.py, run some 1,500 times by one test-suite run
# and a dozen times per host by every deploy) keeps its modules' compiled code beside it, as CPython keeps
# an imported module's in __pycache__: compiling host_ops, state_files and http_plain took about 6 ms of
# each start's ~35 ms of CPU (Python 3.11, 2026-12-05). The cache is an optimisation and nothing else: a
# cache that is missing, unreadable, not this program's (KEY: the payload's sha256), torn, not the user's
# own, group- or world-writable or behind a link is not used and the modules are compiled as before; a
# write that fails (read-only, full, -B) is skipped. The file name is the one thing that marks it as
# deployctl's: stale caches of this helper (another KEY or interpreter) are removed by that name only.
_CACHE = """def _cache():
    import marshal, os, re, stat
    if not getattr(sys.implementation, "cache_tag", None):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isfile(here):  # a zipapp: __file__ is <archive>/__main__.py
        here = os.path.dirname(here)
    folder = os.path.join(here, "__pycache__")
    name = "NAME.KEY.%s.bin" % sys.implementation.cache_tag
    mine = re.compile(re.escape("NAME.") + "[0-9a-f]{16}[.][A-Za-z0-9_-]+[.]bin([.][0-9]+[.]tmp)?")
    me = os.geteuid()
    def owned(st, kind):
        return kind(st.st_mode) and st.st_uid == me and not st.st_mode & 0o022
    try:
        os.mkdir(folder, 0o700)
    except OSError:
        pass
    if not owned(os.lstat(folder), stat.S_ISDIR):
        return
    path = os.path.join(folder, name)
    header = ("deployctl-code KEY %s " % sys.implementation.cache_tag).encode("ascii")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        fd = None
    if fd is not None:
        try:
            st = os.fstat(fd)
            if not owned(st, stat.S_ISREG) or st.st_size > LIMIT:
                return
            data = b""
            while len(data) <= LIMIT:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        head, _, body = data.partition(b"\\n")
        if head == header + str(zlib.crc32(body)).encode("ascii"):
            try:
                codes = marshal.loads(body)
            except Exception:
                codes = None
            if (isinstance(codes, dict) and set(codes) == set(_sources) and
                    all(isinstance(c, types.CodeType) for c in codes.values())):
                _codes.update(codes)
                return
    if sys.dont_write_bytecode:
        return
    for n in _sources:
        _code(n)
    body = marshal.dumps(_codes)
    temporary = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, header + str(zlib.crc32(body)).encode("ascii") + b"\\n" + body)
    finally:
        os.close(fd)
    os.rename(temporary, path)
    for other in os.listdir(folder):
        full = os.path.join(folder, other)
        if other != name and mine.fullmatch(other) and owned(os.lstat(full), stat.S_ISREG):
            os.unlink(full)
try:
    _cache()
except Exception:
    pass
"""
#: the largest cache file read: the compiled host_ops bundle is about 60 KB
MAX_CACHE_BYTES = 4 << 20


class InlineProgramTooLarge(ValueError):
    pass


#: a string literal (any prefix: the letters before the quote are not part of the match; each form
#: unrolled, so the scan stays linear) or a comment; a '#' inside a string is part of the string
_STRING_OR_COMMENT = re.compile(r"""
      (?P<string> \"\"\"[^"\\]*(?:(?:\\.|"(?!""))[^"\\]*)*\"\"\"
                | '''[^'\\]*(?:(?:\\.|'(?!''))[^'\\]*)*'''
                | "[^"\\\n]*(?:\\.[^"\\\n]*)*"
                | '[^'\\\n]*(?:\\.[^'\\\n]*)*' )
    | (?P<comment> \#[^\r\n]* )
""", re.VERBOSE | re.DOTALL)


def without_comments(source: str) -> str:
    """``source`` without its comments, every line where it was and all code, strings and docstrings byte
    for byte: the same code objects (tests/hostile/test_inline_comments.py compares them marshalled,
    for every bundled module and generated sources), so a traceback from the host names the same lines.
    The remote modules explain themselves at length: the doctor's program was 64 KiB with its comments
    (over the half of MAX_ARG_STRLEN this module keeps free), and the host compiles what it gets.

    One C-level regex pass (about 0.04 ms per kB here), not tokenize, which made every deployctl run
    that builds a program pay for it: the doctor's build 64 ms instead of 17 (14 without stripping),
    status' 24 instead of 6 (Python 3.11, 2026-12-07). The Python 3.8+ sources
    shipped to hosts cannot nest a string's own quote inside an f-string (PEP 701 is 3.12), so a
    string ends where this pattern ends it."""
    if "\r" in source.replace("\r\n", ""):
        return source  # a lone CR ends a line for compile(), not for the pattern: shipped as it is
    return _STRING_OR_COMMENT.sub(r"\g<string>", source)


def inline_program(modules: list[tuple[str, str]], entry: str, cache_as: str | None = None) -> str:
    """A ``python3 -c`` program that defines ``modules`` (dotted name, source; dependencies first)
    and runs ``entry`` (one of them) as ``__main__``.

    ``cache_as``: the program is installed as a file (never for ``-c``: it needs ``__file__``) and
    keeps its modules' compiled code in ``__pycache__/<cache_as>.<key>.<tag>.bin`` beside it (_CACHE)."""
    names = [name for name, _ in modules]
    if entry not in names:
        raise ValueError(f"entry module {entry!r} is not among {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"module names repeat: {names}")
    if cache_as is not None and not re.fullmatch(r"[A-Za-z0-9_]+", cache_as):
        raise ValueError(f"cache name {cache_as!r}: letters, digits and _ only")
    shipped = [[name, without_comments(source)] for name, source in modules]
    packed = zlib.compress(json.dumps([shipped, entry]).encode("utf-8"), 9)
    payload = base64.b64encode(packed).decode("ascii")
    cache = ""
    if cache_as is not None:
        key = hashlib.sha256(payload.encode("ascii")).hexdigest()[:16]
        cache = (_CACHE.replace("NAME", cache_as).replace("KEY", key)
                 .replace("LIMIT", str(MAX_CACHE_BYTES)).rstrip("\n"))
    program = _LOADER.replace("CACHE\n", cache + "\n" if cache else "").replace("PAYLOAD", payload)
    if len(program) > MAX_PROGRAM_CHARS:
        raise InlineProgramTooLarge(
            f"the inline program for {entry} is {len(program)} characters, over {MAX_PROGRAM_CHARS} "
            f"(Linux refuses one argument over {MAX_ARG_STRLEN} bytes); ship it as a helper file instead")
    return program
