"""fix-keys: copy the drafter into the host's drafter store, key-fix it there, verified.

SGLang 0.5.6-0.5.11 drops a speculators checkpoint's decoder-layer tensors without a word; the
drafter then runs randomly initialised and acceptance collapses to 1.00 (seen in a real deployment). The
fixer runs on the host under its python3, from the persistent state dir, and answers in JSON.

The user's checkpoint directory is never modified: it is copied (``cp --reflink=auto``: free on
XFS/btrfs, a plain copy elsewhere) to ``<state_dir>/drafters/.staging-*``, converted and verified
there, then renamed to ``drafters/<fingerprint>/`` and launched from there. A new checkpoint
written over the configured path (files replaced, or the same files overwritten) therefore never
touches a drafter that is serving, and the last good deployment can always be relaunched with its
own bytes. The store keeps the 2 most recently used drafters plus the last good one.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from deploy.errors import DeployError, ExitCode, RemoteOutputError, VerificationFailed
from deploy.facts.fixer import exit_code_of, parse_fixer_summary, parse_sglang_version
from deploy.facts.server import last_good_path
from deploy.shell import path_join, quote, quote_path
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

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
    program = "import sys, importlib.metadata as m; sys.stdout.write(m.version('sglang'))"
    return f"{quote(ctx.run.sglang_python)} -c {quote(program)}"


def fixer_command(ctx: StepContext, *flags: str, path: str | None = None) -> str:
    parts = [quote(ctx.host.python), quote_path(ctx.paths.helper(FIXER))]
    parts += [quote(f) for f in flags]
    parts += ["--", quote_path(path or ctx.run.drafter)]  # a path is never read as an option
    return " ".join(parts)


def store_path(ctx: StepContext, fingerprint: str) -> str:
    return path_join(ctx.paths.drafters, fingerprint[:32])


def staging_path(ctx: StepContext, fingerprint: str) -> str:
    return path_join(ctx.paths.drafters, f".staging-{fingerprint[:32]}")


def stage_command(ctx: StepContext, fingerprint: str) -> str:
    """Copy the user's checkpoint into a fresh staging dir; -L: a symlinked shard becomes a file,
    so converting the copy can never write through a link into the user's checkpoint."""
    staging = quote_path(staging_path(ctx, fingerprint))
    # a copy that fails half-way (a full disk) leaves no partial staging dir behind
    return (f"mkdir -p -m 700 {quote_path(ctx.paths.drafters)} && rm -rf -- {staging} && "
            f"mkdir -m 700 -- {staging} && "
            f"{{ cp -RL --preserve=timestamps --reflink=auto -- {quote_path(ctx.run.drafter)}/. {staging}/ "
            f"|| {{ rm -rf -- {staging}; exit 1; }}; }}")


def publish_command(ctx: StepContext, fingerprint: str) -> str:
    final = quote_path(store_path(ctx, fingerprint))
    staging = quote_path(staging_path(ctx, fingerprint))
    return (f"printf '%s\\n' {quote(fingerprint)} > {staging}/.deployctl-ready && "
            f"rm -rf -- {final} && mv -T -- {staging} {final}")


def probe_store_command(ctx: StepContext, fingerprint: str) -> str:
    """Prints the marker's content when the store holds this drafter converted; touches it (LRU)."""
    final = quote_path(store_path(ctx, fingerprint))
    return f"cat -- {final}/.deployctl-ready 2>/dev/null && touch -c -- {final} || true"


def prune_command(ctx: StepContext) -> str:
    return " ".join([quote(ctx.host.python), quote_path(ctx.paths.helper("host_ops.py")), "prune-drafters",
                     "--store", quote_path(ctx.paths.drafters), "--keep", str(ctx.settings.keep_drafters),
                     "--last-good", quote_path(last_good_path(ctx.paths.root))])


def convert_flags(ctx: StepContext, version: str | None) -> list[str]:
    flags = ["--json", "--hidden-states-from", ctx.settings.hidden_states_from]
    if ctx.run.sglang_generation != "auto":
        flags += ["--sglang-generation", ctx.run.sglang_generation]
    elif version:
        flags += ["--sglang-version", version]
    return flags


def parse_version(result, source: str, python: str = "python3") -> str:
    return parse_sglang_version(result.exit_code, result.stdout, result.stderr, source, python)


def parse_fixer_json(result, source: str) -> dict:
    return parse_fixer_summary(result.exit_code, result.stdout, result.stderr, source)


def plan(ctx: StepContext) -> list[PlannedCommand]:
    fp = "<fingerprint>"
    commands = [PlannedCommand("fingerprint the drafter (header bytes, sizes, mtimes)", fixer_command(ctx, "--fingerprint")),
                PlannedCommand("is it already converted in the drafter store?", probe_store_command(ctx, fp))]
    if ctx.run.sglang_generation == "auto":
        commands.append(PlannedCommand("read the installed SGLang version", version_command(ctx)))
    commands += [
        PlannedCommand("copy the drafter into a staging dir of the store (the original is never modified)",
                       stage_command(ctx, fp)),
        PlannedCommand("fingerprint the original again: unchanged while it was copied?",
                       fixer_command(ctx, "--fingerprint")),
        PlannedCommand("convert and verify the copy", fixer_command(ctx, *convert_flags(ctx, "<version>"),
                                                                    path=staging_path(ctx, fp))),
        PlannedCommand("publish it as drafters/<fingerprint>", publish_command(ctx, fp)),
        PlannedCommand(f"keep the {ctx.settings.keep_drafters} most recently used drafters and the last good one",
                       prune_command(ctx)),
    ]
    return commands


