"""fix-keys: copy the drafter into the host's drafter store, key-fix it there, verified: ONE command.

SGLang 0.5.6-0.5.11 drops a speculators checkpoint's decoder-layer tensors without a word; the
drafter then runs randomly initialised and acceptance collapses to 1.00 (seen in a real deployment).
The fixer (``fixer.pyz``, uploaded by ensure-helper to the persistent state dir) runs on the host
under its python3 and does the whole job in one exec channel (``fixer.pyz store``, see
deploy/remote/fixer/store.py): fingerprint the drafter, reuse its converted copy in
``<state_dir>/drafters/<fingerprint>/`` or copy it there (``cp --reflink=auto``; the user's
checkpoint is never modified), fingerprint again (a checkpoint still being written tears the
copy), convert and verify against the installed SGLang's loader, publish, and keep the
``keep_drafters`` most recently used drafters plus the last good one. It answers with one JSON
summary (deploy/facts/fixer.py) naming the store entry it used: that answer, checked to be
``<store>/<fingerprint[:32]>`` (``store_entry_of``), is the drafter path the launch uses.

The SGLang version comes from the doctor step of the same run when it ran (``ctx.memory``);
otherwise the fixer reads it from the package metadata under ``sglang_python`` in the same command.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from deploy.base.errors import DeployError, RemoteOutputError, VerificationFailed
from deploy.facts.fixer import (FixerFailure, FixerSummary, exit_code_of, parse_fixer_summary, parse_sglang_version,
                                store_entry_of)
from deploy.facts.server import last_good_path
from deploy.base.shell import path_join, quote, quote_path
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings
from deploy.facts.helpers import helper_python

NAME = "fix-keys"
FIXER = "fixer.pyz"


class Settings(StepSettings):
    #: always: run the fixer (a no-op "already converted" when nothing changed);
    #: changed: skip when the drafter's fingerprint matches the one recorded after the last fix.
    when: Literal["always", "changed"] = "always"
    #: which engine extracted the training hidden states (aux layer ids are off by one between them)
    hidden_states_from: Literal["keep", "vllm", "sglang"] = "keep"
    #: drafters kept in the store besides the last good one (most recently used first)
    keep_drafters: int = Field(default=2, ge=1, le=100)


def version_command(ctx: StepContext) -> str:
    # Package metadata, never `import sglang`: importing a real SGLang 0.5.23 costs ~2.6 s and
    # ~320 MiB on every host and every run; reading its dist-info costs ~0.06 s and ~15 MiB.
    # (fixer/store.py runs the same program when it reads the version itself.)
    program = "import sys, importlib.metadata as m; sys.stdout.write(m.version('sglang'))"
    return f"{quote(ctx.run.sglang_python)} -c {quote(program)}"


def parse_version(result, source: str, python: str = "python3") -> str:
    """converge's own read of the version (when neither doctor nor this step ran)."""
    return parse_sglang_version(result.exit_code, result.stdout, result.stderr, source, python)


def fingerprint_command(ctx: StepContext) -> str:
    """What the drafter's store entry would be called (read-only: the fleet's pre-drain probe)."""
    return (f"{helper_python(ctx.host.python)} {quote_path(ctx.paths.helper(FIXER))} --fingerprint -- "
            f"{quote_path(ctx.run.drafter)}")


def store_path(ctx: StepContext, fingerprint: str) -> str:
    """The rule ``fixer.pyz store`` follows (deploy/remote/fixer/store.py ``store_entry``), for what is
    shown before the host answers: the plan, and the fleet's pre-drain probe (which reads only the
    fingerprint). A run uses the host's own answer (``outcome_of``); tests/unit/test_fix_keys_step.py
    ties the two."""
    return path_join(ctx.paths.drafters, fingerprint[:32])


def version_flags(ctx: StepContext, version: str | None) -> list[str]:
    """What the fixer verifies against: the run's generation, the version doctor read, or read it now."""
    if ctx.run.sglang_generation != "auto":
        return ["--sglang-generation", ctx.run.sglang_generation]
    if version:
        return ["--sglang-version", version]
    return ["--sglang-python", ctx.run.sglang_python]


