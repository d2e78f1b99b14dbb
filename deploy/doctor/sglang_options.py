"""extra_args read the way the installed SGLang's argparse reads them: the one place that does.

The options are the facts' one reading of the installed SGLang's parser (deploy/remote/sglang_cli.py:
option strings, nargs, choices, type). The extra-args and parallelism checks (before_stop.py) and the
checks that look for an option in extra_args (speculation.py, checks.py) all ask here, so an alias or
a unique prefix (argparse's ``allow_abbrev``, SGLang's default) counts as the option it selects.

Each value is judged as argparse does (issue 40): converted by the option's type (int, float, json.loads
and SGLang's own functions the reader knows: human_readable_int, json_list_type, ...), then checked
against its choices; a list plugins extend is refused only when the host has no SGLang plugin (Context:
the entry points the SGLang part found); a ``--config FILE`` is merged first as prepare_server_args does
(the host's reading of the file, config_argv). What cannot be judged is a doubt (a warning), never a pass.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Optional

from deploy.config.models import reserved_option_for
from deploy.doctor.verdict import DoctorInput
from deploy.facts.doctor import ConfigFileFacts, PluginFacts, SglangOption

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


@dataclass(frozen=True)
class Context:
    """What decides a value beyond the option list: the plugins installed for sglang_python (a list
    they may extend), the --config file as the host read it, the SGLang version (the merger's rules)."""

    plugins: Optional[PluginFacts] = None
    config: Optional[ConfigFileFacts] = None
    version: Optional[str] = None
    #: SGLang variables that add choices, as the server will see them (host environment, then the run's
    #: env file); a name missing here is unknown
    env: Optional[dict[str, Optional[str]]] = None


def option(names: list[str], nargs: str = "1", choices: Optional[list] = None, value_type: str = "str") -> SglangOption:
    """An option as the facts carry it (for the checks' fallbacks and for tests)."""
    return SglangOption(names=names, nargs=nargs, choices=choices, open_choices=False,
                        type=value_type)  # type: ignore[arg-type]


_HELP = option(HELP, "0")
MAX_CHOICES_SHOWN = 16


def _close(word: str, candidates: list[str], count: int) -> list[str]:
    """The nearest candidates (difflib), among those of about the same length (and, for an option,
    the same first two letters) only: difflib over SGLang's ~1,000 option strings is slow."""
    head = word[:4] if word.startswith("--") else ""  # an option: its first letter counts (typos are later)
    near = [c for c in candidates if abs(len(c) - len(word)) <= max(3, len(word) // 2) and c.startswith(head)]
    return difflib.get_close_matches(word, near, n=count)


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
    close = _close(name, [n for o in options for n in o.names], 3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return None, f"unrecognized option {name}: the installed SGLang has no such option{hint}"


def _is_value(token: str) -> bool:
    """argparse reads a token as an argument, not an option string, when it does not start with '-'
    or looks like a negative number (SGLang has no option that looks like one)."""
    return not token.startswith("-") or bool(NEGATIVE_NUMBER.match(token)) or token == "-"


#: SGLang's human_readable_int (srt/utils/common.py, the same code in 0.5.12, 0.5.15 and 0.5.23)
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(value: str) -> int:
    value = value.strip()
    match = _HUMAN.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise ValueError(f"decimals are not allowed with IEC suffixes like {suffix!r}")
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(value)
    except ValueError:
        raise ValueError("a plain integer, an SI suffix (1k, 1M) or an IEC suffix (1Ki, 1Mi), case-sensitive")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def orjson_loads(value: str) -> Any:
    """orjson.loads (SGLang's json_list_type): JSON without NaN, Infinity, out-of-range floats or lone
    surrogates."""
    loaded = json.loads(value, parse_constant=_no_constant)
    stack = [loaded]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError("a number out of range")
        if isinstance(item, str):
            item.encode("utf-8")  # a lone surrogate: UnicodeEncodeError, a ValueError
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, dict):
            stack += list(item.keys()) + list(item.values())
    return loaded


def cuda_graph_backend(value: str) -> str:
    """0.5.23 parse_cuda_graph_backend_arg: the retired backend is refused before the choices."""
    if value == "tc_piecewise":
        raise ValueError("tc_piecewise was removed; select breakable, full, or disabled")
    return value


def cuda_graph_config(shown: str, value: str, phases: list[str]) -> tuple[str, str]:
    """(problem, doubt): SGLang's parse_cuda_graph_config_arg (0.5.15, 0.5.23) as far as the facts
    carry it: JSON, an object, each phase one of Phase.ALL with an object of settings; the settings'
    keys (ALLOWED_KEYS_PER_PHASE) are not read, so a phase with settings is a doubt."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"{shown} {value!r}: SGLang's parse_cuda_graph_config_arg wants JSON ({exc})", ""
    if not isinstance(parsed, dict):
        return f"{shown} {value!r}: SGLang's parse_cuda_graph_config_arg wants a JSON object, got " \
               f"{type(parsed).__name__}", ""
    for phase, settings in parsed.items():
        if str(phase) not in phases:
            return f"{shown} {value!r}: unknown phase {phase!r}, SGLang expects one of {', '.join(phases)}", ""
        if not isinstance(settings, dict):
            return f"{shown} {value!r}: the settings of phase {phase!r} must be a JSON object", ""
        if settings.get("backend") == "tc_piecewise":
            return "", f"{shown} {value!r}: the backend tc_piecewise is refused by some versions; cannot check it"
    if any(parsed.values()):
        return "", f"{shown} {value!r}: cannot check the settings' keys (SGLang's ALLOWED_KEYS_PER_PHASE is not read)"
    return "", ""


#: what each ``type`` the facts carry does with a value (deploy/remote/sglang_cli.py KNOWN_TYPE_FUNCTIONS)
CONVERTERS: dict[str, tuple[Any, str]] = {
    "str": (str, ""), "int": (int, "an integer (invalid int value)"), "float": (float, "a number (invalid float value)"),
    "json": (json.loads, "JSON (json.loads)"), "orjson": (orjson_loads, "a JSON value (json_list_type)"),
    "human_readable_int": (human_readable_int, "an integer (human_readable_int)"),
    "cuda_graph_backend": (cuda_graph_backend, "a CUDA graph backend (parse_cuda_graph_backend_arg)"),
}


def _plugins_text(plugins: Optional[PluginFacts]) -> str:
    if plugins is None:
        return "the host's plugin entry points were not read"
    if plugins.error:
        return f"the plugin entry points could not be read ({plugins.error})"
    looked = ", ".join(plugins.groups)
    if plugins.found:
        return f"plugins installed ({'; '.join(plugins.found[:4])}; entry point groups {looked})"
    return f"no plugin is installed for sglang_python (entry point groups looked at: {looked})"


def _value_problem(spec: SglangOption, shown: str, value: str, context: Optional[Context] = None) -> tuple[str, str]:
    """(problem, doubt) for one value, as argparse converts it by ``type`` and checks ``choices``."""
    converted: object = value
    if spec.type == "other":
        return "", f"{shown} {value!r}: cannot check this value: its type function " \
                   f"{spec.type_function or '?'} is not one the doctor knows"
    if spec.type == "cuda_graph_config":
        return cuda_graph_config(shown, value, spec.type_detail or [])
    convert, wanted = CONVERTERS[spec.type]
    try:
        converted = convert(value)
    except (ValueError, TypeError, ArithmeticError) as exc:
        return f"{shown} {value!r}: SGLang's argparse wants {wanted} ({exc})" if spec.type not in ("int", "float") \
            else f"{shown} {value!r}: SGLang's argparse wants {wanted}", ""
    if spec.choices is None:
        if spec.choices_unknown:
            return "", f"{shown} {value!r}: cannot check this value: SGLang computes this option's choices at " \
                       "run time in a way the doctor cannot read from its source"
        return "", ""
    if converted in spec.choices:
        return "", ""
    if spec.conditional_choices and converted in spec.conditional_choices:
        name = spec.conditional_env
        env = context.env if context is not None else None
        if name and env is not None and name in env:
            setting = (env[name] or "").lower()
            if setting in ("true", "1", "yes", "y"):  # SGLang's EnvBool
                return "", ""
            if env[name] is None or setting in ("false", "0", "no", "n"):
                return f"invalid choice: {shown} {value!r}: SGLang offers it only when {name} is true, and the " \
                       f"server's environment has {name}={env[name] if env[name] is not None else '(unset)'}", ""
        return "", f"{shown} {value!r}: SGLang accepts it only under a run-time condition " \
                   f"({name or 'an environment variable'}); cannot check it"
    allowed = ", ".join(str(c) for c in spec.choices[:MAX_CHOICES_SHOWN])
    allowed += f", ... ({len(spec.choices)} in all)" if len(spec.choices) > MAX_CHOICES_SHOWN else ""
    close = _close(value, [str(c) for c in spec.choices], 1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    text = f"{shown} {value!r}: not one of its choices{hint}; allowed: {allowed}"
    if spec.open_choices:
        plugins = context.plugins if context is not None else None
        if plugins is not None and not plugins.error and not plugins.found:
            return f"invalid choice: {text}; plugins could extend this list, but " + _plugins_text(plugins), ""
        return "", text + f" (plugins may add choices to this list, so SGLang may still accept it: " \
                          f"{_plugins_text(plugins)})"
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


def _version(text: Optional[str]) -> tuple[int, ...]:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(g) for g in found.groups()) if found else ()


def config_argv(config: ConfigFileFacts, options: list[SglangOption], version: Optional[str]) -> tuple[list[str], list[str], list[str]]:
    """(argv, problems, doubts): the options SGLang's ConfigArgumentMerger puts before the command
    line from the --config file's items (srt/server_args_config_parser.py, 0.5.23 under srt/utils/)."""
    def keys(spec: SglangOption) -> set[str]:
        return {n[2:].replace("-", "_") for n in spec.names if n.startswith("--")}
    flags = {k for o in options if o.config_kind == "flag" for k in keys(o)}
    known = bool(_version(version))
    # the merger's rules, per version: 0.5.23 also passes an action that takes one value (0.5.15 and
    # older refuse it); 0.5.15 and 0.5.23 pass a mapping as json.dumps, 0.5.12 as str()
    one_passes = _version(version) >= (0, 5, 23)
    one_refused = known and _version(version) <= (0, 5, 15)
    dict_json = _version(version) >= (0, 5, 15)
    dict_str = known and _version(version) <= (0, 5, 12)
    supported = {k for o in options if o.config_kind in ("flag", "value") or (o.config_kind == "one" and one_passes)
                 for k in keys(o)}
    argv: list[str] = []
    problems: list[str] = []
    doubts: list[str] = []
    where = f"--config {config.path} (on the host)"
    for key, kind, value in config.items:
        if kind == "badkey":
            problems.append(f"{where}: key {value!r} is not text (SGLang's merger fails on it)")
            continue
        norm = key.replace("-", "_")
        unsupported = [o for o in options if norm in keys(o) and norm not in supported]
        if unsupported:
            if unsupported[0].config_kind == "one" and not one_refused:
                doubts.append(f"{where}: key {key!r} ({unsupported[0].names[0]}): whether this SGLang's merger "
                              "takes it depends on its version; cannot check it")
            else:
                problems.append(f"{where}: key {key!r}: Unsupported config option (SGLang's merger refuses "
                                f"{unsupported[0].names[0]}'s action in a config file)")
            continue
        if kind == "bool":
            if norm in flags:
                argv += [f"--{key}"] if value else []
            else:
                argv += [f"--{key}", str(value).lower()]
        elif kind == "list":
            argv += [f"--{key}"] + list(value) if value else []
        elif kind == "dict":
            if not dict_json and not dict_str:
                doubts.append(f"{where}: key {key!r} is a mapping: how SGLang {version or '?'} passes it is not "
                              "known to the doctor; cannot check it")
                continue
            argv += [f"--{key}", value["json"] if dict_json else value["str"]]
        else:
            argv += [f"--{key}", value]
    return argv, problems, doubts


def parse_extra_args(args: list[str], options: list[SglangOption], context: Optional[Context] = None) -> Parsed:
    """extra_args read the way SGLang reads them against the installed SGLang's options: its
    prepare_server_args merges a ``--config FILE`` first (the exact spelling only), then argparse."""
    if "--config" not in args or not any("--config" in o.names for o in options):
        return _parse(args, options, context)  # (a version without --config: argparse's own verdict)
    index = args.index("--config")
    if args.count("--config") > 1:
        return Parsed({}, ("--config is given more than once: SGLang stops with \"Multiple config files specified! "
                           "Only one allowed.\"",))
    if index == len(args) - 1:
        return Parsed({}, ("--config without its value at the end of extra_args: SGLang stops with \"No config "
                           "file specified after --config flag!\"",))
    path = args[index + 1]
    rest = args[:index] + args[index + 2:]
    config = context.config if context is not None else None
    if config is None or config.path != path:
        own = _parse(rest, options, context)
        return Parsed(own.options, own.problems, own.doubts + (f"--config {path}: the file was not read on the "
                                                              "host; cannot check the options it sets",))
    if config.error:
        return Parsed({}, (f"--config {path}: {config.error} (on the host); SGLang stops before it parses "
                           "anything",))
    if config.unreadable:
        own = _parse(rest, options, context)
        return Parsed(own.options, own.problems, own.doubts + (f"--config {path}: cannot read it ({config.unreadable}); "
                                                              "cannot check the options it sets",))
    merged, problems, doubts = config_argv(config, options, context.version if context else None)
    from_file = _parse(merged, options, context)
    whole = _parse(merged + rest, options, context)
    own = _parse(rest, options, context)
    where = f"--config {path} (on the host): "
    return Parsed(whole.options, tuple(problems) + tuple(where + p for p in from_file.problems) + own.problems,
                  tuple(doubts) + tuple(where + d for d in from_file.doubts) + own.doubts)


def _parse(args: list[str], options: list[SglangOption], context: Optional[Context]) -> Parsed:
    parsed: dict[str, Optional[str]] = {}
    problems: list[str] = []
    doubts: list[str] = []
    #: the option before a stray value (argparse calls the value an unrecognized argument)
    previous: Optional[tuple[str, str]] = None
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            problems.append("a lone '--' ends SGLang's options: what follows is an unrecognized argument "
                            "(launch_server takes no positional arguments)")
            continue
        if token == "-h":
            problems.append(f"{token}: SGLang prints its help and exits 0; no server starts")
            continue
        if _is_value(token):
            if previous and previous[1] == "0":
                # issue 38: "--enable-metrics yes" was "'yes' is not an option", naming no option
                given = previous[0]
                problems.append(f"{given} {token}: {given} takes no value (a switch: give {given} alone to turn it "
                                f"on, or leave it out); {token!r} would be an unrecognized argument")
            elif previous:
                given, nargs_before = previous
                problems.append(f"{given} {token}: {given} takes {_values_of(nargs_before)}; {token!r} is one more, "
                                "an unrecognized argument")
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
            previous = None
            continue
        canonical = spec.names[0]
        shown = name if name == canonical else f"{name} ({canonical})"
        if canonical == "--config" and token != "--config":
            # prepare_server_args merges the file only for the exact token: argparse stores the path and
            # nothing reads it (0.5.12 to 0.5.23)
            doubts.append(f"{token}: SGLang reads a config file only for '--config FILE' spelled so; the options "
                          "in this one would be ignored")
        # the option a stray value after it would be blamed on, as the user spelled it (not after --x=v:
        # argparse then reads the next word as a word of its own, "is not an option")
        previous = (name, spec.nargs) if not eq and spec.nargs not in ("*", "+", "...", "unknown") else None
        if eq:
            count, missing = 0, None
            values = [explicit]
            if spec.nargs == "0":
                problems.append(f"{shown} takes no value, got {explicit!r} in {token!r} (argparse: ignored "
                                "explicit argument)")
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
            problem, doubt = _value_problem(spec, shown, value, context)
            problems += [problem] if problem else []
            doubts += [doubt] if doubt else []
        parsed[canonical] = " ".join(values) if values else None
    return Parsed(parsed, tuple(problems), tuple(doubts))


def _values_of(nargs: str) -> str:
    return "one value" if nargs in ("1", "?") else f"{nargs} values"


def context_of(d: DoctorInput) -> Context:
    sglang = d.sglang
    if sglang is None:
        return Context()
    env = {name: d.run.env.get(name, value) for name, value in sglang.condition_env.items()}
    return Context(plugins=sglang.plugins, config=sglang.config, version=sglang.version, env=env)


def judge_extra_args(d: DoctorInput) -> tuple[Optional[Parsed], str]:
    """The doctor's one judgement of the run's extra_args (the extra-args check, hence doctor and up's
    pre-flight, and the checks that read an option): (None, why) when SGLang's options are unknown."""
    options, where = installed_options(d)
    if options is None:
        return None, where
    return parse_extra_args(list(d.run.extra_args), options, context_of(d)), where


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
    parsed = parse_extra_args(list(d.run.extra_args), options, context_of(d))
    if spec.names[0] not in parsed.options:
        return None
    value = parsed.options[spec.names[0]]
    return "" if value is None else value
