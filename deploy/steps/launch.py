"""launch: start SGLang with the drafter, fully detached, PID and log in the state directory.

``setsid nohup CMD > LOG 2>&1 < /dev/null &``: a background start over SSH hangs unless every
stream is detached, and setsid makes the server a session leader, so ``stop-stale --scope pidfile``
can stop its TP workers by session id. One log per launch; ``logs/latest.log`` points at the last.

The run's environment (often HF_TOKEN and the like) never appears on a command line, in the plan
or in a report: it is uploaded by SFTP as a 0600 file in the state dir and sourced by the launch.

Every launch writes ``deployment.json`` (argv, drafter fingerprint and store path, environment
hash, SGLang version, PID, log): ``converge`` compares it with what it would launch, and a
rollback relaunches the last good one's argv exactly. Log names carry microseconds and a random
suffix (two launches in the same second never share a log); only the newest 20 are kept.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from deploy.config.models import Host, Run
from deploy.errors import RemoteCommandFailed, RemoteOutputError
from deploy.facts.server import deployment_path, env_hash
from deploy.shell import path_join, quote, quote_path
from deploy.steps.base import PlannedCommand, StepContext, StepOutcome, StepSettings

NAME = "launch"


#: steps the orchestrator skips when ``converge`` found the server already running as desired
CONVERGE_SKIPS = True
KEEP_LOGS = 20


class Settings(StepSettings):
    pass


def speculative_plan(run: Run, draft_tokens: int) -> tuple[int, int, int]:
    """(num_steps, topk, num_draft_tokens) passed explicitly.

    With topk 1 SGLang logs a warning and silently rewrites num_draft_tokens to num_steps + 1, so
    "16 draft tokens" must be sent as num_steps 15 (sglang server_args, all versions in use).
    """
    if run.eagle_topk == 1:
        return draft_tokens - 1, 1, draft_tokens
    assert run.speculative_num_steps is not None
    return run.speculative_num_steps, run.eagle_topk, draft_tokens


def serve_address(run: Run, host: Host) -> str:
    return run.serve_host or host.address


def probe_address(run: Run, host: Host) -> str:
    address = serve_address(run, host)
    return "127.0.0.1" if address in ("0.0.0.0", "::") else address


def sglang_argv(run: Run, host: Host, draft_tokens: int, drafter: str | None = None) -> list[str]:
    steps, topk, tokens = speculative_plan(run, draft_tokens)
    return [
        run.sglang_python, "-m", "sglang.launch_server",
        "--model-path", run.base_model,
        "--speculative-algorithm", run.speculative_algorithm,
        "--speculative-draft-model-path", drafter or run.drafter,
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(tokens),
        "--tp-size", str(run.tp_size),
        "--host", serve_address(run, host),
        "--port", str(run.port),
        "--trust-remote-code",
        *run.extra_args,
    ]


PATH_POSITIONS = ("--model-path", "--speculative-draft-model-path")


def _quoted_argv(argv: list[str]) -> str:
    words = []
    for i, arg in enumerate(argv):
        words.append(quote_path(arg) if i > 0 and argv[i - 1] in PATH_POSITIONS else quote(arg))
    return " ".join(words)


def env_path(ctx: StepContext) -> str:
    return path_join(ctx.paths.root, "launch.env")


def env_file_text(env: dict[str, str]) -> str:
    return "".join(f"{name}={quote(value)}\n" for name, value in sorted(env.items()))


def desired_argv(ctx: StepContext) -> list[str]:
    """What this run launches: the run's flags with the drafter from the store (fix-keys put its
    path in memory), or, during a rollback, the last good deployment's argv exactly."""
    rollback = ctx.memory.get("rollback_record")
    if rollback is not None:
        return list(rollback["argv"])
    return sglang_argv(ctx.run, ctx.host, ctx.draft_tokens, ctx.memory.get("drafter_path"))


def desired_record(ctx: StepContext) -> dict:
    """The desired state recorded on the host at launch (compared by converge)."""
    rollback = ctx.memory.get("rollback_record")
    if rollback is not None:
        return {k: rollback.get(k) for k in ("run", "argv", "drafter_fingerprint", "drafter_path", "env_hash",
                                              "sglang_version", "draft_tokens", "env_file")}
    return {"run": ctx.run.name, "argv": desired_argv(ctx),
            "drafter_fingerprint": ctx.memory.get("drafter_fingerprint"),
            "drafter_path": ctx.memory.get("drafter_path") or ctx.run.drafter,
            "env_hash": env_hash(ctx.run.env), "sglang_version": ctx.memory.get("sglang_version"),
            "draft_tokens": ctx.draft_tokens, "env_file": env_path(ctx) if ctx.run.env else None}


def new_log_name() -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"sglang-{stamp}-{secrets.token_hex(3)}.log"


def log_path(ctx: StepContext) -> str:
    return ctx.memory.get("log") or path_join(ctx.paths.logs, "sglang-<UTC time>-<random>.log")


def prune_logs_command(ctx: StepContext) -> str:
    # Our names sort by time; anything else in logs/ is left alone.
    return (f"cd {quote_path(ctx.paths.logs)} && ls -1 | grep -E '^sglang-[0-9]{{8}}T[0-9.]+Z(-[0-9a-f]+)?\\.log$' "
            f"| sort -r | tail -n +{KEEP_LOGS + 1} | while IFS= read -r f; do rm -f -- \"$f\"; done; true")


