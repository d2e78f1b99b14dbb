"""SGLang's command line read from its source, the way its own parser is built, without importing it.

Standard library only, Python 3.8+; it runs under the run's sglang_python inside the doctor's inline
program (deploy/remote/doctor_facts.py) and locally in the tests. ``import sglang.srt.server_args``
pulls in torch (seconds, hundreds of MiB), so the source is read with ``ast`` instead. Two layouts,
both built by ``ServerArgs.add_cli_args(parser)`` in ``srt/server_args.py``:

* SGLang 0.5.12 and older: one literal ``parser.add_argument("--name", "--alias", ...)`` call per
  option (0.5.12: 387 calls).
* SGLang 0.5.15 and newer: ``add_cli_args_from_dataclass(parser, ServerArgs)`` first
  (``srt/arg_groups/arg_utils.py``), which turns every ``Annotated[T, Arg(...)]`` (or
  ``Annotated[T, "help"]``) field of ServerArgs into an option, then a few literal calls (0.5.23: 9).
  The fields are ServerArgs' own (0.5.15: a dataclass in server_args.py) or, from 0.5.2x, those of
  the namespace classes server_args.py collects with ``collect_input_fields([...])`` from
  ``srt/arg_groups/fields/*.py`` into ``ServerArgs.__annotations__``.

Each option carries its option strings, how many values it takes (argparse ``nargs``) and, when
the source spells them, its choices and value type. Whatever this reader cannot follow (another
layout, a computed option name, an ``Arg`` built elsewhere) makes the whole read fail with the
reason: the doctor then cannot decide (a warning), it never refuses an option it did not find.
Choices are followed where the source allows (sglang_source._Value: a function's returned list, a
class attribute, an Enum's member names); the values an ``if envs.NAME.get():`` adds are reported
apart (``conditional_choices``, ``conditional_env``); choices computed in any other way are
reported as unknown (``choices`` None, ``choices_unknown``); a list that SGLang lets plugins extend
(``add_*_choices``, a registry an imported plugin extends) is reported with ``open_choices``. The
value type: str, int, float, json (json.loads) or one of SGLang's own functions known by name and
code (KNOWN_TYPE_FUNCTIONS), else other (issue 40).
"""

import ast
import os

if __package__:  # imported locally, as deploy.remote.sglang_cli
    from .sglang_source import (MAX_CHOICES, MAX_DEPTH, MAX_NAME_CHARS, Unreadable, _Dynamic, _error,  # noqa: F401
                                _FunctionScope, _Source, _Value, _dotted, _plain, fingerprint, parse_file)
else:  # sent inline: deploy/facts/doctor.py embeds sglang_source as a top-level module
    from sglang_source import (MAX_CHOICES, MAX_DEPTH, MAX_NAME_CHARS, Unreadable, _Dynamic,  # type: ignore[no-redef]  # noqa: F401
                               _error, _FunctionScope, _Source, _Value, _dotted, _plain, fingerprint, parse_file)

#: bounds on what goes into the facts document (the SGLang part's output is read up to 1 MiB;
#: 0.5.23: 531 options, the longest choice list 60 values, about 60 KB of JSON)
MAX_OPTIONS = 4096
#: argparse actions that take no value
_NO_VALUE_ACTIONS = ("store_true", "store_false", "store_const", "append_const", "count", "help", "version")
_ARG_FIELDS = ("help", "choices", "aliases", "cli_name", "type_parser", "nargs", "required", "action",
               "action_kwargs", "const", "no_cli")
_TYPES = {"str": "str", "int": "int", "float": "float", "json.loads": "json"}
#: SGLang's own ``type=`` functions, known by name and by the shape of their code (_fingerprint: the
#: statements without docstring and message texts), each judged in deploy/doctor/sglang_options.py as
#: the function does. A function of that name with another body is "other": its values are not judged.
#: (0.5.12, 0.5.15, 0.5.23: srt/utils/common.py; parse_cuda_graph_backend_arg: model_executor/cuda_graph_config.py)
KNOWN_TYPE_FUNCTIONS = {
    ("human_readable_int", "d6720e0729948b03"): "human_readable_int",
    ("json_list_type", "8180111a37cfd738"): "orjson",  # orjson.loads: JSON without NaN or Infinity
    ("nullable_str", "f6134078a29ba5f1"): "str",
    ("parse_cuda_graph_backend_arg", "1bc80d36357b1459"): "cuda_graph_backend",
    ("parse_cuda_graph_config_arg", "543dabd6902a9631"): "cuda_graph_config",
    ("parse_cuda_graph_config_arg", "9ac76ac46d8753b6"): "cuda_graph_config",
}
#: Annotated metadata of arg_utils that is not an Arg (any other call might return one: unreadable)
_MARKERS = ("NS", "Derived")


