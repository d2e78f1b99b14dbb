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
import re
from datetime import datetime, timezone

from deploy.config.models import Host, Run
from deploy.base.errors import RemoteOutputError
from deploy.facts.helpers import write_file_command
from deploy.facts.server import PID_MARK, deployment_path, record_stdin  # noqa: F401 (record_stdin re-exported)
from deploy.host.sglang_argv import PATH_POSITIONS, speculative_plan
from deploy.host.deployment import DesiredDeployment, desired_deployment
from deploy.host.records import DeploymentRecord, DrafterUpdate
from deploy.base.shell import path_join, quote, quote_path
from deploy.host.state_layout import SERVER_LOG_PATTERN, SERVER_LOG_PLACEHOLDER, server_log_name
from deploy.steps.base import Action, Command, StepContext, StepOutcome, StepSettings, Upload, UploadFile

NAME = "launch"


#: steps the orchestrator skips when ``converge`` found the server already running as desired
CONVERGE_SKIPS = True
KEEP_LOGS = 20


class Settings(StepSettings):
    pass


def _quoted_argv(argv: list[str]) -> str:
    words = []
    for i, arg in enumerate(argv):
        words.append(quote_path(arg) if i > 0 and argv[i - 1] in PATH_POSITIONS else quote(arg))
    return " ".join(words)


def env_path(ctx: StepContext) -> str:
    return ctx.paths.env_file


def env_file_text(env: dict[str, str]) -> str:
    return "".join(f"{name}={quote(value)}\n" for name, value in sorted(env.items()))


def desired(ctx: StepContext) -> DesiredDeployment:
    """What this launch starts: the run's deployment with the drafter from the store (fix-keys put
    its path in memory) and the doctor's decisions, or, during a rollback, the last good deployment
    exactly (deploy/host/deployment.py: the one place it is computed)."""
    rollback = ctx.memory.rollback_record
    if rollback is not None:
        return DesiredDeployment.of_record(rollback)
    return desired_deployment(ctx.run, ctx.host, ctx.draft_tokens, drafter_path=ctx.memory.drafter_path,
                              drafter_fingerprint=ctx.memory.drafter_fingerprint,
                              sglang_version=ctx.memory.sglang_version,
                              draft_quantization=ctx.memory.draft_quantization)


def desired_argv(ctx: StepContext) -> list[str]:
    return list(desired(ctx).argv)


def desired_record(ctx: StepContext) -> DeploymentRecord:
    """The desired state recorded on the host at launch (compared by converge).

    A launch after swap-drafter chose the reload (issue 41: a swap refused or failed, or not asked
    for) says so: ``drafter_update: {how: reloaded, why, asked, ...}``, so the host's record tells a
    fallback from a swap; a rollback relaunches the last good record as it was."""
    record = desired(ctx).record()
    update = ctx.memory.drafter_update
    if ctx.memory.rollback_record is None and update is not None and update.how == "reloaded":
        return record.but(drafter_update=update.without("verified"))
    return record


def new_log_name() -> str:
    return server_log_name()


def log_path(ctx: StepContext) -> str:
    return ctx.memory.log or path_join(ctx.paths.logs, SERVER_LOG_PLACEHOLDER)


def prune_logs_command(ctx: StepContext) -> str:
    # Our names sort by time; anything else in logs/ is left alone. A subshell: the cd stays in it.
    return (f"( cd {quote_path(ctx.paths.logs)} && ls -1 | grep -E {quote(SERVER_LOG_PATTERN)} "
            f"| sort -r | tail -n +{KEEP_LOGS + 1} | while IFS= read -r f; do rm -f -- \"$f\"; done ); true")


def _written(ctx: StepContext, path: str, payload: str | None, what: str) -> str:
    """``payload``'s output (None: the command's own stdin) into ``path`` through host_ops.py
    write-file (a temporary name created exclusively, renamed over a regular file only: a full disk
    leaves the old file, a FIFO or device there is refused, never replaced).

    The message names the path as printf's argument: a quoted path inside a double-quoted echo
    would let a path holding ``"`` or ``$`` break out of the quoting.
    """
    writer = write_file_command(ctx.host.python, ctx.paths.helper("host_ops.py"), path)
    return (f"{{ {payload + ' | ' if payload is not None else ''}{writer}; }} "
            f"|| {{ printf 'cannot write %s %s (server pid %s)\\n' {quote(what)} {path} \"$pid\" >&2; "
            f"exit 1; }}")


