"""extra_args read the way the installed SGLang's argparse reads them: the one place that does.

The options are the facts' one reading of the installed SGLang's parser (deploy/remote/sglang_cli.py:
option strings, nargs, choices, type). The extra-args and parallelism checks (before_stop.py) and the
checks that look for an option in extra_args (speculation.py, checks.py) all ask here, so an alias or
a unique prefix (argparse's ``allow_abbrev``, SGLang's default) counts as the option it selects.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Optional

from deploy.config.models import reserved_option_for
from deploy.doctor.verdict import DoctorInput
from deploy.facts.doctor import SglangOption

#: argparse's own option, in every parser (a unique prefix such as --hel selects it too)
HELP = ["--help", "-h"]
#: a value, not an option, for argparse's _negative_number_matcher: Python 3.8-3.12 ``^-\d+$|^-\d*\.\d+$``,
#: 3.13 ``-\.?\d`` (``-1e3`` too); the host's Python decides, so either counts (never refuse a value it takes)
NEGATIVE_NUMBER = re.compile(r"^-\.?\d")


@dataclass(frozen=True)
class Parsed:
    #: canonical option (the first of its option strings) -> value (None: a flag; several values joined by spaces)
    options: dict[str, Optional[str]]
    #: what SGLang's argparse would exit on at launch
    problems: tuple[str, ...]
    #: what it may accept or refuse (a value outside a list of choices that plugins extend)
    doubts: tuple[str, ...] = ()


def option(names: list[str], nargs: str = "1", choices: Optional[list] = None, value_type: str = "str") -> SglangOption:
    """An option as the facts carry it (for the checks' fallbacks and for tests)."""
    return SglangOption(names=names, nargs=nargs, choices=choices, open_choices=False,
                        type=value_type)  # type: ignore[arg-type]


_HELP = option(HELP, "0")
MAX_CHOICES_SHOWN = 16


def _resolve(name: str, options: list[SglangOption]) -> tuple[Optional[SglangOption], str]:
    """The option ``name`` selects, as argparse does (exact, else a unique prefix: ``allow_abbrev``,
    SGLang's default); the problem text when none or several."""
    exact = [o for o in options if name in o.names]
    if exact:
        return exact[0], ""
    prefixed = [o for o in options if any(n.startswith(name) for n in o.names)]
    if len(prefixed) == 1:
        return prefixed[0], ""
    if prefixed:
        names = sorted(n for o in prefixed for n in o.names if n.startswith(name))
        return None, f"ambiguous option {name}: it could be {', '.join(names[:6])}"
    close = difflib.get_close_matches(name, [n for o in options for n in o.names], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return None, f"unrecognized option {name}: the installed SGLang has no such option{hint}"


def _is_value(token: str) -> bool:
    """argparse reads a token as an argument, not an option string, when it does not start with '-'
    or looks like a negative number (SGLang has no option that looks like one)."""
    return not token.startswith("-") or bool(NEGATIVE_NUMBER.match(token)) or token == "-"


def _value_problem(spec: SglangOption, shown: str, value: str) -> tuple[str, str]:
    """(problem, doubt) for one value, as argparse converts it by ``type`` and checks ``choices``."""
    converted: object = value
    if spec.type in ("int", "float"):
        try:
            converted = int(value) if spec.type == "int" else float(value)
        except ValueError:
            return f"{shown} {value!r}: SGLang's argparse wants {'an integer' if spec.type == 'int' else 'a number'} " \
                   f"(invalid {spec.type} value)", ""
    if spec.choices is None or spec.type == "other" or converted in spec.choices:
        return "", ""
    allowed = ", ".join(str(c) for c in spec.choices[:MAX_CHOICES_SHOWN])
    allowed += f", ... ({len(spec.choices)} in all)" if len(spec.choices) > MAX_CHOICES_SHOWN else ""
    close = difflib.get_close_matches(value, [str(c) for c in spec.choices], n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    text = f"{shown} {value!r}: not one of its choices{hint}; allowed: {allowed}"
    if spec.open_choices:
        return "", text + " (plugins may add choices to this list, so SGLang may still accept it)"
    return f"invalid choice: {text}", ""


def _take_values(spec: SglangOption, args: list[str], i: int) -> tuple[int, Optional[str]]:
    """How many of ``args[i:]`` the option consumes as its values (argparse's nargs), or the problem."""
    following = 0
    while i + following < len(args) and _is_value(args[i + following]) and args[i + following] != "--":
        following += 1
    nargs = spec.nargs
    if nargs == "...":
        return len(args) - i, None
    if nargs in ("?", "unknown"):
        return min(1, following), None
    if nargs == "*":
        return following, None
    if nargs == "+":
        return (following, None) if following else (0, "expected at least one argument")
    count = int(nargs)
    if following < count:
        return 0, "expected one argument" if count == 1 else f"expected {count} arguments"
    return count, None


def parse_extra_args(args: list[str], options: list[SglangOption]) -> Parsed:
    """extra_args read the way SGLang's argparse reads them against the installed SGLang's options."""
    parsed: dict[str, Optional[str]] = {}
    problems: list[str] = []
    doubts: list[str] = []
    #: the option the next stray value would follow (its name as given, and how many values it takes)
    after: Optional[tuple[str, str]] = None
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        follows, after = after, None
        if token == "--":
            problems.append("a lone '--' ends SGLang's options: what follows is an unrecognized argument "
                            "(launch_server takes no positional arguments)")
            continue
        if token == "-h":
            problems.append(f"{token}: SGLang prints its help and exits 0; no server starts")
            continue
        if _is_value(token):
            if follows is not None and follows[1] == "0":
                # issue 38: "--enable-metrics yes" was "'yes' is not an option", naming no option
                problems.append(f"{follows[0]} {token}: {follows[0]} takes no value (a switch: give {follows[0]} "
                                f"alone to turn it on, or leave it out); {token!r} would be an unrecognized argument")
            elif follows is not None:
                problems.append(f"{follows[0]} {token}: {follows[0]} takes {_values_of(follows[1])}; {token!r} is one "
                                "more, an unrecognized argument")
            else:
                problems.append(f"{token!r} is not an option (a value must follow its option)")
            continue
        name, eq, explicit = token.partition("=")
        if not name.startswith("--"):
            problems.append(f"{token}: SGLang has no short options (only -h)")
            continue
        spec, problem = _resolve(name, options + [_HELP])
        if spec is _HELP:
            problems.append(f"{token}: that is --help; SGLang prints its help and exits 0, no server starts")
            continue
        if spec is None:
            problems.append(problem)
            i += 1 if not eq and i < len(args) and _is_value(args[i]) else 0
            continue
        canonical = spec.names[0]
        shown = name if name == canonical else f"{name} ({canonical})"
        if eq:
            count, missing = 0, None
            values = [explicit]
            if spec.nargs == "0":
                problems.append(f"{shown} takes no value, got {token!r} (argparse: ignored explicit argument)")
                continue
        else:
            count, missing = _take_values(spec, args, i)
            values = args[i:i + count]
            i += count
        reserved = next((reserved_option_for(n) for n in spec.names if reserved_option_for(n)), None)
        if reserved:
            problems.append(f"{token} is {canonical}, which deployctl sets itself (as {reserved}): set it through "
                            "the run's fields")
            continue
        if missing:
            problems.append(f"{shown}: {missing} (SGLang's argparse exits at launch)")
            continue
        for value in values:
            problem, doubt = _value_problem(spec, shown, value)
            problems += [problem] if problem else []
            doubts += [doubt] if doubt else []
        parsed[canonical] = " ".join(values) if values else None
        if not eq and spec.nargs not in ("*", "...", "+"):
            after = (name, spec.nargs if spec.nargs != "?" else "1")
    return Parsed(parsed, tuple(problems), tuple(doubts))


def _values_of(nargs: str) -> str:
    return "one value" if nargs in ("1", "?", "unknown") else f"{nargs} values"


def installed_options(d: DoctorInput) -> tuple[Optional[list[SglangOption]], str]:
    """The installed SGLang's options (the facts' one reading of its parser), or why there are none."""
    cli = d.sglang.cli if d.sglang is not None else None
    if cli is None:
        return None, "the installed SGLang's sources were not found"
    if cli.options is None:
        return None, f"cannot read its options from {cli.file}: {cli.error}"
    return cli.options, cli.file


def literal_option_value(args: list[str], name: str) -> Optional[str]:
    """The value of ``name`` in an argv by its exact spelling (``--name V`` or ``--name=V``; the last one
    wins, as in argparse); "" for a bare flag; None when absent. Only when SGLang's options are unknown."""
    found: Optional[str] = None
    for i, arg in enumerate(args):
        if arg == name:
            following = args[i + 1] if i + 1 < len(args) else ""
            found = "" if following.startswith("--") else following
        elif arg.startswith(name + "="):
            found = arg.split("=", 1)[1]
    return found


def extra_arg(d: DoctorInput, name: str) -> Optional[str]:
    """What SGLang would read for option ``name`` from the run's extra_args: its value, "" for a flag,
    None when absent. Any alias or unique prefix of the option counts, as in SGLang's argparse; the
    exact spelling alone when the installed SGLang's options are unknown."""
    options, _ = installed_options(d)
    if options is None:
        return literal_option_value(list(d.run.extra_args), name)
    spec, _ = _resolve(name, options)
    if spec is None:  # not an option of this version: nothing in extra_args can set it
        return None
    parsed = parse_extra_args(list(d.run.extra_args), options)
    if spec.names[0] not in parsed.options:
        return None
    value = parsed.options[spec.names[0]]
    return "" if value is None else value