def _fingerprint(ctx: StepContext, timeout: float) -> str:
    conn = ctx.require_conn()
    current = parse_fixer_json(conn.run(fixer_command(ctx, "--fingerprint"), timeout=timeout), ctx.host.name)
    if current.get("status") == "error":
        raise DeployError(f"{ctx.host.name}: {ctx.run.drafter}: {current.get('error')}",
                          exit_code=exit_code_of(current.get("code", 1), ctx.host.name))
    fingerprint = current.get("fingerprint")
    if not isinstance(fingerprint, str) or not re.fullmatch(r"[0-9a-f]{32,128}", fingerprint):
        raise RemoteOutputError(f"{ctx.host.name}: the key fixer printed no valid fingerprint for {ctx.run.drafter}")
    return fingerprint


def _convert(ctx: StepContext, path: str, version: str | None, timeout: float) -> tuple[dict, dict]:
    conn = ctx.require_conn()
    source = ctx.host.name
    result = conn.run(fixer_command(ctx, *convert_flags(ctx, version), path=path), timeout=timeout)
    summary = parse_fixer_json(result, source)
    if summary["status"] == "error":
        code = exit_code_of(summary.get("code", ExitCode.CHECKPOINT), source)
        raise DeployError(f"{source}: key fix of {ctx.run.drafter}: {summary.get('error')}", exit_code=code)
    verification = summary.get("verification") or {}
    if verification.get("ok") is False or result.exit_code == ExitCode.VERIFY:
        # The fixer orders problems root cause first ("EAGLE3 currently only supports 1 layer" on
        # SGLang 0.5.11 and older); the dropped/missing name lists would bury it.
        gaps = (verification.get("problems") or []) or \
            ((verification.get("dropped") or []) + (verification.get("missing") or []))
        raise VerificationFailed(f"{source}: SGLang would not load the drafter {ctx.run.drafter} fully: "
                                 f"{'; '.join(map(str, gaps))[:800]}")
    if result.exit_code != 0:
        raise RemoteOutputError(f"{source}: key fixer exited {result.exit_code} with status {summary['status']!r}")
    return summary, verification


def run(ctx: StepContext) -> StepOutcome:
    conn = ctx.require_conn()
    timeout = ctx.timeout(ctx.run.timeouts.fix_keys_s)
    fingerprint = _fingerprint(ctx, timeout)
    store = store_path(ctx, fingerprint)
    ctx.memory.update(drafter_fingerprint=fingerprint, drafter_path=store)
    stored = conn.run(probe_store_command(ctx, fingerprint)).stdout.strip() == fingerprint
    if stored and ctx.settings.when == "changed":
        return StepOutcome("skipped", f"drafter unchanged, already converted in {store}",
                           {"fingerprint": fingerprint, "store": store})
    version = None
    if ctx.run.sglang_generation == "auto":
        # the doctor step already read it from the same package metadata in this run
        version = ctx.memory.get("sglang_version") or \
            parse_version(conn.run(version_command(ctx), timeout=60), ctx.host.name, ctx.run.sglang_python)
        ctx.memory["sglang_version"] = version
    if stored:  # the fixer is idempotent: "already converted", nothing written
        summary, verification = _convert(ctx, store, version, timeout)
    else:
        conn.check(stage_command(ctx, fingerprint), timeout=timeout, what=f"copying {ctx.run.drafter} into the drafter store")
        try:
            # The original fingerprinted again after the copy: a different answer means a training
            # job was still writing the checkpoint while we copied it (the copy may be torn).
            if _fingerprint(ctx, timeout) != fingerprint:
                raise DeployError(f"{ctx.host.name}: {ctx.run.drafter} changed while it was being copied into the "
                                  "drafter store (is it still being written?); nothing was deployed, try again",
                                  exit_code=ExitCode.CHECKPOINT)
            summary, verification = _convert(ctx, staging_path(ctx, fingerprint), version, timeout)
        except DeployError:
            conn.run(f"rm -rf -- {quote_path(staging_path(ctx, fingerprint))}")
            raise
        conn.check(publish_command(ctx, fingerprint), what="publishing the converted drafter")
        # only a new drafter can push an old one out of the store
        ctx.memory["pruned"] = conn.run(prune_command(ctx), timeout=120).stdout.strip()[:500]
    renamed = len(summary.get("renames") or [])
    data = {"status": summary["status"], "renamed": renamed, "sglang_version": version,
            "verification": verification, "fingerprint": fingerprint, "store": store,
            "pruned": ctx.memory.get("pruned")}
    detail = "already converted" if summary["status"] == "already_converted" else f"converted, {renamed} keys renamed"
    return StepOutcome("ok", f"{detail} in {store}", data)