def command(ctx: StepContext, argv: list[str], record: DeploymentRecord) -> str:
    """The whole launch, as one shell script (one exec channel).

    The log directory and link are made first, on their own line: in ``mkdir && ln && setsid nohup ... &``
    the ``&`` would background the whole chain, and a failing mkdir still printed a PID. cd and the
    environment file are in the foreground too: if either fails the shell exits non-zero before
    anything is started; only the server itself is backgrounded. Then the PID file, the deployment
    record (with the PID) and the log pruning; the PID is the script's only output.
    A rollback sources the environment file the last good deployment was launched with.
    """
    env_file = record.env_file
    env = f"set -a && . {quote_path(env_file)} && set +a || exit 1; " if env_file else ""
    name = quote(log_path(ctx).rsplit("/", 1)[-1])
    log = quote_path(log_path(ctx))
    pidfile = quote_path(ctx.paths.pidfile)
    deployment = quote_path(deployment_path(ctx.paths.root))
    pid_payload = "printf '%s\\n' \"$pid\""
    # the record comes on the script's stdin (record_stdin), its PID filled in here: the server's
    # own stdin is /dev/null, nothing before this line reads it
    record_payload = f"sed 's/\"{PID_MARK}\"/'\"$pid\"'/g'"
    return (
        f"mkdir -p -m 700 -- {quote_path(ctx.paths.logs)} && ln -sfn -- {name} {quote_path(ctx.paths.latest_log)} || exit 1; "
        f"cd -- {quote_path(ctx.paths.root)} || exit 1; {env}"
        f"setsid nohup {_quoted_argv(argv)} > {log} 2>&1 < /dev/null & "
        f"pid=$!; {_written(ctx, pidfile, pid_payload, 'the PID file')}; "
        f"{_written(ctx, deployment, record_payload, 'the deployment record')}; "
        f"{prune_logs_command(ctx)}; echo \"$pid\""
    )


def launch_record(ctx: StepContext, launched_at: str) -> DeploymentRecord:
    return desired_record(ctx).but(log=log_path(ctx), launched_at=launched_at)


def env_upload_action(ctx: StepContext) -> Upload:
    names = ", ".join(sorted(ctx.run.env))
    return Upload(description=f"upload the run's environment ({names}; values not shown) as a 0600 file",
                  when="the run sets env; a rollback sources the last good one's copy instead",
                  directory=ctx.paths.root, secret=True,
                  files=(UploadFile(remote=env_path(ctx), content=env_file_text(ctx.run.env).encode(), mode=0o600),))


def launch_action(ctx: StepContext, launched_at: str = "<launch time>") -> Command:
    argv = desired_argv(ctx)
    return Command(description=f"launch SGLang detached (setsid nohup): log dir and logs/latest.log, PID file, "
                               f"deployment record (argv, drafter fingerprint, env hash, SGLang version, PID, log), "
                               f"keep the newest {KEEP_LOGS} logs; with --speculative-draft-model-quantization "
                               "unquant when the doctor found a quantized target and an unquantized drafter",
                   command=command(ctx, argv, launch_record(ctx, launched_at)), argv=argv,
                   stdin=record_stdin(launch_record(ctx, launched_at), ctx.host.name, "the deployment record",
                                      pid_mark=True),
                   stdin_shown="the deployment record (JSON, its PID filled in on the host)",
                   timeout_s=ctx.timeout(60), what="launching SGLang")


def plan(ctx: StepContext) -> list[Action]:
    actions: list[Action] = [env_upload_action(ctx)] if ctx.run.env else []
    actions.append(launch_action(ctx))
    ctx.memory.log = log_path(ctx)  # what wait-ready's plan watches: this launch's log
    return actions


def run(ctx: StepContext) -> StepOutcome:
    if ctx.run.env and ctx.memory.rollback_record is None:
        ctx.execute_upload(env_upload_action(ctx))
    ctx.memory.log = path_join(ctx.paths.logs, new_log_name())
    launched_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    launch = launch_action(ctx, launched_at)
    text = ctx.execute(launch).stdout.strip()
    if not re.fullmatch(r"\d+", text):
        raise RemoteOutputError(f"{ctx.host.name}: launch printed {text[:200]!r}, expected the server PID")
    pid = int(text)
    record = launch_record(ctx, launched_at).but(pid=pid)
    ctx.memory.pid, ctx.memory.deployment, ctx.memory.launched = pid, record, True
    steps, topk, tokens = speculative_plan(ctx.run, ctx.draft_tokens)
    assert launch.argv is not None
    return StepOutcome("ok", f"pid {pid}, log {log_path(ctx)}",
                       {"pid": pid, "log": log_path(ctx), "argv": launch.argv, "drafter": record.drafter_path,
                        "num_steps": steps, "topk": topk, "draft_tokens": tokens})