def store_command(ctx: StepContext, version: str | None) -> str:
    """The one host command of this step (plan shows it, run sends it)."""
    s = ctx.settings
    parts = [helper_python(ctx.host.python), quote_path(ctx.paths.helper(FIXER)), "store",
             "--store", quote_path(ctx.paths.drafters), "--keep", str(s.keep_drafters),
             "--last-good", quote_path(last_good_path(ctx.paths.root)), "--when", s.when,
             "--hidden-states-from", s.hidden_states_from]
    parts += [quote(f) for f in version_flags(ctx, version)]
    parts += ["--", quote_path(ctx.run.drafter)]  # a path is never read as an option
    return " ".join(parts)


def known_version(ctx: StepContext) -> str | None:
    # the doctor step already read it from the same package metadata in this run
    version = ctx.memory.sglang_version
    return version if isinstance(version, str) else None


def action(ctx: StepContext) -> Command:
    return Command(
        description=f"fingerprint the drafter; reuse its converted copy in the drafter store, or copy it there "
                    f"(the original is never modified), convert and verify it against the installed SGLang; keep the "
                    f"{ctx.settings.keep_drafters} most recently used drafters and the last good one",
        command=store_command(ctx, known_version(ctx)), timeout_s=ctx.timeout(ctx.run.timeouts.fix_keys_s))


def plan(ctx: StepContext) -> list[Command]:
    # what the later steps' plans show for the values this step learns on the host
    ctx.memory.drafter_fingerprint = ctx.memory.drafter_fingerprint or "<drafter fingerprint>"
    ctx.memory.drafter_path = ctx.memory.drafter_path or store_path(ctx, "<drafter fingerprint>")
    return [action(ctx)]


def parse_fixer_json(result, source: str) -> FixerSummary | FixerFailure:
    return parse_fixer_summary(result.exit_code, result.stdout, result.stderr, source)


def outcome_of(ctx: StepContext, summary: FixerSummary | FixerFailure) -> StepOutcome:
    """Judge the summary (pure: raises the step's error or returns its outcome)."""
    source, drafter = ctx.host.name, ctx.run.drafter
    if isinstance(summary, FixerFailure):
        raise DeployError(f"{source}: key fix of {drafter}: {summary.error}", exit_code=exit_code_of(summary.code, source))
    store = store_entry_of(summary.store, ctx.paths.drafters, summary.fingerprint, source)  # the host's answer
    ctx.memory.drafter_fingerprint, ctx.memory.drafter_path = summary.fingerprint, store
    if summary.status == "no_sglang_version":
        read = summary.sglang_version_read
        if read is not None:
            parse_sglang_version(-1 if read.exit_code is None else read.exit_code, read.stdout, read.stderr,
                                 source, ctx.run.sglang_python)
        raise RemoteOutputError(f"{source}: the key fixer could not read the installed SGLang version")
    if summary.status == "unchanged":
        return StepOutcome("skipped", f"drafter unchanged, already converted in {store}",
                           {"fingerprint": summary.fingerprint, "store": store})
    if summary.sglang_version is not None:
        ctx.memory.sglang_version = summary.sglang_version
    verification = summary.verification
    if summary.status == "verify_failed" or (verification is not None and not verification.ok):
        # The fixer orders problems root cause first ("EAGLE3 currently only supports 1 layer" on
        # SGLang 0.5.11 and older); the dropped/missing name lists would bury it.
        gaps = (verification.problems or verification.dropped + verification.missing) if verification else []
        raise VerificationFailed(f"{source}: SGLang would not load the drafter {drafter} fully: "
                                 f"{'; '.join(gaps)[:800]}")
    if summary.exit_code != 0:
        raise RemoteOutputError(f"{source}: key fixer exited {summary.exit_code} with status {summary.status!r}")
    data = {"status": summary.status, "renamed": summary.renamed, "sglang_version": summary.sglang_version,
            "verification": verification.model_dump() if verification else {}, "fingerprint": summary.fingerprint,
            "store": store, "pruned": summary.pruned.model_dump() if summary.pruned else None,
            "skipped": list(summary.skipped)}
    detail = ("already converted" if summary.status == "already_converted"
              else f"converted, {summary.renamed} keys renamed")
    text = f"{detail} in {store}"
    if summary.skipped:
        # links leaving the drafter directory, FIFOs, ...: the copy names each one (data.skipped)
        text += (f"; {len(summary.skipped)} note(s) on the copy (links leaving the drafter directory are not "
                 f"followed), first: {summary.skipped[0][:200]}")
    return StepOutcome("ok", text, data)


def run(ctx: StepContext) -> StepOutcome:
    result = ctx.execute(action(ctx))
    return outcome_of(ctx, parse_fixer_json(result, ctx.host.name))