def _constant(value, node, what):
    """The value of a node that must be a literal (an option string, a flag): else the read fails."""
    try:
        return value.eval(node)
    except _Dynamic as exc:
        raise Unreadable("%s is computed at run time (%s) at line %d" % (what, exc, getattr(node, "lineno", 0)))


def _choices(value, node):
    """(choices, open, conditional): a list of plain values, or None when computed at run time; the
    values a run-time condition adds (accepted only when it holds)."""
    if node is None or isinstance(node, ast.Constant) and node.value is None:
        return None, False, []
    value.open, value.conditional = False, []
    try:
        found = value.eval(node)
    except _Dynamic:
        return None, True, []  # computed at run time: None with open set means "unknown" (see _option callers)
    if not _plain(found) or not _plain(value.conditional):
        return None, True, []  # not a list of choices argparse users type: unknown, so never checked
    return found, value.open, [c for c in value.conditional if c not in found]


def _config_kind(action_node, nargs):
    """How SGLang's ConfigArgumentMerger treats the option's key in a --config file: "flag" (a
    _StoreTrueAction: ``key: true`` adds the flag), "value" (a _StoreAction: ``--key value``), "one"
    (another action taking one value, nargs None: 0.5.23 passes ``--key value``, 0.5.15 and older
    refuse the key), "unsupported" (refused: "Unsupported config option"). ``nargs``: the option's
    (an action's own default included; "1" stands for None here)."""
    if action_node is None or isinstance(action_node, ast.Constant) and action_node.value in (None, "store"):
        return "value"
    if isinstance(action_node, ast.Constant) and action_node.value == "store_true":
        return "flag"
    if isinstance(action_node, ast.Constant) and action_node.value not in ("append", "extend"):
        return "unsupported"
    return "one" if nargs == "1" else "unsupported"


def _option(names, nargs, choices=None, open_choices=False, value_type=("str", None), conditional=(),
            config_kind="value", choices_unknown=False):
    label, function = value_type[:2]
    return {"conditional_env": None, "config_kind": config_kind, "choices_unknown": bool(choices_unknown) and choices is None,
            "names": list(names), "nargs": nargs, "choices": choices,
            "open_choices": bool(open_choices) and choices is not None,
            "type": label if choices is not None or nargs != "0" else "str",
            "type_function": function if choices is not None or nargs != "0" else None,
            "conditional_choices": list(conditional) if choices is not None and conditional else None,
            "type_detail": value_type[2] if len(value_type) > 2 and (choices is not None or nargs != "0") else None}


def _nargs_text(value):
    if value is None:
        return "1"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if value in ("?", "*", "+", "..."):
        return value
    return "unknown"


def _action_nargs(source, module, node):
    """How many values a custom argparse action takes (its ``__init__``'s ``nargs`` default), or None.
    ``argparse.BooleanOptionalAction`` is handled by the caller (it adds ``--no-`` names)."""
    name = _dotted(node)
    if name is None or "." in name:
        return None
    found_module, found = source.lookup(module, name)
    if not isinstance(found, ast.ClassDef):
        return None
    for item in found.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            args = item.args.args + item.args.kwonlyargs
            defaults = [None] * (len(item.args.args) - len(item.args.defaults)) + list(item.args.defaults) + \
                list(item.args.kw_defaults)
            for arg, default in zip(args, defaults):
                if arg.arg == "nargs":
                    return _nargs_text(default.value) if isinstance(default, ast.Constant) else "unknown"
            return "1"
    if any(_dotted(b) in ("argparse.Action", "Action") for b in found.bases):
        return "1"  # argparse.Action's own default: one value
    return None