def record_command(ctx: StepContext, record: dict) -> str:
    path = quote_path(deployment_path(ctx.paths.root))
    # on a full disk the 0-byte temporary file is removed and the old record stays
    return (f"{{ printf '%s\\n' {quote(json.dumps(record, sort_keys=True))} > {path}.tmp && mv -f -- {path}.tmp {path}; }} "
            f"|| {{ rm -f -- {path}.tmp; exit 1; }}")


def prepare_command(ctx: StepContext) -> str:
    """Log directory and the latest.log link, checked on their own before the launch.

    In ``mkdir && cd && ln && setsid nohup ... &`` the ``&`` backgrounds the whole chain: a failing
    mkdir still printed a PID and surfaced later as "exited during startup" with an empty log.
    """
    name = quote(log_path(ctx).rsplit("/", 1)[-1])
    return (f"mkdir -p -m 700 -- {quote_path(ctx.paths.logs)} && "
            f"ln -sfn -- {name} {quote_path(ctx.paths.latest_log)}")


def command(ctx: StepContext, argv: list[str]) -> str:
    # cd and the environment file are in the foreground: if either fails the shell exits non-zero
    # before anything is started; only the server itself is backgrounded. A rollback sources the
    # environment file the last good deployment was launched with.
    env_file = ctx.memory.get("env_file") if "rollback_record" in ctx.memory else (env_path(ctx) if ctx.run.env else None)
    env = f"set -a && . {quote_path(env_file)} && set +a || exit 1; " if env_file else ""
    log = quote_path(log_path(ctx))
    pidfile = quote_path(ctx.paths.pidfile)
    return (
        f"cd -- {quote_path(ctx.paths.root)} || exit 1; {env}"
        f"setsid nohup {_quoted_argv(argv)} > {log} 2>&1 < /dev/null & "
        f"pid=$!; {{ printf '%s\\n' \"$pid\" > {pidfile}.tmp && mv -f -- {pidfile}.tmp {pidfile}; }} "
        f"|| {{ rm -f -- {pidfile}.tmp; echo \"cannot write the PID file {pidfile} (server pid $pid)\" >&2; exit 1; }}; "
        f"echo \"$pid\""
    )


def plan(ctx: StepContext) -> list[PlannedCommand]:
    argv = sglang_argv(ctx.run, ctx.host, ctx.draft_tokens, ctx.memory.get("drafter_path"))
    planned = []
    if ctx.run.env:
        names = ", ".join(sorted(ctx.run.env))
        planned.append(PlannedCommand(f"upload the run's environment ({names}; values not shown) as a 0600 file",
                                      f"sftp put <env> -> {env_path(ctx)}"))
    return planned + [
        PlannedCommand("create the log directory and point logs/latest.log at this launch's log",
                       prepare_command(ctx)),
        PlannedCommand("launch SGLang detached (setsid nohup), PID file and log in the state dir",
                       command(ctx, argv), argv=argv),
        PlannedCommand("record the desired state (argv, drafter fingerprint, env hash, SGLang version, PID, log)",
                       record_command(ctx, {"argv": argv, "pid": "<pid>"})),
        PlannedCommand(f"keep the newest {KEEP_LOGS} server logs", prune_logs_command(ctx)),
    ]


def upload_env(ctx: StepContext) -> None:
    conn = ctx.require_conn()
    conn.check(f"mkdir -p -m 700 -- {quote_path(ctx.paths.root)}", what="creating the state directory")
    fd, local = tempfile.mkstemp(prefix="deployctl-env-")
    try:
        os.fchmod(fd, 0o600)  # SFTP put keeps the local mode
        with os.fdopen(fd, "w") as handle:
            handle.write(env_file_text(ctx.run.env))
        # via a temporary name: a full disk must not leave a truncated environment file behind
        final = conn.resolve(env_path(ctx))
        try:
            conn.put(Path(local), final + ".upload")
        except RemoteCommandFailed:
            conn.run(f"rm -f -- {quote_path(final + '.upload')}")
            raise
        conn.check(f"mv -f -- {quote_path(final + '.upload')} {quote_path(final)}", what="installing the environment file")
    finally:
        os.unlink(local)


def run(ctx: StepContext) -> StepOutcome:
    conn = ctx.require_conn()
    argv = desired_argv(ctx)
    if ctx.run.env and "rollback_record" not in ctx.memory:
        upload_env(ctx)
    ctx.memory["log"] = path_join(ctx.paths.logs, new_log_name())
    conn.check(prepare_command(ctx), timeout=ctx.timeout(60), what="preparing the log directory")
    result = conn.check(command(ctx, argv), timeout=ctx.timeout(60), what="launching SGLang")
    text = result.stdout.strip()
    if not re.fullmatch(r"\d+", text):
        raise RemoteOutputError(f"{ctx.host.name}: launch printed {text[:200]!r}, expected the server PID")
    pid = int(text)
    record = desired_record(ctx) | {"pid": pid, "log": log_path(ctx),
                                     "launched_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    conn.check(record_command(ctx, record), what="recording the deployment")
    conn.run(prune_logs_command(ctx))
    ctx.memory.update(pid=pid, deployment=record, launched=True)
    steps, topk, tokens = speculative_plan(ctx.run, ctx.draft_tokens)
    return StepOutcome("ok", f"pid {pid}, log {log_path(ctx)}",
                       {"pid": pid, "log": log_path(ctx), "argv": argv, "drafter": record["drafter_path"],
                        "num_steps": steps, "topk": topk, "draft_tokens": tokens})
