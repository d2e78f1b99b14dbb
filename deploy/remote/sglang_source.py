"""Static reading of SGLang's installed source (never imported): the parsed modules, names followed
through ``from sglang... import``, and the small expressions SGLang spells its options' choices, names
and nargs with. Standard library only, Python 3.8+; deploy/remote/sglang_cli.py reads the parser with it,
in the doctor's inline program (deploy/facts/doctor.py embeds both) and locally in the tests."""

import ast
import hashlib
import os
import stat

#: the largest source file read (0.5.12's server_args.py: 348 KB)
MAX_SOURCE_BYTES = 4 << 20
#: files one read may parse (0.5.23: server_args.py, argparse_actions, choices, utils/common, 12 field modules)
MAX_FILES = 64
MAX_TOTAL_BYTES = 16 << 20
MAX_DEPTH = 12
#: bounds on a list of choices (the facts document carries them)
MAX_CHOICES = 1024
MAX_NAME_CHARS = 200
_MUTATORS = ("append", "extend", "insert", "add", "update")


class Unreadable(Exception):
    """The source does not have a shape this reader follows."""


class _Dynamic(Exception):
    """A value computed at run time."""


def _error(exc):
    return "%s: %s" % (type(exc).__name__, exc)


class _Module(object):
    """One parsed source file: its top-level assignments, imports and classes."""

    def __init__(self, dotted, path, tree):
        self.dotted, self.path, self.tree = dotted, path, tree
        self.assigns, self.imports, self.classes, self.mutated = {}, {}, {}, set()
        self.functions = {}
        package = dotted if path.endswith("__init__.py") else dotted.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.assigns[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                self.assigns[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
        for node in ast.walk(tree):
            # a list some function extends at run time: plugins register more choices (add_*_choices)
            # (0.5.15: ``def add_quantization_method_choices(c): QUANTIZATION_CHOICES.extend(c)``;
            # 0.5.23: ``add_quantization_method_choices = QUANTIZATION_CHOICES.extend``)
            if isinstance(node, ast.Attribute) and node.attr in _MUTATORS and isinstance(node.value, ast.Name):
                self.mutated.add(node.value.id)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                self.mutated.add(node.target.id)


class _Source(object):
    """The installed package's modules, parsed on demand (bounded in number and size)."""

    def __init__(self, package_dir):
        self.package_dir = package_dir
        self.modules = {}
        self.total_bytes = 0

    def path_of(self, dotted):
        parts = dotted.split(".")
        if parts[0] != "sglang" or len(parts) < 2:
            return None
        base = os.path.join(self.package_dir, *parts[1:])
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            try:
                mode = os.stat(path).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode):
                return path
            # issue 38: a FIFO at srt/server_args.py was "not found"
            raise Unreadable("%s: not a regular file (%s)" % (path, _kind(mode)))
        return None

    def module(self, dotted):
        if dotted in self.modules:
            return self.modules[dotted]
        path = self.path_of(dotted)
        if path is None:
            self.modules[dotted] = None
            return None
        if len(self.modules) >= MAX_FILES:
            raise Unreadable("more than %d source files to follow" % MAX_FILES)
        tree, size = parse_file(path)
        self.total_bytes += size
        if self.total_bytes > MAX_TOTAL_BYTES:
            raise Unreadable("more than %d bytes of source to follow" % MAX_TOTAL_BYTES)
        self.modules[dotted] = _Module(dotted, path, tree)
        return self.modules[dotted]

    def lookup(self, module, name, depth=0):
        """(module, node) of ``name`` as seen from ``module``: a top-level assignment or class, followed
        through ``from sglang... import`` lines; (None, None) when it is not in SGLang's own source."""
        if depth > MAX_DEPTH:
            return None, None
        if name in module.classes:
            return module, module.classes[name]
        if name in module.assigns:
            return module, module.assigns[name]
        if name in module.functions:
            return module, module.functions[name]
        if name in module.imports:
            dotted, original = module.imports[name]
            other = self.module(dotted)
            if other is None:
                other = self.module(dotted + "." + original)  # ``from package import submodule``
                return (other, other.tree) if other is not None else (None, None)
            return self.lookup(other, original, depth + 1)
        return None, None


def _kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def parse_file(path):
    # non-blocking and fstat'ed first: a FIFO swapped in after path_of's stat must not hang the doctor
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise Unreadable("%s: %s" % (path, _error(exc)))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise Unreadable("%s: not a regular file (%s)" % (path, _kind(mode)))
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise Unreadable("%s: %s" % (path, _error(exc)))
    finally:
        os.close(fd)
    if len(data) > MAX_SOURCE_BYTES:
        raise Unreadable("%s is larger than %d bytes" % (path, MAX_SOURCE_BYTES))
    try:
        return ast.parse(data.decode("utf-8", "replace"), filename=path), len(data)
    except (SyntaxError, ValueError) as exc:
        raise Unreadable("%s does not parse under this Python: %s" % (path, _error(exc)))


class _Value(object):
    """Static evaluation of the small expressions SGLang spells choices, names and nargs with."""

    def __init__(self, source, module, local=None, local_mutated=None):
        self.source, self.module, self.local = source, module, local or {}
        #: local name -> the constants ``.add``/``.append`` calls put in it under a run-time condition
        #: (0.5.23: ``sampling_backend_choices.add("token_oracle")`` when an environment variable is set),
        #: or None when something else changes it
        self.local_mutated = local_mutated or {}
        self.open = False
        self.conditional = []
        #: a conditional value -> the SGLang environment variable whose ``envs.NAME.get()`` adds it
        self.condition_env = {}

    def eval(self, node, depth=0):
        if depth > MAX_DEPTH:
            raise _Dynamic("too deep")
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self.eval(e, depth + 1) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.eval(node.left, depth + 1), self.eval(node.right, depth + 1)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(left, str) and isinstance(right, str):
                return left + right
            raise _Dynamic("+ of %s and %s" % (type(left).__name__, type(right).__name__))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("list", "tuple", "sorted", "set", "frozenset") and len(node.args) == 1 and \
                not node.keywords:
            value = self.eval(node.args[0], depth + 1)
            if not isinstance(value, list):
                raise _Dynamic("%s() of a non-list" % node.func.id)
            return value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args and not node.keywords:
            return self.call_result(node.func.id, depth + 1)
        if isinstance(node, ast.ListComp):
            return self.enum_names(node, depth + 1)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self.class_attribute(node.value.id, node.attr, depth + 1)
        if isinstance(node, ast.Name):
            if node.id in self.local:
                if node.id in self.local_mutated:
                    added = self.local_mutated[node.id]
                    if added is None:
                        raise _Dynamic("%s is changed at run time" % node.id)
                    for constant, env in added:
                        if constant not in self.conditional:
                            self.conditional.append(constant)
                            self.condition_env[constant] = env
                return self.eval(self.local[node.id], depth + 1)
            module, found = self.source.lookup(self.module, node.id)
            if found is None or isinstance(found, (ast.ClassDef, ast.Module)):
                raise _Dynamic(node.id)
            if node.id in module.mutated or node.id in self.module.mutated:  # extended where defined or imported
                self.open = True
            return _Value(self.source, module).eval_into(found, self, depth + 1)
        raise _Dynamic(type(node).__name__)

    def eval_into(self, node, outer, depth):
        value = self.eval(node, depth)
        outer.open = outer.open or self.open
        outer.conditional += [a for a in self.conditional if a not in outer.conditional]
        outer.condition_env.update(self.condition_env)
        return value

    def call_result(self, name, depth):
        """What a module-level function without arguments returns, when its last statement is a
        ``return`` of a value this evaluator follows (imports inside the function included). Another
        ``return`` before it (0.5.23 ``_reasoning_parser_choices``: the registry of an already
        imported module, which a plugin may have extended) makes the list open."""
        module, found = self.source.lookup(self.module, name)
        if not isinstance(found, ast.FunctionDef) or found.args.args or not found.body or \
                not isinstance(found.body[-1], ast.Return) or found.body[-1].value is None:
            raise _Dynamic("%s()" % name)
        inner = _Value(self.source, _FunctionScope(module, found))
        value = inner.eval_into(found.body[-1].value, self, depth)
        if sum(1 for n in ast.walk(found) if isinstance(n, ast.Return)) > 1:
            # another return: only the registry of an already imported module (``sys.modules.get``) is
            # followed, as a list plugins may have extended; any other branch is not known here
            if not any(isinstance(n, ast.Attribute) and n.attr == "get" and _dotted(n.value) == "sys.modules"
                       for n in ast.walk(found)):
                raise _Dynamic("%s() returns from more than one place" % name)
            self.open = True
        return value

    def enum_names(self, node, depth):
        """``[m.name.lower() for m in SomeEnum]`` (also ``m.name``, ``.upper()``; the enum directly, or
        ``list(SomeEnum)`` returned by a function): 0.5.15/0.5.23 --kv-canary-real-data over RealKvHashMode."""
        if len(node.generators) != 1 or node.generators[0].ifs or not isinstance(node.generators[0].target, ast.Name):
            raise _Dynamic("a list comprehension")
        variable = node.generators[0].target.id
        iterated = node.generators[0].iter
        if isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and not iterated.args:
            module, found = self.source.lookup(self.module, iterated.func.id)
            if not isinstance(found, ast.FunctionDef) or not found.body or not isinstance(found.body[-1], ast.Return):
                raise _Dynamic("a list comprehension over %s()" % iterated.func.id)
            ret = found.body[-1].value
            if not (isinstance(ret, ast.Call) and _dotted(ret.func) == "list" and len(ret.args) == 1 and
                    isinstance(ret.args[0], ast.Name)):
                raise _Dynamic("a list comprehension over %s()" % iterated.func.id)
            module, enum = self.source.lookup(_FunctionScope(module, found), ret.args[0].id)
        elif isinstance(iterated, ast.Name):
            module, enum = self.source.lookup(self.module, iterated.id)
        else:
            raise _Dynamic("a list comprehension")
        if not isinstance(enum, ast.ClassDef) or \
                not any(_dotted(b) in ("Enum", "IntEnum", "StrEnum", "enum.Enum", "enum.IntEnum") for b in enum.bases):
            raise _Dynamic("a list comprehension over something that is not a plain Enum")
        members, values = [], []
        for item in enum.body:
            if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name) and \
                    not item.targets[0].id.startswith("_") and isinstance(item.value, ast.Constant):
                if item.value.value in values:
                    continue  # an alias: iterating an Enum skips it
                members.append(item.targets[0].id)
                values.append(item.value.value)
            elif not isinstance(item, (ast.Expr, ast.FunctionDef, ast.Pass)):
                raise _Dynamic("an Enum body this reader does not follow")
        element = node.elt
        methods = []
        while isinstance(element, ast.Call) and isinstance(element.func, ast.Attribute) and not element.args and \
                element.func.attr in ("lower", "upper"):
            methods.insert(0, element.func.attr)
            element = element.func.value
        if not (isinstance(element, ast.Attribute) and element.attr == "name" and isinstance(element.value, ast.Name)
                and element.value.id == variable):
            raise _Dynamic("a list comprehension this reader does not follow")
        result = []
        for member in members:
            for method in methods:
                member = member.lower() if method == "lower" else member.upper()
            result.append(member)
        return result

    def class_attribute(self, name, attr, depth):
        """``Class.ATTR`` of a class in SGLang's source whose body assigns ATTR (0.5.23 ``Backend.ALL``),
        with the class body's other names in scope."""
        module, found = self.source.lookup(self.module, name)
        if not isinstance(found, ast.ClassDef):
            raise _Dynamic("%s.%s" % (name, attr))
        body = {}
        for item in found.body:
            if isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name):
                body[item.targets[0].id] = item.value
        if attr not in body:
            raise _Dynamic("%s.%s" % (name, attr))
        return _Value(self.source, module, body).eval_into(body[attr], self, depth)