def _action(source, module, value, node, explicit_nargs):
    """(nargs, adds ``--no-`` names) of an ``action=`` argument."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value in _NO_VALUE_ACTIONS:
            return "0", False
        return (explicit_nargs or "1"), False  # store, append, extend
    if _dotted(node) in ("argparse.BooleanOptionalAction", "BooleanOptionalAction"):
        return "0", True
    if explicit_nargs is not None:
        return explicit_nargs, False
    return _action_nargs(source, module, node) or "unknown", False


def _type_of(source, module, node):
    """(label, function name) of a ``type=`` / ``type_parser=``: str, int, float, json (json.loads), one of
    SGLang's own functions this reader knows (KNOWN_TYPE_FUNCTIONS), else other (not judged)."""
    if node is None or isinstance(node, ast.Constant) and node.value is None:
        return "str", None
    name = _dotted(node) or ""
    if name in _TYPES:
        return _TYPES[name], None if name in ("str", "int", "float") else name
    if not name or "." in name:
        return "other", name or None
    try:
        found_module, found = source.lookup(module, name)
    except Unreadable:
        return "other", name
    if isinstance(found, ast.FunctionDef):
        label = KNOWN_TYPE_FUNCTIONS.get((name, fingerprint(found)))
        where = "%s (sglang/%s)" % (name, os.path.relpath(found_module.path, source.package_dir))
        if label == "cuda_graph_config":  # its phases: Phase.ALL of its own module
            try:
                phases = _Value(source, found_module).class_attribute("Phase", "ALL", 0)
            except (_Dynamic, Unreadable):
                return "other", where
            return (label, where, phases) if _plain(phases) else ("other", where)
        return (label or "other"), where
    return "other", name


def literal_call(source, module, value, call):
    """The option one ``parser.add_argument(...)`` call declares."""
    names = []
    for arg in call.args:
        text = _constant(value, arg, "an option string")
        if not isinstance(text, str) or not text.startswith("-"):
            raise Unreadable("add_argument with a positional argument %r at line %d" % (text, call.lineno))
        names.append(text)
    if not names:
        raise Unreadable("add_argument without option strings at line %d" % call.lineno)
    kwargs = dict((k.arg, k.value) for k in call.keywords if k.arg is not None)
    if any(k.arg is None for k in call.keywords):
        raise Unreadable("add_argument(**...) at line %d" % call.lineno)
    nargs = None
    if "nargs" in kwargs:
        raw = kwargs["nargs"]
        nargs = _nargs_text(raw.value) if isinstance(raw, ast.Constant) else "unknown"
    if "action" in kwargs:
        nargs, negated = _action(source, module, value, kwargs["action"], nargs)
    else:
        nargs, negated = nargs or "1", False
    if negated:
        names += ["--no-" + n[2:] for n in names if n.startswith("--")]
    choices, open_choices, conditional = _choices(value, kwargs.get("choices"))
    option = _option(names, nargs, choices, open_choices, _type_of(source, module, kwargs.get("type")), conditional,
                     _config_kind(kwargs.get("action"), nargs), choices is None and open_choices)
    envs = set(value.condition_env.get(c) for c in option["conditional_choices"] or ())
    option["conditional_env"] = envs.pop() if len(envs) == 1 and None not in envs else None
    return option


# ---------------------------------------------------------------------------------------------
# add_cli_args_from_dataclass (SGLang 0.5.15+, srt/arg_groups/arg_utils.py)

def _subscript(node):
    """(base name, [items]) of ``X[a, b]`` (Python 3.8 wraps the slice in ast.Index)."""
    inner = node.slice
    if hasattr(ast, "Index") and isinstance(inner, getattr(ast, "Index")):
        inner = inner.value
    items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
    return (_dotted(node.value) or "").rpartition(".")[2], items


