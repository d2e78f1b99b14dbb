"""Facts the host-side helper (deploy/remote/host_ops.py) reports as one JSON document each.

Each fact is a command builder (pure: its arguments are the host's python, the helper's path and
the options) and a strict parser into a pydantic model (``model_validate_json``, strict types, no
unknown keys). Anything else the host prints is a RemoteOutputError (exit 5) naming the host: never
read as "fine". Table-tested from captured helper output in tests/facts/<fact>/.
"""

from __future__ import annotations

import json

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from deploy.base.errors import RemoteCommandFailed, RemoteOutputError
from deploy.base.shell import quote, quote_path
from deploy.facts.helpers import helper_python


class _Fact(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


M = TypeVar("M", bound=_Fact)


def _parse(model: type[M], output: str, source: str, what: str) -> M:
    try:
        return model.model_validate_json(output)
    except (ValidationError, ValueError, RecursionError):  # serde's own depth limit ends deep nesting
        raise RemoteOutputError(f"{source}: {what} printed unexpected output: {output[:300]!r}") from None


# -- stop-processes: SIGTERM, grace, SIGKILL --------------------------------------------------------


class StoppedProcess(_Fact):
    pid: int
    cmdline: str
    signal: Literal["TERM", "KILL"]
    exited: bool
    error: str | None = None


class StopReport(_Fact):
    scope: Literal["user", "pidfile"] | None = None
    processes: list[StoppedProcess]
    note: str | None = None
    helper_pid: int | None = None
    #: scope pidfile: host_ops.check_server_pid's verdict on the PID file (facts.server.PID_CHECKS)
    pid_check: Literal["verified", "unverified", "not-ours", "elsewhere", "dead", "invalid", "none"] | None = None
    #: what really runs when the PID file does not name the server deployctl launched
    running: str | None = None


def stop_processes_command(python: str, helper: str, scope: str, grace_s: float, pidfile: str | None = None,
                           exclude: tuple[str, ...] | list[str] = (), record: str | None = None) -> str:
    parts = [helper_python(python), quote_path(helper), "stop-processes", "--scope", scope, "--grace", f"{grace_s:g}"]
    if scope == "pidfile":
        parts += ["--pidfile", quote_path(pidfile or "")]
        if record:
            parts += ["--record", quote_path(record)]  # the PID's command line must be its argv
    else:
        for pattern in exclude:
            parts += ["--exclude", quote(pattern)]
    return " ".join(parts)


def parse_stop_report(output: str, source: str) -> StopReport:
    return _parse(StopReport, output, source, "stop-processes")


# -- probe: PID alive, GET /health, last log line ---------------------------------------------------


class Probe(_Fact):
    pid: int | None = None
    alive: bool
    status: int | None
    error: str | None = None
    error_kind: Literal["refused", "timeout", "other"] | None = None
    body: str = ""
    last_log_line: str = ""

    @model_validator(mode="after")
    def _why_no_status(self) -> Probe:
        if self.status is None and self.error_kind is None:
            raise ValueError("no HTTP status and no error_kind")
        return self


def probe_command(python: str, helper: str, url: str, pid: int | str, log: str) -> str:
    return " ".join([helper_python(python), quote_path(helper), "probe", "--url", quote(url), "--pid", str(pid),
                     "--log", quote_path(log)])


def parse_probe(output: str, source: str) -> Probe:
    return _parse(Probe, output, source, "probe")


# -- accept-check: greedy /generate requests, accept length from meta_info --------------------------


class AcceptSample(_Fact):
    completion_tokens: int
    spec_verify_ct: int


class AcceptCheck(_Fact):
    ok: bool
    error: str | None = None
    accept_length: float | None = None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    server_avg_spec_accept_length: float | None = None
    samples: list[AcceptSample] = []

    @model_validator(mode="after")
    def _measured(self) -> AcceptCheck:
        if self.ok and self.accept_length is None:
            raise ValueError("ok without accept_length")
        return self


def accept_check_command(python: str, helper: str, base_url: str, requests: int, max_new_tokens: int,
                         prompts: list[str] | None = None, concurrency: int = 1, key_from: str | None = None) -> str:
    """``prompts``: sent in turn (cycled), one JSON argument (a single line in the plan, newlines
    escaped); ``concurrency``: at most this many requests in flight; ``key_from``: the deployment record
    whose ``--api-key`` the requests carry (read on the host, host_ops.server_api_key: never on this line)."""
    argv = [helper_python(python), quote_path(helper), "accept-check", "--base", quote(base_url),
            "--requests", str(requests), "--max-new-tokens", str(max_new_tokens), "--concurrency", str(concurrency)]
    if prompts:
        argv += ["--prompts-json", quote(json.dumps(prompts, ensure_ascii=True))]
    if key_from:
        argv += ["--key-from", quote_path(key_from)]
    return " ".join(argv)


def api_key_env(python: str, helper: str, record: str) -> str:
    """A shell prefix that gives bench_serving the server's ``--api-key`` the way it reads one
    (``OPENAI_API_KEY``, sglang/benchmark/serving.py ``get_auth_headers``, 0.5.21-0.5.23), read on the
    host from the deployment record by the installed helper: the key never travels on the command line.
    An empty value (no key) is what bench_serving treats as none."""
    return f'OPENAI_API_KEY="$({helper_python(python)} {quote_path(helper)} api-key --record {quote_path(record)})"'


def parse_accept_check(output: str, source: str) -> AcceptCheck:
    return _parse(AcceptCheck, output, source, "accept-check")


# -- watch-health: wait-ready's poll on the host, one probe JSON line per change ------------------


def watch_health_command(python: str, helper: str, url: str, pid: int | str, log: str, *, interval_s: float,
                         every_s: float, for_s: float) -> str:
    """Each line it prints is a probe (``parse_probe``); it stops by itself after ``for_s``."""
    return " ".join([helper_python(python), quote_path(helper), "watch-health", "--url", quote(url), "--pid", str(pid),
                     "--log", quote_path(log), "--interval", f"{interval_s:g}", "--every", f"{every_s:g}",
                     "--for", f"{for_s:g}", "--until-stdin-eof"])


# -- watch-gpus: wait-gpus-free's poll on the host, both nvidia-smi answers per change ------------


class QueryAnswer(_Fact):
    exit_code: int
    stdout: str
    stderr: str


class GpuSample(_Fact):
    gpus: QueryAnswer
    apps: QueryAnswer


def watch_gpus_command(python: str, helper: str, gpu_query: str, apps_query: str, *, interval_s: float,
                       every_s: float, for_s: float) -> str:
    """Each line it prints is a GpuSample: the raw answers of the two queries, parsed by facts.gpus."""
    return " ".join([helper_python(python), quote_path(helper), "watch-gpus", "--gpu-query", quote(gpu_query),
                     "--apps-query", quote(apps_query), "--interval", f"{interval_s:g}", "--every", f"{every_s:g}",
                     "--for", f"{for_s:g}", "--until-stdin-eof"])


def check_watch_ended(exit_code: int | None, stderr: str, source: str, what: str) -> None:
    """A watch that ended by itself must have exited 0 (its deadline); anything else is its failure."""
    if exit_code in (None, 0):
        return
    missing = "can't open file" in stderr or "No such file" in stderr
    hint = " (the host-side helper is missing: run ensure-helper before this step)" if missing else ""
    raise RemoteCommandFailed(f"{source}: {what} failed with exit code {exit_code}{hint}: {stderr.strip()[-800:]}")


def parse_gpu_sample(output: str, source: str) -> GpuSample:
    return _parse(GpuSample, output, source, "watch-gpus")
