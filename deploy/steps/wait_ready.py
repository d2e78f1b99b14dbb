"""wait-ready: poll /health until 200 while the server PID stays alive.

SGLang answers /health with 503 until warmup is done and refuses connections before uvicorn
starts (after the weights are loaded); a 1T-parameter model loads for many minutes, so the
default timeout is the run's ``timeouts.ready_s`` (30 min). Those two answers are "loading";
any other status (404: something else owns the port; 500) fails at once with the status and a
body excerpt, and a dead server (OOM, a bad flag, the port taken) fails at once with its log tail.

The poll runs on the host (host_ops.py watch-health: PID liveness + GET /health every ``interval_s``,
one probe JSON line per change and a heartbeat): one exec channel for the whole wait, however long
the load, and no python started per poll. Each line is parsed strictly (facts.host_helper.parse_probe)
and classified here; once classified as anything but "loading" the channel is closed.
"""

from __future__ import annotations

import re
import time

from pydantic import Field

from deploy.base.errors import RemoteOutputError, ServerDied, ServerUnhealthy, StepTimeout
from deploy.facts import host_helper
from deploy.base.shell import quote_path
from deploy.steps.base import Command, StepContext, StepOutcome, StepSettings, Watch
from deploy.host.sglang_argv import probe_address

NAME = "wait-ready"
TAIL_LINES = 50


CONVERGE_SKIPS = True
#: /health answers that mean "still loading" while the PID lives (SGLang 0.5.x: 503 until warm)
LOADING_STATUSES = (503,)
LOADING_ERRORS = ("refused", "timeout")


class Settings(StepSettings):
    interval_s: float = Field(default=0.2, gt=0, le=60)
    progress_every_s: float = Field(default=10.0, gt=0)
    #: the host-side loop reports at least this often even when nothing changed (progress, liveness)
    heartbeat_s: float = Field(default=1.0, gt=0, le=60)


def health_url(ctx: StepContext) -> str:
    address = probe_address(ctx.run, ctx.host)
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{ctx.run.port}/health"


def watch_command(ctx: StepContext, pid: int | str, log: str) -> str:
    return host_helper.watch_health_command(
        ctx.host.python, ctx.paths.helper("host_ops.py"), health_url(ctx), pid, log,
        interval_s=ctx.settings.interval_s, every_s=ctx.settings.heartbeat_s,
        for_s=ctx.timeout(ctx.run.timeouts.ready_s))


def tail_command(log: str, lines: int = TAIL_LINES) -> str:
    return f"tail -n {lines} -- {quote_path(log)}"


def died_message(ctx: StepContext, pid: int, log: str, tail: str, when: str) -> str:
    hint = ""
    if re.search(r"address already in use", tail, re.I):
        hint = f" (port {ctx.run.port} is already taken on the host)"
    return f"{ctx.host.name}: server died: SGLang (pid {pid}) exited {when}{hint}. Last {TAIL_LINES} lines of {log}:\n{tail}"


def classify(probe: dict) -> str:
    """ready | loading | dead | unhealthy, from one probe."""
    if not probe["alive"]:
        return "dead"
    if probe["status"] == 200:
        return "ready"
    if probe["status"] in LOADING_STATUSES or (probe["status"] is None and probe.get("error_kind") in LOADING_ERRORS):
        return "loading"
    return "unhealthy"


def read_pid_action(ctx: StepContext) -> Command:
    return Command(description="read the server PID from the PID file",
                   when="no launch in this run reported the PID", command=f"cat -- {quote_path(ctx.paths.pidfile)}")


def log_of(ctx: StepContext) -> str:
    return ctx.memory.log or ctx.paths.latest_log


def watch_action(ctx: StepContext, pid: int | None = None) -> Watch:
    timeout = ctx.timeout(ctx.run.timeouts.ready_s)
    shown: int | str = pid if pid is not None else (ctx.memory.pid if ctx.memory.pid is not None else "<pid>")
    # the host loop ends itself at the deadline; the channel gets a little longer for the last line
    return Watch(description=f"poll {health_url(ctx)} and the PID on the host every {ctx.settings.interval_s:g} s "
                             f"up to {timeout:g} s, one line per change",
                 command=watch_command(ctx, shown, log_of(ctx)), timeout_s=timeout + 10,
                 # a sample is one /health GET (5 s timeout in host_ops watch-health) after the heartbeat's wait
                 silence_s=ctx.settings.heartbeat_s + ctx.settings.interval_s + 5 + 2)


def tail_action(ctx: StepContext) -> Command:
    return Command(description=f"show the last {TAIL_LINES} log lines", when="the server died or did not become ready",
                   command=tail_command(log_of(ctx)))


def plan(ctx: StepContext) -> list[Command | Watch]:
    return [read_pid_action(ctx), watch_action(ctx), tail_action(ctx)]


def _pid_and_log(ctx: StepContext) -> tuple[int, str]:
    if ctx.memory.pid is not None:
        return ctx.memory.pid, log_of(ctx)
    text = ctx.execute(read_pid_action(ctx)).stdout.strip()
    if not re.fullmatch(r"\d+", text):
        raise RemoteOutputError(f"{ctx.host.name}: no server PID recorded in {ctx.paths.pidfile} (launch first)")
    return int(text), log_of(ctx)


def run(ctx: StepContext) -> StepOutcome:
    pid, log = _pid_and_log(ctx)
    timeout = ctx.timeout(ctx.run.timeouts.ready_s)
    started = time.monotonic()
    seen: dict = {"probe": None, "state": None, "last_progress": started}

    def on_line(line: str) -> bool:
        probe = host_helper.parse_probe(line, ctx.host.name).model_dump()
        state = classify(probe)
        seen["probe"], seen["state"] = probe, state
        now = time.monotonic()
        if state == "loading" and now - seen["last_progress"] >= ctx.settings.progress_every_s:
            seen["last_progress"] = now
            ctx.progress(f"{now - started:.0f} s, /health {probe['status'] or 'no answer'}: {probe.get('last_log_line', '')}")
        return state != "loading"

    watched = ctx.execute_watch(watch_action(ctx, pid), on_line)
    host_helper.check_watch_ended(watched.exit_code, watched.stderr, ctx.host.name, "watch-health")
    elapsed = time.monotonic() - started
    probe, state = seen["probe"], seen["state"]
    if state == "ready":
        return StepOutcome("ok", f"healthy after {elapsed:.1f} s", {"elapsed_s": round(elapsed, 2), "url": health_url(ctx)})
    if state == "dead":
        tail = ctx.execute(tail_action(ctx)).stdout.rstrip()
        raise ServerDied(died_message(ctx, pid, log, tail, f"during startup after {elapsed:.1f} s"))
    if state == "unhealthy":
        answer = f"HTTP {probe['status']}" if probe["status"] is not None else f"error: {probe.get('error')}"
        body = " ".join(str(probe.get("body") or "").split())[:200]
        raise ServerUnhealthy(
            f"{ctx.host.name}: {health_url(ctx)} answered {answer}"
            f"{f' ({body!r})' if body else ''} while SGLang (pid {pid}) is starting; only 503 and a "
            f"refused connection mean 'loading' (is something else listening on port {ctx.run.port}?)"
        )
    tail = ctx.execute(tail_action(ctx)).stdout.rstrip()
    last = (probe["status"] or probe["error"]) if probe is not None else "no probe"
    raise StepTimeout(
        f"{ctx.host.name}: SGLang (pid {pid}) not healthy after {timeout:g} s "
        f"(last /health: {last}). Last {TAIL_LINES} lines of {log}:\n{tail}"
    )
