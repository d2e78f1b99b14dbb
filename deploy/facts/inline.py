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
import json
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
        exec(compile(_sources[name], module.__file__, "exec"), module.__dict__)
sys.meta_path.insert(0, _Inline)
_main = types.ModuleType("__main__")
_main.__file__ = "<inline %s>" % _entry
_main.__package__ = _entry.rpartition(".")[0]
sys.modules["__main__"] = _main
exec(compile(_sources[_entry], _main.__file__, "exec"), _main.__dict__)
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
