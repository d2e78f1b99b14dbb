"""SIMULATED sglang.srt.arg_groups.arg_utils (deployctl sandbox TEST DOUBLE): options from dataclass fields.

The rules of the published SGLang 0.5.15 wheel's ``add_cli_args_from_dataclass`` (0.5.23's are the
same on a msgspec Struct): every ``Annotated[T, Arg(...)]`` (or ``Annotated[T, "help"]``) field is
an option ``--field-name`` (or ``Arg.cli_name``) plus ``Arg.aliases``; ``Arg.no_cli`` skips it;
``Arg.action`` passes only ``action_kwargs``; ``Literal[...]`` gives the choices; ``list[X]`` takes
``nargs`` (``+`` unless set); ``bool`` is ``store_true``; a field without a default is required.
Only the standard library (SGLang 0.5.15 itself used a dataclass; no msgspec needed here).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Annotated, Any, Callable, Literal, Optional, Union, get_args, get_origin, get_type_hints

A = Annotated


@dataclasses.dataclass(frozen=True)
class Arg:
    """CLI argument metadata attached to a dataclass field via ``Annotated``."""

    help: str = ""
    choices: Optional[list] = None
    aliases: Optional[list[str]] = None
    cli_name: Optional[str] = None
    type_parser: Optional[Callable] = None
    nargs: Optional[str] = None
    required: Optional[bool] = None
    action: Optional[Any] = None
    action_kwargs: Optional[dict] = None
    const: Optional[Any] = None
    no_cli: bool = False
    resolvable: bool = False


def _unwrap_annotated(tp):
    if get_origin(tp) is Annotated:
        args = get_args(tp)
        for a in args[1:]:
            if isinstance(a, Arg):
                return args[0], a
            if isinstance(a, str):
                return args[0], Arg(help=a)
        return args[0], None
    return tp, None


def _unwrap_optional(tp):
    origin = get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        non_none = [a for a in get_args(tp) if a is not type(None)]
        if len(non_none) == 1:
            return non_none[0], True
    return tp, False


def _infer_type_func(tp):
    return tp if tp in (str, int, float) else str


def add_cli_args_from_dataclass(parser, cls, *, fields: Optional[list[str]] = None):
    hints = get_type_hints(cls, include_extras=True)
    for field in dataclasses.fields(cls):
        if fields is not None and field.name not in fields:
            continue
        hint = hints.get(field.name)
        if hint is None:
            continue
        raw_type, meta = _unwrap_annotated(hint)
        if meta is None or meta.no_cli:
            continue
        cli_name = meta.cli_name or "--" + field.name.replace("_", "-")
        names = [cli_name] + (meta.aliases or [])
        missing = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        default = {} if missing else {"default": field.default if field.default is not dataclasses.MISSING
                                      else field.default_factory()}
        dest = {"dest": field.name} if field.name != cli_name.lstrip("-").replace("-", "_") else {}
        if meta.action is not None:
            parser.add_argument(*names, action=meta.action, help=meta.help, **dest, **default,
                                **(meta.action_kwargs or {}))
            continue
        inner, _ = _unwrap_optional(raw_type)
        if get_origin(inner) is Literal:
            values = list(get_args(inner))
            parser.add_argument(*names, type=meta.type_parser or _infer_type_func(type(values[0])),
                                choices=meta.choices or values, help=meta.help, **dest, **default)
            continue
        if get_origin(inner) is list and meta.type_parser is None:
            elem = (get_args(inner) or (str,))[0]
            extra = {"choices": meta.choices} if meta.choices else {}
            parser.add_argument(*names, type=_infer_type_func(elem), nargs=meta.nargs or "+", help=meta.help,
                                **dest, **default, **extra)
            continue
        if inner is bool:
            parser.add_argument(*names, action="store_true", help=meta.help, **dest, **default)
            continue
        extra = {"choices": meta.choices} if meta.choices else {}
        if meta.nargs:
            extra["nargs"] = meta.nargs
        if meta.required is True or (meta.required is None and missing):
            extra["required"] = True
        parser.add_argument(*names, type=meta.type_parser or _infer_type_func(inner), help=meta.help,
                            **dest, **default, **extra)
