"""Facts the key fixer step reads: the installed SGLang version, and the fixer's JSON summary.

The version comes from SGLang's package metadata (``importlib.metadata``), not ``import sglang``
(about 2.6 s and 320 MiB on a real 0.5.23 install). The fixer (deploy/remote/fixer/)
prints one JSON document; a crash prints a Python traceback instead, reported by its last line only.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from deploy.errors import ExitCode, RemoteCommandFailed, RemoteOutputError

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


class FixerSummary(BaseModel):
    """The fixer's JSON summary: ``status`` always, ``error`` (a message) when it is "error"; the
    rest (report, fingerprint, exit_code...) is read by the step."""

    model_config = ConfigDict(extra="allow", frozen=True)

    status: Any
    error: Any = None

    @model_validator(mode="after")
    def _error_has_a_message(self) -> FixerSummary:
        if self.status == "error" and not isinstance(self.error, str):
            raise ValueError("error document without a message")
        return self


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


def parse_fixer_summary(exit_code: int, stdout: str, stderr: str, source: str) -> dict:
    """The summary as the dict the fixer printed (keys it did not print are not added)."""
    text = "\n".join(ln for ln in stdout.splitlines() if ln.strip())
    try:
        summary = FixerSummary.model_validate_json(text)
    except ValidationError as exc:
        kinds = {e["type"] for e in exc.errors()}
        if kinds & {"json_invalid", "recursion_loop"} or not text:
            raise RemoteOutputError(
                f"{source}: the key fixer did not print its JSON summary (exit {exit_code}): "
                f"{failure_text(stdout, stderr)}"
            ) from None
        if "missing" in kinds or "model_type" in kinds:
            raise RemoteOutputError(f"{source}: the key fixer's JSON has no 'status': {text[:200]}") from None
        raise RemoteOutputError(f"{source}: the key fixer's error document has no message: {text[:200]}") from None
    except RecursionError:
        raise RemoteOutputError(
            f"{source}: the key fixer did not print its JSON summary (exit {exit_code}): "
            f"{failure_text(stdout, stderr)}"
        ) from None
    return summary.model_dump(exclude_unset=True)
