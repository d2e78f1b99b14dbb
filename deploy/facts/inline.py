"""Bundle several host-side modules into one ``python3 -c`` program (nothing is written on the host).

The doctor sends its fact gathering inline so a doctor run leaves no file behind, even on a host
that has never seen deployctl. When that program needs code that also lives in a shipped helper
(the fixer's safetensors header reader), it embeds that module's source instead of a copy of it.

The program carries the sources zlib-compressed and base64-encoded (no quote characters, so the
two layers of shell quoting, ``sh -c`` under coreutils ``timeout`` and sshd's login shell, do not
grow it). It registers each module in ``sys.modules`` under its dotted name (parent packages are
created empty, so a module's relative imports inside its package work), executes them in the
given order and then runs the ``entry`` module as ``__main__``.

Linux refuses any single argument over MAX_ARG_STRLEN (32 pages, 128 KiB) with E2BIG
("Argument list too long"); the whole remote command is one argument to the login shell, so
``inline_program`` refuses to build a program over MAX_PROGRAM_CHARS.
"""

from __future__ import annotations

import base64
import json
import zlib

#: Linux's MAX_ARG_STRLEN (include/uapi/linux/binfmts.h: 32 * PAGE_SIZE)
MAX_ARG_STRLEN = 128 * 1024
#: what an inline program may use, leaving room for the command around it (interpreter, spec JSON,
#: the timeout wrapper) after two layers of quoting
MAX_PROGRAM_CHARS = 96 * 1024

# Python 3.8+, no single quotes (each costs 4 more characters per quoting layer).
_LOADER = """import base64, json, sys, types, zlib
def _package(name):
    if name in sys.modules:
        return
    parent, _, leaf = name.rpartition(".")
    if parent:
        _package(parent)
    module = types.ModuleType(name)
    module.__path__ = []
    module.__package__ = name
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], leaf, module)
def _load(name, source, as_name):
    parent, _, leaf = name.rpartition(".")
    if parent:
        _package(parent)
    module = types.ModuleType(as_name)
    module.__file__ = "<inline %s>" % name
    module.__package__ = parent
    sys.modules[as_name] = module
    if parent and as_name == name:
        setattr(sys.modules[parent], leaf, module)
    exec(compile(source, module.__file__, "exec"), module.__dict__)
_modules, _entry = json.loads(zlib.decompress(base64.b64decode("PAYLOAD")).decode("utf-8"))
for _name, _source in _modules:
    if _name != _entry:
        _load(_name, _source, _name)
_load(_entry, dict(_modules)[_entry], "__main__")
"""


class InlineProgramTooLarge(ValueError):
    pass


def inline_program(modules: list[tuple[str, str]], entry: str) -> str:
    """A ``python3 -c`` program that defines ``modules`` (dotted name, source; dependencies first)
    and runs ``entry`` (one of them) as ``__main__``."""
    names = [name for name, _ in modules]
    if entry not in names:
        raise ValueError(f"entry module {entry!r} is not among {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"module names repeat: {names}")
    packed = zlib.compress(json.dumps([list(modules), entry]).encode("utf-8"), 9)
    program = _LOADER.replace("PAYLOAD", base64.b64encode(packed).decode("ascii"))
    if len(program) > MAX_PROGRAM_CHARS:
        raise InlineProgramTooLarge(
            f"the inline program for {entry} is {len(program)} characters, over {MAX_PROGRAM_CHARS} "
            f"(Linux refuses one argument over {MAX_ARG_STRLEN} bytes); ship it as a helper file instead")
    return program
