"""host_ops.py's command line: the verbs, their options, and the parser that reads them into a namespace.

Imported by host_ops' main() only (the inline programs that carry host_ops for its functions never
compile it). A table rather than argparse: argparse's import and parser building cost ~8 ms of CPU on
each of the ~1,500 host commands a fleet run makes (Python 3.11, 2026-12-06), and the product writes every
command line itself (deploy.facts.host_helper, deploy.facts.helpers), so the parser needs no prefix
matching. tests/hostile/test_host_ops_command_line.py holds it to the argparse parser it replaced.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

# The verbs' options: (flag, dest, kind, default); kind is str, int, float, "append", "flag" or a tuple of
# choices; a trailing "!" on the flag marks it required; "PATH" is write-file's one positional argument.
_STR, _INT, _FLOAT = str, int, float
_WATCH_END = (("--every", "every", _FLOAT, 1.0), ("--for!", "timeout_total", _FLOAT, None),
              ("--until-stdin-eof", "until_stdin_eof", "flag", False))
VERBS: dict = {
    "stop-processes": (("--scope!", "scope", ("user", "pidfile"), None), ("--pidfile", "pidfile", _STR, ""),
                       ("--expect", "expect", _STR, "sglang"), ("--record", "record", _STR, ""),
                       ("--grace", "grace", _FLOAT, 30.0), ("--exclude", "exclude", "append", None)),
    "probe": (("--url!", "url", _STR, None), ("--pid!", "pid", _INT, None), ("--log", "log", _STR, ""),
              ("--timeout", "timeout", _FLOAT, 5.0)),
    "server-state": (("--pidfile!", "pidfile", _STR, None), ("--record!", "record", _STR, None),
                     ("--url!", "url", _STR, None), ("--timeout", "timeout", _FLOAT, 5.0)),
    "accept-check": (("--base!", "base", _STR, None), ("--requests", "requests", _INT, 4),
                     ("--max-new-tokens", "max_new_tokens", _INT, 256), ("--timeout", "timeout", _FLOAT, 300.0),
                     ("--concurrency", "concurrency", _INT, 1), ("--prompts-json", "prompts_json", _STR, ""),
                     ("--key-from", "key_from", _STR, "")),
    "api-key": (("--record!", "record", _STR, None),),
    "watch-health": (("--url!", "url", _STR, None), ("--pid!", "pid", _INT, None), ("--log", "log", _STR, ""),
                     ("--timeout", "timeout", _FLOAT, 5.0), ("--interval", "interval", _FLOAT, 0.2)) + _WATCH_END,
    "watch-gpus": (("--gpu-query!", "gpu_query", _STR, None), ("--apps-query!", "apps_query", _STR, None),
                   ("--interval", "interval", _FLOAT, 0.1)) + _WATCH_END,
    "write-file": (("PATH", "path", _STR, None), ("--mode", "mode", _STR, "600")),
}
USAGE = """usage: host_ops.py VERB [OPTIONS]
  stop-processes --scope user|pidfile [--pidfile F] [--expect S] [--record F] [--grace S] [--exclude S]...
  probe --url U --pid N [--log F] [--timeout S]
  server-state --pidfile F --record F --url U [--timeout S]
  accept-check --base http://HOST:PORT [--requests N] [--max-new-tokens N] [--timeout S] [--concurrency 1-64]
               [--prompts-json JSON] [--key-from RECORD]   (the record's --api-key as Authorization: Bearer)
  api-key --record F        the --api-key of the record's argv (nothing without one); unreadable record: exit 1
  watch-health --url U --pid N [--log F] [--timeout S] [--interval S] --for S [--every S] [--until-stdin-eof]
  watch-gpus --gpu-query CMD --apps-query CMD [--interval S] --for S [--every S] [--until-stdin-eof]
  write-file PATH [--mode OCTAL]   stdin to PATH: exclusive temporary name, renamed over a regular file or none
"""


class UsageError(Exception):
    """A command line host_ops.py does not take: exit 2, like argparse's."""


def _looks_like_flag(word: str, specs: dict) -> bool:
    """argparse's rule (3.11 ``_parse_optional``, less abbreviations): a flag, or a flag '=' anything, is
    an option; otherwise '-' alone, a negative number or a word with a space is a value, and any other
    word starting with '-' an (unknown) option, never taken as the previous option's value."""
    if word.startswith("-") and (word in specs or word.partition("=")[0] in specs):
        return True
    return (word.startswith("-") and len(word) > 1 and " " not in word
            and re.match(r"^-\d+$|^-\d*\.\d+$", word) is None)


def parse_args(argv: list) -> SimpleNamespace:
    """The verb and its options as a namespace; '--opt value' and '--opt=value', the last of a repeat wins."""
    if not argv or argv[0] not in VERBS:
        raise UsageError(f"a verb is needed, one of {', '.join(VERBS)}" if not argv else f"unknown verb {argv[0]!r}")
    specs = {flag.rstrip("!"): (dest, kind, flag.endswith("!")) for flag, dest, kind, _ in VERBS[argv[0]]}
    args = SimpleNamespace(command=argv[0], **{dest: ([] if kind == "append" else default)
                                               for _, dest, kind, default in VERBS[argv[0]]})
    seen, words = set(), list(argv[1:])
    while words:
        word = words.pop(0)
        if not _looks_like_flag(word, specs) and "PATH" in specs and "PATH" not in seen:
            flag, value = "PATH", word
        else:
            flag, eq, value = word.partition("=")
            if flag not in specs or flag == "PATH":
                raise UsageError(f"{argv[0]}: unrecognised argument {word!r}")
            if specs[flag][1] == "flag":
                if eq:
                    raise UsageError(f"{argv[0]}: {flag} takes no value")
                value = True
            elif not eq:
                if not words or _looks_like_flag(words[0], specs):
                    raise UsageError(f"{argv[0]}: {flag} needs a value")
                value = words.pop(0)
        dest, kind, _ = specs[flag]
        if isinstance(kind, tuple) and value not in kind:
            raise UsageError(f"{argv[0]}: {flag} must be one of {', '.join(kind)}, not {value!r}")
        if kind in (int, float):
            try:
                value = kind(value)
            except ValueError:
                raise UsageError(f"{argv[0]}: {flag} needs a{'n integer' if kind is int else ' number'}, "
                                 f"not {value!r}") from None
        if kind == "append":
            getattr(args, dest).append(value)
        else:
            setattr(args, dest, value)
        seen.add(flag)
    missing = [flag for flag, (_, _, required) in specs.items() if required and flag not in seen]
    if "PATH" in specs and "PATH" not in seen:
        missing.insert(0, "PATH")
    if missing:
        raise UsageError(f"{argv[0]}: the following arguments are required: {', '.join(missing)}")
    if args.command == "stop-processes" and args.scope == "pidfile" and not args.pidfile:
        raise UsageError("stop-processes: --scope pidfile needs --pidfile")
    return args
