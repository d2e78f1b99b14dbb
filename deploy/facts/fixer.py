"""Facts the key fixer step reads: the installed SGLang version, and ``fixer.pyz store``'s JSON summary.

The version comes from SGLang's package metadata (``importlib.metadata``), not ``import sglang``
(about 2.6 s and 320 MiB on a real 0.5.23 install). The fixer (deploy/remote/fixer/)
prints one JSON document; a crash prints a Python traceback instead, reported by its last line only.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from deploy.base.errors import ExitCode, RemoteCommandFailed, RemoteOutputError

VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+\w-]*)$")


def parse_sglang_version(exit_code: int, stdout: str, stderr: str, source: str, python: str = "python3") -> str:
    text = stdout.strip()
    if "No module named 'sglang'" in stderr or "PackageNotFoundError" in stderr:
        raise RemoteCommandFailed(
            f"{source}: SGLang is not installed for {python!r}; set the run's sglang_python to the "
            "interpreter that has it (a venv's bin/python, say)"
        )
    if exit_code != 0 or not VERSION_RE.match(text):
        detail = (stderr.strip().splitlines() or [text or "(no output)"])[-1]
        raise RemoteOutputError(f"{source}: cannot read the installed SGLang version: {detail}")
    return text


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class FixerFailure(_Strict):
    """Any fixer command that failed on a user or environment error (its exit code is ``code``)."""

    status: Literal["error"]
    code: int
    error: str


class Verification(_Strict):
    """The loader simulation's verdict (fixer/loader.py) for one SGLang generation."""

    generation: Literal["legacy", "modern"]
    sglang_versions: str
    ok: bool
    dropped: list[str]
    missing: list[str]
    problems: list[str]
    notes: list[str]
    #: absent when the simulation stopped early (no config.json, non-integer fields): problems say why
    layers: Optional[int] = None
    #: as config.json has them (any JSON: problems say when they are not a list of layer ids)
    aux_layer_ids: Any = None


class FileChange(_Strict):
    file: str
    mode: Literal["in_place", "rewritten", "copied", "unchanged"]
    renamed: int


class ConfigChange(_Strict):
    converted: bool
    kind: Literal["speculators", "sglang", "other", "missing"]
    aux_layer_ids: Any
    ids_mode: Literal["keep", "vllm", "sglang"]


class VersionRead(_Strict):
    """The raw metadata read under sglang_python, judged here by ``parse_sglang_version``."""

    exit_code: Optional[int]
    stdout: str
    stderr: str


class Pruned(_Strict):
    kept: list[str]
    removed: list[str]
    protected: Optional[str]
    error: Optional[str]
    #: store entries deployctl did not create (no owner marker): never counted, never removed
    foreign: list[str] = []


class FixerSummary(_Strict):
    """``fixer.pyz store``'s one JSON document (fixer/store.py ``store_drafter``)."""

    status: Literal["converted", "already_converted", "unchanged", "verify_failed", "no_sglang_version"]
    exit_code: int
    drafter: str
    fingerprint: str = Field(pattern=r"^[0-9a-f]{64}$")
    store: str
    stored_before: bool
    sglang_version: Optional[str]
    sglang_version_read: Optional[VersionRead]
    renamed: int = Field(ge=0)
    files: list[FileChange]
    config: Optional[ConfigChange]
    verification: Optional[Verification]
    pruned: Optional[Pruned]
    #: what the copy into the store left out (links leaving the drafter directory, FIFOs, ...)
    skipped: list[str] = []


def failure_text(stdout: str, stderr: str) -> str:
    """What a failed fixer run said, without a Python traceback's frames (the last line is the error)."""
    text = (stderr.strip() or stdout.strip())
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in text.splitlines() if ln.strip()][-1:]
        return "the fixer crashed: " + (last[0].strip() if last else "(no message)")
    return text[-500:] or "(no output)"


def exit_code_of(value: Any, source: str) -> ExitCode:
    try:
        return ExitCode(int(value))
    except (TypeError, ValueError):
        raise RemoteOutputError(f"{source}: the key fixer reported exit code {value!r}, not one of deployctl's") from None


def _first_document(stdout: str) -> str:
    return "\n".join(ln for ln in stdout.splitlines() if ln.strip())