def _annotation(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a quoted annotation
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    return node


def _unwrap_optional(node):
    """``Optional[X]``, ``Union[X, None]``, ``X | None`` -> X (SGLang's _unwrap_optional)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [p for p in (node.left, node.right) if not (isinstance(p, ast.Constant) and p.value is None)]
        return parts[0] if len(parts) == 1 else node
    if isinstance(node, ast.Subscript):
        base, items = _subscript(node)
        if base == "Optional" and len(items) == 1:
            return items[0]
        if base == "Union":
            parts = [p for p in items if not (isinstance(p, ast.Constant) and p.value is None)]
            return parts[0] if len(parts) == 1 else node
    return node


def _arg_metadata(value, items, field):
    """The ``Arg`` of an ``Annotated[T, ...]`` field as keyword nodes, or None (no CLI metadata).
    SGLang's _unwrap_annotated takes the first item that is an ``Arg`` or a ``str``."""
    for item in items:
        if isinstance(item, ast.Call) and (_dotted(item.func) or "").rpartition(".")[2] == "Arg":
            meta = dict(zip(_ARG_FIELDS, item.args))
            meta.update((k.arg, k.value) for k in item.keywords if k.arg is not None)
            if any(k.arg is None for k in item.keywords):
                raise Unreadable("field %s: Arg(**...)" % field)
            return meta
        if isinstance(item, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            if isinstance(item, ast.Constant) and not isinstance(item.value, str):
                continue
            return {}
        if isinstance(item, ast.Call) and (_dotted(item.func) or "").rpartition(".")[2] in _MARKERS:
            continue  # a marker that is no Arg (0.5.23: NS("parallel"))
        raise Unreadable("field %s: metadata %s that this reader cannot evaluate (line %d)"
                         % (field, type(item).__name__, getattr(item, "lineno", 0)))
    return None


def _is_empty_list(node):
    return isinstance(node, (ast.List, ast.Tuple)) and not node.elts or \
        isinstance(node, ast.Constant) and node.value is None


def field_option(source, module, field, annotation):
    """The option ``add_cli_args_from_dataclass`` adds for one field, or None (no Arg, or no_cli)."""
    annotation = _annotation(annotation)
    if not isinstance(annotation, ast.Subscript):
        return None
    base, items = _subscript(annotation)
    if base not in ("Annotated", "A") or len(items) < 2:
        return None
    value = _Value(source, module)
    meta = _arg_metadata(value, items[1:], field)
    if meta is None:
        return None
    if "no_cli" in meta and _constant(value, meta["no_cli"], "field %s: no_cli" % field):
        return None
    cli_name = _constant(value, meta["cli_name"], "field %s: cli_name" % field) if "cli_name" in meta else None
    aliases = _constant(value, meta["aliases"], "field %s: aliases" % field) if "aliases" in meta else None
    names = [cli_name or "--" + field.replace("_", "-")] + list(aliases or [])
    if not all(isinstance(n, str) for n in names):
        raise Unreadable("field %s: an option string that is not text" % field)
    has_parser = "type_parser" in meta and not (isinstance(meta["type_parser"], ast.Constant) and
                                                meta["type_parser"].value is None)
    explicit_nargs = None
    if "nargs" in meta:
        raw = _constant(value, meta["nargs"], "field %s: nargs" % field)
        explicit_nargs = _nargs_text(raw) if raw is not None else None
    if "action" in meta and not (isinstance(meta["action"], ast.Constant) and meta["action"].value is None):
        # the action path passes action_kwargs only: no type, no choices (unless action_kwargs has them)
        extra = {}
        if "action_kwargs" in meta:
            try:
                extra = value.eval(meta["action_kwargs"]) if not isinstance(meta["action_kwargs"], ast.Dict) else \
                    dict((value.eval(k), v) for k, v in zip(meta["action_kwargs"].keys, meta["action_kwargs"].values)
                         if k is not None)
            except _Dynamic:
                raise Unreadable("field %s: action_kwargs computed at run time" % field)
        nargs = None
        if "nargs" in extra:
            raw = extra["nargs"]
            nargs = _nargs_text(raw.value) if isinstance(raw, ast.Constant) else "unknown"
        nargs, negated = _action(source, module, value, meta["action"], nargs)
        if negated:
            names += ["--no-" + n[2:] for n in names if n.startswith("--")]
        choices, open_choices, conditional = _choices(value, extra.get("choices"))
        return _option(names, nargs, choices, open_choices, _type_of(source, module, extra.get("type")), conditional,
                       _config_kind(meta["action"], nargs), choices is None and open_choices)
    inner = _unwrap_optional(items[0])
    choices, open_choices, conditional = _choices(value, meta.get("choices"))
    unknown = choices is None and open_choices
    parser_type = _type_of(source, module, meta["type_parser"]) if has_parser else None
    if choices == []:  # ``if arg_meta.choices:`` / ``arg_meta.choices or literal_vals``: empty is none
        choices = None
    if isinstance(inner, ast.Subscript):
        inner_base, inner_items = _subscript(inner)
        if inner_base == "Literal":
            literal = [i.value for i in inner_items if isinstance(i, ast.Constant)]
            if choices is None and ("choices" not in meta or _is_empty_list(meta["choices"])):
                choices, open_choices = (literal if len(literal) == len(inner_items) else None), False
            first = type(literal[0]).__name__ if literal else "str"
            return _option(names, "1", choices, open_choices, parser_type or _inferred(first), conditional,
                           choices_unknown=choices is None)
        if inner_base in ("list", "List") and not has_parser:
            element = _unwrap_optional(inner_items[0]) if inner_items else None
            return _option(names, explicit_nargs or "+", choices, open_choices,
                           _inferred(_dotted(element) if element is not None else "str"), conditional,
                           choices_unknown=unknown)
    if _dotted(inner) == "bool":
        return _option(names, "0", config_kind="flag")
    return _option(names, explicit_nargs or "1", choices, open_choices, parser_type or _inferred(_dotted(inner)),
                   conditional, choices_unknown=unknown)


def _inferred(name):
    """arg_utils' _infer_type_func: str, int, float; anything else is parsed as str."""
    return (name, None) if name in ("str", "int", "float") else ("str", None)


def class_fields(source, module, cls, depth=0):
    """(module, field name, annotation) of a dataclass / msgspec Struct, bases first."""
    if depth > MAX_DEPTH:
        raise Unreadable("class %s: bases too deep" % cls.name)
    fields = []
    for base in cls.bases:
        name = _dotted(base)
        if name is None or "." in name:
            continue  # msgspec.Struct, typing.Generic[...]: no fields of SGLang's
        found_module, found = source.lookup(module, name)
        if isinstance(found, ast.ClassDef):
            fields += class_fields(source, found_module, found, depth + 1)
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            fields.append((module, item.target.id, item.annotation))
    return fields


def _collected_classes(source, module, cls_name):
    """The namespace classes whose fields server_args.py puts on ``cls_name`` (SGLang 0.5.2x):
    ``_annotations, ... = collect_input_fields(NAMESPACES)`` then
    ``ServerArgs.__annotations__ = {**_annotations, **ServerArgs.__annotations__}``."""
    classes = []
    for node in module.tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and
                isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == "__annotations__" and
                _dotted(node.targets[0].value) == cls_name):
            continue
        if not isinstance(node.value, ast.Dict):
            raise Unreadable("%s.__annotations__ is not a dict display (line %d)" % (cls_name, node.lineno))
        for key, item in zip(node.value.keys, node.value.values):
            if key is not None:
                raise Unreadable("%s.__annotations__ has a literal key (line %d)" % (cls_name, node.lineno))
            if _dotted(item) == cls_name + ".__annotations__":
                continue
            classes += _namespaces_behind(source, module, item, cls_name)
    return classes


def _namespaces_behind(source, module, item, cls_name):
    name = _dotted(item)
    for node in module.tree.body:
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
        if not any(_dotted(t) == name for t in targets):
            continue
        call = node.value
        if (_dotted(call.func) or "").rpartition(".")[2] != "collect_input_fields" or len(call.args) != 1:
            break
        listed = call.args[0]
        if isinstance(listed, ast.Name) and listed.id in module.assigns:
            listed = module.assigns[listed.id]
        if not isinstance(listed, (ast.List, ast.Tuple)):
            break
        found = []
        for element in listed.elts:
            element_module, cls = source.lookup(module, _dotted(element) or "")
            if not isinstance(cls, ast.ClassDef):
                raise Unreadable("namespace class %s of %s not found in SGLang's source"
                                 % (_dotted(element), cls_name))
            found.append((element_module, cls))
        return found
    raise Unreadable("%s.__annotations__ takes %s from code this reader does not follow" % (cls_name, name))


def dataclass_options(source, module, call):
    """The options ``add_cli_args_from_dataclass(parser, Cls[, fields=[...]])`` adds."""
    if len(call.args) != 2:
        raise Unreadable("add_cli_args_from_dataclass with %d positional arguments (line %d)"
                         % (len(call.args), call.lineno))
    cls_name = _dotted(call.args[1])
    only = None
    for keyword in call.keywords:
        if keyword.arg == "fields":
            only = _constant(_Value(source, module), keyword.value, "add_cli_args_from_dataclass fields=")
    cls_module, cls = source.lookup(module, cls_name or "")
    if not isinstance(cls, ast.ClassDef):
        raise Unreadable("class %s of add_cli_args_from_dataclass not found" % cls_name)
    fields = class_fields(source, cls_module, cls)
    for ns_module, ns_class in _collected_classes(source, cls_module, cls_name):
        fields += class_fields(source, ns_module, ns_class)
    options, seen = [], set()
    for field_module, name, annotation in fields:
        if name in seen or (only is not None and name not in only):
            continue
        seen.add(name)
        option = field_option(source, field_module, name, annotation)
        if option is not None:
            options.append(option)
    if not options:
        raise Unreadable("class %s has no Annotated[..., Arg(...)] fields" % cls_name)
    return options


# ---------------------------------------------------------------------------------------------

def _env_conditions(function):
    """call node -> NAME for the calls under ``if envs.NAME.get():`` (0.5.23: ``sampling_backend_choices.add(
    "token_oracle")`` when SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE is set: SGLang's EnvBool)."""
    found = {}
    for node in ast.walk(function):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Call) and not test.args and isinstance(test.func, ast.Attribute) and \
                test.func.attr == "get" and isinstance(test.func.value, ast.Attribute) and \
                _dotted(test.func.value.value) == "envs":
            for statement in node.body:
                for inner in ast.walk(statement):
                    if isinstance(inner, ast.Call):
                        found[inner] = test.func.value.attr
    return found


