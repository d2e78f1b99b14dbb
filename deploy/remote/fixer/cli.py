"""The fixer's command line (``python3 fixer.pyz ...`` on a host, ``deployctl fix-keys`` locally)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, Optional, Sequence, Tuple

from .errors import EXIT_CHECKPOINT, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, EXIT_VERIFY, FixError
from .checkpoint import fingerprint
from .config import IDS_MODES
from .loader import GENERATIONS, _resolve_generation
from .conversion import convert
from .restoration import restore
from .store import WHEN, store_drafter


def default_target() -> Tuple[str, str]:
    """(generation or version, why) verified when no --sglang-generation/--sglang-version is given.

    The SGLang importable next to this Python, read from its package metadata WITHOUT importing it
    (an import of a real SGLang takes seconds and loads torch); otherwise 0.5.12+ (modern), what a
    new user installs in late 2026. Before issue 28 the default was 0.5.6-0.5.11 (legacy): a 2-layer
    drafter, which only 0.5.12+ can serve, was refused with exit 8 and nothing written."""
    try:
        import importlib.metadata as metadata
        import importlib.util

        if importlib.util.find_spec("sglang") is not None:
            version = metadata.version("sglang")
            try:
                _resolve_generation(version)
                return version, "the SGLang %s importable next to this Python (package metadata)" % version
            except FixError:
                return "modern", ("SGLang 0.5.12+ (modern): the SGLang %r next to this Python is not one the fixer "
                                  "knows" % version)
    except (ImportError, ValueError, OSError):
        pass
    except Exception:  # a broken metadata directory never stops the fix; the default stays modern
        pass
    return "modern", "SGLang 0.5.12+ (modern): no sglang is importable next to this Python"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:   # no SystemExit(2) from inside a library call
        raise FixError(EXIT_USAGE, message)


def _parser(prog: Optional[str], target: Tuple[str, str] = ("modern", "SGLang 0.5.12+ (modern)")) -> _Parser:
    parser = _Parser(
        prog=prog, description="Rename an EAGLE-3 drafter's weight keys (layers.0.* -> midlayer.*) "
        "and config for SGLang, in place and crash-safe, and check what SGLang would load.",
        epilog="exit codes: 0 ok, 1 --check: change needed, 2 usage, 6 invalid checkpoint, "
        "8 verification failed, 10 cannot write")
    parser.add_argument("path", help="drafter directory, or one .safetensors file")
    parser.add_argument("--rename", action="append", metavar="OLD=NEW",
                        help="rename keys starting with OLD to start with NEW (repeatable; replaces "
                        "the default layers.0.=midlayer.)")
    parser.add_argument("--hidden-states-from", choices=IDS_MODES, default="keep",
                        help="engine that extracted the training hidden states: vllm writes id-1 "
                        "for each aux layer id (SGLang captures one layer later); default keep")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sglang-generation", choices=sorted(GENERATIONS),
                       help="verify for SGLang 0.5.6-0.5.11 (legacy) or 0.5.12+ (modern); default: the "
                       "SGLang installed next to this Python, else 0.5.12+ (modern); here: %s" % target[1])
    group.add_argument("--sglang-version", metavar="X.Y.Z", help="verify for this SGLang version")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a change is needed")
    parser.add_argument("--restore", action="store_true",
                        help="put the original bytes back from the backup sidecar")
    parser.add_argument("--full-backup", action="store_true",
                        help="also copy each changed file to FILE.orig first")
    parser.add_argument("--fingerprint", action="store_true",
                        help="print the drafter fingerprint as JSON and exit")
    parser.add_argument("--json", action="store_true", help="print one JSON summary on stdout")
    return parser


def _store_parser(prog: Optional[str]) -> _Parser:
    parser = _Parser(
        prog=(prog or "fixer.pyz") + " store", description="fix-keys' host side in one command: fingerprint "
        "the drafter, reuse its converted copy in the store or copy, convert, verify and publish it, prune "
        "the store; prints one JSON summary")
    parser.add_argument("drafter", help="the user's drafter directory (never modified)")
    parser.add_argument("--store", required=True, help="the drafter store directory")
    parser.add_argument("--keep", type=int, required=True, help="drafters kept besides the last good one")
    parser.add_argument("--last-good", required=True, help="last-good.json (its drafter is never pruned)")
    parser.add_argument("--when", choices=WHEN, default="always",
                        help="changed: do nothing when the store already holds this drafter converted")
    parser.add_argument("--hidden-states-from", choices=IDS_MODES, default="keep")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--sglang-generation", choices=sorted(GENERATIONS))
    group.add_argument("--sglang-version", metavar="X.Y.Z")
    group.add_argument("--sglang-python", metavar="PYTHON",
                       help="read the installed SGLang's version from its package metadata under PYTHON")
    return parser


def _store(args_list: Sequence[str], prog: Optional[str]) -> Dict[str, Any]:
    args = _store_parser(prog).parse_args(list(args_list))
    if args.keep < 1:
        raise FixError(EXIT_USAGE, "--keep must be at least 1")
    return store_drafter(args.drafter, os.path.expanduser(args.store), keep=args.keep,
                         last_good=os.path.expanduser(args.last_good), when=args.when,
                         hidden_states_from=args.hidden_states_from,
                         generation=args.sglang_version or args.sglang_generation, sglang_python=args.sglang_python)


def _render(summary: Dict[str, Any], out: Any) -> None:
    for line in summary.get("log", []):
        out.write(line + "\n")
    status = summary["status"]
    if status == "restored":
        out.write("restored: %s\n" % summary["path"])
        return
    verification = summary.get("verification") or {}
    if status == "needs_conversion":
        changed = [f["file"] for f in summary["files"] if f["mode"] != "unchanged"]
        out.write("needs conversion: %s (%d key(s) in %s%s)\n"
                  % (summary["path"], len(summary["renames"]), ", ".join(changed) or "no file",
                     ", config.json" if summary["config"]["converted"] else ""))
        after = summary.get("verification_after_conversion") or {}
        _render_verification("now", verification, out)
        _render_verification("after conversion", after, out)
    else:
        out.write("%s: %s\n" % (status.replace("_", " "), summary["path"]))
        _render_verification("", verification, out)
    out.write("fingerprint: %s\n" % summary.get("fingerprint"))


def _render_verification(when: str, verification: Dict[str, Any], out: Any) -> None:
    if not verification:
        return
    label = "verification%s for SGLang %s (%s)" % (" " + when if when else "",
                                                   verification.get("sglang_versions"),
                                                   verification.get("generation"))
    out.write("%s: %s\n" % (label, "ok" if verification.get("ok") else "FAILED"))
    for problem in verification.get("problems", []):
        out.write("  problem: %s\n" % problem)
    for note in verification.get("notes", []):
        out.write("  note: %s\n" % note)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None, stdout: Any = None,
         stderr: Any = None, host_verbs: bool = False) -> int:
    """The command line; returns the exit code (no traceback for user errors).

    ``host_verbs``: accept ``store`` (the zipapp on a host, deploy/facts/helpers.py). Off for
    ``deployctl fix-keys``: ``fix-keys store DIR --store FOLDER --keep 1`` once pruned a user's
    folder; the store is the deploy's, not a user verb."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    args_list = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args_list or "--fingerprint" in args_list
    try:
        if args_list[:1] == ["store"] and not host_verbs:
            raise FixError(EXIT_USAGE, "'store' is the host side of the fix-keys step (deployctl up runs it "
                           "in the host's drafter store), not a command of %s; to convert a drafter "
                           "directory named store, write ./store" % (prog or "the fixer"))
        if args_list[:1] == ["store"]:
            as_json = True
            stored = _store(args_list[1:], prog)
            out.write(json.dumps(stored) + "\n")
            out.flush()
            return int(stored["exit_code"])
        target = default_target()
        args = _parser(prog, target).parse_args(args_list)
        as_json = args.json or args.fingerprint
        if args.restore or args.fingerprint:
            extra = [flag for flag, on in (("--check", args.check), ("--rename", args.rename),
                                           ("--full-backup", args.full_backup),
                                           ("--restore", args.restore and args.fingerprint))
                     if on]
            if extra:
                raise FixError(EXIT_USAGE, "%s cannot be combined with %s"
                               % ("--fingerprint" if args.fingerprint else "--restore",
                                  ", ".join(extra)))
        if args.fingerprint:
            summary: Dict[str, Any] = {"status": "fingerprint", "path": os.path.abspath(args.path),
                                       "fingerprint": fingerprint(args.path), "exit_code": EXIT_OK}
        elif args.restore:
            summary = restore(args.path)
        else:
            generation = args.sglang_version or args.sglang_generation or target[0]
            summary = convert(args.path, renames=args.rename,
                              hidden_states_from=args.hidden_states_from, generation=generation,
                              full_backup=args.full_backup, dry_run=args.check)
            if not (args.sglang_version or args.sglang_generation):
                summary["target"] = "verifying for %s (--sglang-version or --sglang-generation to choose)" % target[1]
                summary.setdefault("log", []).insert(0, summary["target"])
        if as_json:
            out.write(json.dumps(summary) + "\n")
        else:
            _render(summary, out)
        code = int(summary.get("exit_code", EXIT_OK))
        if code == EXIT_VERIFY:
            verification = summary.get("verification") or {}
            err.write("error: verification failed for SGLang %s: %s\n"
                      % (verification.get("sglang_versions"),
                         "; ".join(verification.get("problems") or ["see above"])))
        out.flush()
        return code
    except FixError as exc:
        if as_json:
            out.write(json.dumps({"status": "error", "code": exc.code, "error": exc.message}) + "\n")
            out.flush()
        err.write("error: %s\n" % exc.message)
        return exc.code
    except SystemExit as exc:       # --help
        return int(exc.code or 0)
    except RecursionError:
        # every JSON is depth-checked; this is the last line of defence, never a traceback
        message = "an input is nested too deeply to process; refused"
        if as_json:
            out.write(json.dumps({"status": "error", "code": EXIT_CHECKPOINT, "error": message}) + "\n")
            out.flush()
        err.write("error: %s\n" % message)
        return EXIT_CHECKPOINT
    except KeyboardInterrupt:
        err.write("error: interrupted\n")
        return EXIT_INTERRUPTED