def parse_fixer_failure(exit_code: int, stdout: str, stderr: str, source: str) -> FixerFailure | None:
    """The error document a failed fixer command printed; None when it printed something else."""
    try:
        return FixerFailure.model_validate_json(_first_document(stdout))
    except (ValidationError, RecursionError):
        return None


def parse_fixer_summary(exit_code: int, stdout: str, stderr: str, source: str) -> FixerSummary | FixerFailure:
    """``fixer.pyz store``'s summary, or its error document; anything else is a RemoteOutputError."""
    text = _first_document(stdout)
    failure = parse_fixer_failure(exit_code, stdout, stderr, source)
    if failure is not None:
        return failure
    try:
        return FixerSummary.model_validate_json(text)
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        if kinds & {"json_invalid", "recursion_loop"} or not text:
            raise RemoteOutputError(
                f"{source}: the key fixer did not print its JSON summary (exit {exit_code}): "
                f"{failure_text(stdout, stderr)}"
            ) from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the document"
        raise RemoteOutputError(f"{source}: the key fixer's summary has an unexpected {where}: {first['msg']} "
                                f"(in {text[:200]!r})") from None
    except RecursionError:
        raise RemoteOutputError(
            f"{source}: the key fixer did not print its JSON summary (exit {exit_code}): "
            f"{failure_text(stdout, stderr)}"
        ) from None


#: a store entry's name: the fingerprint's first 32 hex digits (deploy/remote/fixer/store.py ``store_entry``)
ENTRY_NAME = re.compile(r"^[0-9a-f]{32}$")


def store_entry_of(answer: str, store: str, fingerprint: str, source: str) -> str:
    """The drafter's store entry as the host named it (``FixerSummary.store``), checked and spelled as
    the controller spells ``store`` (the ``--store`` it sent).

    The fixer expands ``~`` (``os.path.expanduser``), so a ``~/...`` state dir comes back as
    ``/home/<user>/...``; the entry is given back as ``<store>/<name>`` so that the launch argv and the
    deployment record keep the config's spelling (a deployment recorded before would otherwise look
    changed and be redeployed). Anything but an absolute, normalised ``<store>/<fingerprint[:32]>`` is
    a RemoteOutputError naming the host."""
    import posixpath

    def refuse(why: str) -> RemoteOutputError:
        return RemoteOutputError(f"{source}: the key fixer named {answer[:300]!r} as the drafter's store entry: "
                                 f"{why} (expected {store}/<the fingerprint's first 32 hex digits>)")

    if not answer.startswith("/") or posixpath.normpath(answer) != answer or "\n" in answer or "\0" in answer:
        raise refuse("not an absolute, normalised path")
    parent, name = posixpath.split(answer)
    if not ENTRY_NAME.match(name) or name != fingerprint[:32]:
        raise refuse(f"its name is not the fingerprint's first 32 hex digits ({fingerprint[:32]})")
    if store.startswith("~"):
        rest = store[1:].rstrip("/")       # "~/state/drafters" -> "/state/drafters"; the home is the host's
        # the host's home is what precedes it: absolute, or empty where HOME is / itself
        home = parent[:len(parent) - len(rest)] if parent.endswith(rest) else None
        inside = home is not None and (home == "" or home.startswith("/")) and rest.startswith("/")
    else:
        inside = parent == posixpath.normpath(store)
    if not inside:
        raise refuse(f"it is not in the drafter store {store}")
    return store.rstrip("/") + "/" + name


class DrafterFingerprint(_Strict):
    """``fixer.pyz --fingerprint -- DRAFTER``: what fix-keys would call the drafter (read-only)."""

    status: Literal["fingerprint"]
    path: str
    fingerprint: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    exit_code: Literal[0]


def parse_fingerprint(exit_code: int, stdout: str, stderr: str, source: str) -> DrafterFingerprint:
    if exit_code != 0:
        raise RemoteOutputError(f"{source}: the drafter fingerprint failed (exit {exit_code}): "
                                f"{failure_text(stdout, stderr)}")
    try:
        return DrafterFingerprint.model_validate_json(stdout.strip())
    except ValidationError:
        raise RemoteOutputError(f"{source}: the drafter fingerprint printed {stdout.strip()[:200]!r}") from None