def _add_cli_args(module):
    """``ServerArgs.add_cli_args``: the function launch_server's parser is built by."""
    cls = module.classes.get("ServerArgs")
    if cls is not None:
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "add_cli_args":
                return item
    raise Unreadable("no ServerArgs.add_cli_args in it")


def read_options(package_dir):
    """SGLang's options from ``package_dir`` (the ``sglang`` package directory): the facts document
    ``{"file", "options": [{"names", "nargs", "choices", "open_choices", "type", "type_function",
    "conditional_choices"}] | None, "error",
    "layout": "literal" | "dataclass" | None}``."""
    path = os.path.join(package_dir, "srt", "server_args.py")
    result = {"file": path, "options": None, "error": None, "layout": None}
    source = _Source(package_dir)
    try:
        module = source.module("sglang.srt.server_args")
        if module is None:
            raise Unreadable("%s: not found" % path)
        function = _add_cli_args(module)
        local = {}
        local_mutated = {}
        conditions = _env_conditions(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                local[node.targets[0].id] = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.attr in ("add", "append", "extend", "update"):
                name = node.func.value.id
                single = node.func.attr in ("add", "append") and len(node.args) == 1 and not node.keywords and \
                    isinstance(node.args[0], ast.Constant)
                if single and local_mutated.get(name, []) is not None:
                    local_mutated[name] = local_mutated.get(name, []) + [(node.args[0].value, conditions.get(node))]
                else:
                    local_mutated[name] = None
        value = _Value(source, module, local, local_mutated)
        options, layout = [], "literal"
        calls = sorted((n for n in ast.walk(function) if isinstance(n, ast.Call)),
                       key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            name = _dotted(call.func) or ""
            if name.rpartition(".")[2] == "add_cli_args_from_dataclass":
                options += dataclass_options(source, module, call)
                layout = "dataclass"
            elif isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
                options.append(literal_call(source, module, value, call))
        if not options:
            raise Unreadable("ServerArgs.add_cli_args adds no option this reader recognises")
        if len(options) > MAX_OPTIONS:
            raise Unreadable("more than %d options" % MAX_OPTIONS)
        long_names = [n for o in options for n in o["names"] if len(n) > MAX_NAME_CHARS]
        if long_names:
            raise Unreadable("an option string of %d characters" % len(long_names[0]))
        result.update(options=options, layout=layout)
    except Unreadable as exc:
        result["error"] = str(exc)
    except RecursionError:
        result["error"] = "the source nests deeper than this reader follows"
    except Exception as exc:  # a shape no test has seen: the doctor cannot decide, its other facts still count
        result["error"] = "the reader did not follow this source (%s)" % _error(exc)
    return result