class _FunctionScope(object):
    """A module seen from inside one of its functions: the function's own ``from ... import`` lines
    come first (SGLang imports its registries lazily there)."""

    def __init__(self, module, function):
        self.__dict__.update(module.__dict__)
        self.imports = dict(module.imports)
        package = module.dotted if module.path.endswith("__init__.py") else module.dotted.rpartition(".")[0]
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (package + ("." + node.module if node.module else ""),
                                                                alias.name)



def _plain(values):
    return isinstance(values, list) and all(isinstance(c, (str, int, float, bool)) and c is not None for c in values) \
        and len(values) <= MAX_CHOICES and not any(isinstance(c, str) and len(c) > MAX_NAME_CHARS for c in values)



def _dotted(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return inner + "." + node.attr if inner else None
    return None



def _shape(node):
    """A rendering of code that is the same under every Python 3.8+ ``ast`` (Index unwrapped, no
    positions, no ``ctx``/``kind``) and ignores what does not change a verdict: docstrings and the
    texts of raised errors (f-strings, the raise's arguments)."""
    if isinstance(node, list):
        body = node
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            body = body[1:]
        return "[" + ",".join(_shape(n) for n in body) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    if hasattr(ast, "Index") and isinstance(node, getattr(ast, "Index")):
        return _shape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "(F)"
    if isinstance(node, ast.Raise):
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return "(Raise %s)" % (_dotted(exc) if exc is not None else "")
    parts = [type(node).__name__]
    for field in node._fields:
        if field in ("ctx", "kind", "type_comment", "type_params", "returns", "annotation", "decorator_list"):
            continue
        item = getattr(node, field, None)
        if item is None or item == []:
            continue
        parts.append("%s=%s" % (field, _shape(item)))
    return "(" + " ".join(parts) + ")"


def fingerprint(function):
    """The fingerprint KNOWN_TYPE_FUNCTIONS keys a function's code by."""
    return hashlib.sha256((_shape(function.args) + _shape(function.body)).encode()).hexdigest()[:16]
