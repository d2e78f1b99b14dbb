"""What a serving SGLang measures now: one read-only host command and a strict parser.

``status_command`` sends ``deploy/remote/server_status.py`` (with the host_ops.py it uses) inline
(``python3 -c``, nothing written on the host, no helper of a given version needed): the PID file's
server (alive, uptime), ``deployment.json`` and ``last-good.json``, ``/health``, and two reads of
the server's own figures ``window`` seconds apart (or around a few greedy ``--probe`` requests):
``/metrics`` (Prometheus text, only with ``--enable-metrics``), ``/server_info`` and ``/v1/loads``.
The host reports; ``parse_status`` decides, strictly: a document of another shape, a metric line
that is not Prometheus text, NaN or a negative count is a RemoteOutputError naming the host.

Where each live figure comes from (SGLang 0.5.23, srt/metrics/collector.py and scheduler):
- ``sglang:spec_accept_length`` is a gauge set at every decode log line (every
  ``--decode-log-interval`` = 40 decode steps) to that interval's accept length, so it shows a
  decay within a minute of traffic; it keeps its last value while the server is idle (0 before the
  first decode). ``/server_info``'s ``internal_states[0].avg_spec_accept_length`` is the average
  since start (or the last /flush_cache): the fallback without --enable-metrics, slow to move.
- output tok/s: the growth of ``sglang:generation_tokens_total`` between the two reads (what the
  server produced in the window, under whatever load it had); with ``--probe``, the probe's own
  tokens over its server-side latencies (``meta_info.e2e_latency``; the wall time when absent) at
  the last good benchmark's concurrency: the one figure measured under the benchmark's load, so
  the only one compared with the last good output tok/s.
- running / queued requests: ``sglang:num_running_reqs`` / ``num_queue_reqs`` (summed over the
  series: one per DP rank), else ``/v1/loads`` (0.5.23: one entry per DP rank).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from deploy.base.limits import parse_json
from deploy.base.errors import RemoteOutputError
from deploy.facts.helpers import helper_python, host_ops_modules
from deploy.base.once import built_once
from deploy.facts.inline import inline_program
from deploy.host.records import R, CanaryMark, DeploymentRecord, LastGood, Metrics, RecordShapeError, validated
from deploy.host.state_layout import canary_path, deployment_path, last_good_path
from deploy.base.shell import path_join, quote, quote_path

REMOTE = Path(__file__).resolve().parents[1] / "remote"
#: the accept length SGLang's gauge holds before its first decode (a real one is >= 1.0)
UNSET_ACCEPT = 1.0


@built_once
def status_program() -> str:
    """server_status.py with the host_ops.py it uses (its /proc readers, the verify prompts)."""
    return inline_program(host_ops_modules() + [("server_status", (REMOTE / "server_status.py").read_text())],
                          "server_status")


def status_command(python: str, state_dir: str, base_url: str, *, window_s: float = 2.0, probe: int = 0,
                   timeout_s: float = 5.0, script: str | None = None) -> str:
    """ONE command: server_status.py, inline. ``probe``: at least this many greedy requests after the
    reads when the server generated nothing in the window (0: none); their concurrency and length
    are the last good benchmark's, read on the host."""
    program = status_program() if script is None else script
    args = ["--pidfile", quote_path(path_join(state_dir, "server.pid")),
            "--record", quote_path(deployment_path(state_dir)), "--last-good", quote_path(last_good_path(state_dir)),
            "--canary", quote_path(canary_path(state_dir)),
            "--base", quote(base_url), "--window", f"{window_s:g}", "--timeout", f"{timeout_s:g}"]
    if probe:
        args += ["--probe", str(probe), "--concurrency", "0", "--max-new-tokens", "0"]
    return f"{helper_python(python)} -c {quote(program)} " + " ".join(args)


# -- the host's document, as printed ---------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class HttpAnswer(_Strict):
    status: Optional[int]
    error: Optional[str]
    body: str
    truncated: bool


class MetricsAnswer(_Strict):
    status: Optional[int]
    error: Optional[str]
    truncated: bool
    lines: list[str]
    total_lines: int


class Read(_Strict):
    t: float
    metrics: Optional[MetricsAnswer]
    server_info: HttpAnswer
    loads: HttpAnswer


class Health(_Strict):
    status: Optional[int]
    error: Optional[str]


class ProbeRequest(_Strict):
    wall_s: Optional[float] = None
    meta: Optional[dict[str, Any]] = None
    error: Optional[str] = None


class ProbeAnswer(_Strict):
    concurrency: int
    max_new_tokens: int
    wall_s: float
    requests: list[Optional[ProbeRequest]]


#: Linux's PID_MAX_LIMIT (4194304): a larger "PID" is not one
MAX_PID = 4 * 1024 * 1024


class StatusDocument(_Strict):
    schema_: int
    pid: Optional[int] = Field(ge=1, le=MAX_PID)
    alive: bool
    pidfile: str = Field(max_length=40)
    uptime_s: Optional[float] = Field(ge=0, le=10**10)
    record: Optional[dict[str, Any]]
    last_good: Optional[dict[str, Any]]
    health: Optional[Health]
    reads: list[Read]
    probe: Optional[ProbeAnswer]
    #: --probe was asked for but not sent: the server generated tokens in the window
    probe_skipped: bool = False
    #: canary.json: the replica is a canary (fleet/canary.py), while its server is the one named
    canary: Optional[dict[str, Any]] = None
    #: the host's clock when it read (Unix time): a canary mark's window is judged by it
    now: Optional[float] = None


# -- the fact --------------------------------------------------------------------------------------


class Baseline(_Strict):
    """The last good deployment's numbers (record-good wrote them after verification/benchmark)."""

    run: Optional[str]
    drafter_fingerprint: Optional[str]
    drafter_path: Optional[str]
    verified_at: Optional[str]
    draft_tokens: Optional[int]
    accept_length: Optional[float]
    output_tok_s: Optional[float]
    bench_settings: Optional[dict[str, Any]]
    #: whether the running deployment is this record's (argv, drafter, env, SGLang version)
    same_deployment: bool


class Live(_Strict):
    accept_length: Optional[float]
    accept_source: str
    output_tok_s: Optional[float]
    throughput_source: str
    #: measured under the last good benchmark's load (the probe at its concurrency): comparable
    throughput_comparable: bool
    #: SGLang's own decode throughput of its last log interval (gen_throughput / last_gen_throughput)
    server_gen_tok_s: Optional[float]
    running: Optional[int]
    queued: Optional[int]
    #: tokens were generated between the two reads
    traffic: bool
    window_s: Optional[float]
    source: str  # metrics | server_info | none


class HostStatus(_Strict):
    pid: Optional[int]
    alive: bool
    health: Optional[int]
    health_error: Optional[str]
    uptime_s: Optional[float]
    #: deployment.json as launch wrote it (None: none, or unreadable)
    deployment: Optional[DeploymentRecord]
    drafter_fingerprint: Optional[str]
    drafter_path: Optional[str]
    draft_tokens: Optional[int]
    sglang_version: Optional[str]
    live: Live
    last_good: Optional[Baseline]
    probe: Optional[dict[str, Any]]
    notes: list[str]
    #: in a canary window now (issue 43): its mark (run, since, until, others and, after 10 intervals, the
    #: window's acceptance_ratio, speed_ratio, intervals, canary_requests); None: not a canary
    canary: Optional[CanaryMark] = None

    @field_serializer("canary")
    def _canary_json(self, mark: Optional[CanaryMark]) -> Optional[dict[str, Any]]:
        """``status --json``'s ``canary``: run, since, until, others, and the figures it has (no PID, no outcome)."""
        if mark is None:
            return None
        return {"run": mark.run, "since": mark.since, "until": mark.until, "others": mark.others} | {
            key: getattr(mark, key) for key in CANARY_FIGURES if getattr(mark, key) is not None}

    @property
    def serving(self) -> bool:
        return self.alive and self.health == 200


def _fail(source: str, what: str) -> RemoteOutputError:
    return RemoteOutputError(f"{source}: status {what}")


def parse_document(exit_code: int, stdout: str, stderr: str, source: str) -> StatusDocument:
    lines = stdout.strip().splitlines()
    if exit_code != 0 or len(lines) != 1:
        detail = (stderr.strip().splitlines() or [stdout.strip() or "(no output)"])[-1][:300]
        raise _fail(source, f"did not print its one JSON document (exit {exit_code}): {detail!r}")
    try:
        raw = parse_json(lines[0])
        if isinstance(raw, dict) and "schema" in raw:
            raw["schema_"] = raw.pop("schema")
        document = StatusDocument.model_validate_json(json.dumps(raw), strict=True)
    except (ValueError, ValidationError) as exc:
        first = " ".join(str(exc).splitlines()[:3])[:400]
        raise _fail(source, f"printed a document of an unexpected shape: {first}") from None
    if document.schema_ != 1:
        raise _fail(source, f"document has schema {document.schema_}, expected 1")
    if document.alive and (document.pid is None or document.health is None):
        raise _fail(source, "document says a server is alive but names no PID or no /health answer")
    if document.alive and len(document.reads) != 2:
        raise _fail(source, f"document has {len(document.reads)} reads of a running server, expected 2")
    return document


# -- Prometheus text (exposition format 0.0.4) -----------------------------------------------------

_SAMPLE = re.compile(r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>(?:[^"}]|"(?:[^"\\]|\\.)*")*)\})?'
                     r"[ \t]+(?P<value>\S+)"
                     r"(?:[ \t]+(?P<ts>-?[0-9]+))?")
_LABEL = re.compile(r'\s*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _labels(text: str, line: str, source: str) -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    pos = 0
    while pos < len(text.rstrip()):
        match = _LABEL.match(text, pos)
        if match is None:
            raise _fail(source, f"metrics: malformed labels in {line[:200]!r}")
        value = re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m[1], m[1]), match["value"])
        if match["key"] in found:
            raise _fail(source, f"metrics: label {match['key']!r} twice in {line[:200]!r}")
        found[match["key"]] = value
        pos = match.end()
    return tuple(sorted(found.items()))


def parse_metric_lines(lines: list[str], source: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample lines -> metric name -> label set -> value. Strict: a line that is not a sample, a
    value that is not a finite number, or one series twice is an error naming the host."""
    series: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for line in lines:
        match = _SAMPLE.fullmatch(line.strip())
        if match is None:
            raise _fail(source, f"metrics: not a Prometheus sample line: {line[:200]!r}")
        value_text = match["value"]
        if not _FLOAT.fullmatch(value_text):
            raise _fail(source, f"metrics: {match['name']} has value {value_text[:40]!r}, expected a finite number")
        value = float(value_text)
        if not math.isfinite(value) or value < 0:
            raise _fail(source, f"metrics: {match['name']} is {value_text[:40]!r}, expected a finite number >= 0")
        labels = _labels(match["labels"] or "", line, source)
        named = series.setdefault(match["name"], {})
        if labels in named:
            raise _fail(source, f"metrics: the series {match['name']}{dict(labels)} appears twice")
        named[labels] = value
    return series


def _sum(series: dict, name: str) -> float | None:
    values = series.get(name)
    return sum(values.values()) if values else None


# -- the figures -----------------------------------------------------------------------------------


def _json_body(answer: HttpAnswer, what: str, source: str) -> dict | None:
    if answer.status != 200:
        return None
    if answer.truncated:
        raise _fail(source, f"{what} answered more than the status read's limit; not read")
    try:
        body = parse_json(answer.body)
    except ValueError:
        raise _fail(source, f"{what} answered 200 with a body that is not JSON: {answer.body[:200]!r}") from None
    if not isinstance(body, dict):
        raise _fail(source, f"{what} answered 200 with {type(body).__name__}, expected a JSON object")
    return body


def _number(value: Any, what: str, source: str, *, integer: bool = False) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value < 0:
        raise _fail(source, f"{what} is {str(value)[:40]!r}, expected a {'whole ' if integer else ''}number >= 0")
    return value


def _internal_state(info: dict | None, source: str) -> dict:
    if info is None:
        return {}
    states = info.get("internal_states")
    if states is None:
        return {}
    if not isinstance(states, list) or not states or not isinstance(states[0], dict):
        raise _fail(source, f"/server_info internal_states is {str(states)[:100]!r}, expected a list of objects")
    return states[0]


def _loads(read: Read, source: str) -> tuple[int | None, int | None]:
    body = _json_body(read.loads, "/v1/loads", source)
    if body is None:
        return None, None
    loads = body.get("loads")
    if not isinstance(loads, list) or not all(isinstance(x, dict) for x in loads):
        raise _fail(source, f"/v1/loads has loads {str(loads)[:100]!r}, expected a list of objects")
    running = sum(int(_number(x.get("num_running_reqs", 0), "/v1/loads num_running_reqs", source, integer=True) or 0)
                  for x in loads)
    waiting = sum(int(_number(x.get("num_waiting_reqs", 0), "/v1/loads num_waiting_reqs", source, integer=True) or 0)
                  for x in loads)
    return running, waiting


def _probe(document: StatusDocument, source: str) -> tuple[dict | None, float | None, float | None]:
    """(summary, accept length, output tok/s) of the probe requests; every one must have answered."""
    probe = document.probe
    if probe is None:
        return None, None, None
    tokens = verify = 0
    latency = 0.0
    server_timed = True
    for i, request in enumerate(probe.requests):
        if request is None or request.error is not None or request.meta is None:
            why = "no answer within its timeout" if request is None else request.error or "no meta_info"
            raise _fail(source, f"--probe request {i + 1} of {len(probe.requests)} failed: {why[:200]}")
        meta = request.meta
        completion = _number(meta.get("completion_tokens"), "probe completion_tokens", source, integer=True)
        steps = _number(meta.get("spec_verify_ct"), "probe spec_verify_ct", source, integer=True)
        if completion is None or not steps:
            raise _fail(source, f"--probe: meta_info lacks completion_tokens/spec_verify_ct (is speculative "
                                f"decoding on?): {str(meta)[:200]!r}")
        tokens += int(completion)
        verify += int(steps)
        e2e = _number(meta.get("e2e_latency"), "probe e2e_latency", source)
        if e2e is None or e2e <= 0:
            server_timed = False
        else:
            latency += e2e
    if not probe.requests:
        return None, None, None
    # concurrent requests overlap: their summed latencies over the concurrency is the batch's time
    duration = latency / probe.concurrency if server_timed else probe.wall_s
    tok_s = tokens / duration if duration > 0 else None
    summary = {"requests": len(probe.requests), "concurrency": probe.concurrency,
               "max_new_tokens": probe.max_new_tokens, "completion_tokens": tokens, "spec_verify_ct": verify,
               "timed_by": "server e2e_latency" if server_timed else "wall clock on the host"}
    return summary, tokens / verify, tok_s


def _live(document: StatusDocument, source: str, notes: list[str]) -> tuple[Live, dict | None, dict]:
    first, second = document.reads
    window = max(0.0, second.t - first.t)
    info = _json_body(second.server_info, "/server_info", source)
    info_first = _json_body(first.server_info, "/server_info", source)
    state, state_first = _internal_state(info, source), _internal_state(info_first, source)
    server_accept = _number(state.get("avg_spec_accept_length"), "/server_info avg_spec_accept_length", source)
    server_gen = _number(state.get("last_gen_throughput"), "/server_info last_gen_throughput", source)
    running, queued = _loads(second, source)
    accept = tok_s = None
    accept_source = throughput_source = "not measured"
    traffic = False
    source_kind = "none"
    metrics_on = first.metrics is not None and first.metrics.status == 200 and \
        second.metrics is not None and second.metrics.status == 200
    if metrics_on:
        assert first.metrics is not None and second.metrics is not None
        if first.metrics.truncated or second.metrics.truncated:
            raise _fail(source, "/metrics answered more than the status read's limit; not read")
        before = parse_metric_lines(first.metrics.lines, source)
        after = parse_metric_lines(second.metrics.lines, source)
        source_kind = "metrics"
        gauges = [v for v in (after.get("sglang:spec_accept_length") or {}).values() if v >= UNSET_ACCEPT]
        if gauges:
            accept = sum(gauges) / len(gauges)
            accept_source = "sglang:spec_accept_length (the last decode log interval)"
        elif after.get("sglang:spec_accept_length") is not None:
            accept_source = "not measured (sglang:spec_accept_length unset: no decode since start)"
        else:
            accept_source = "not measured (/metrics has no sglang:spec_accept_length: speculation off?)"
        generated = (_sum(after, "sglang:generation_tokens_total"), _sum(before, "sglang:generation_tokens_total"))
        if generated[0] is not None and generated[1] is not None:
            if generated[0] < generated[1]:
                notes.append("sglang:generation_tokens_total went backwards between the reads (restarted?)")
            elif window > 0:
                traffic = generated[0] > generated[1]
                tok_s = (generated[0] - generated[1]) / window
                throughput_source = f"sglang:generation_tokens_total over {window:.1f} s"
        gen = _sum(after, "sglang:gen_throughput")
        server_gen = gen if gen is not None else server_gen
        running_m, queued_m = _sum(after, "sglang:num_running_reqs"), _sum(after, "sglang:num_queue_reqs")
        running = int(running_m) if running_m is not None else running
        queued = int(queued_m) if queued_m is not None else queued
    elif info is not None:
        source_kind = "server_info"
        status = first.metrics.status if first.metrics is not None else None
        notes.append(f"/metrics answered {status or first.metrics.error if first.metrics else 'nothing'}: "
                     "the server runs without --enable-metrics (deployctl up adds it); "
                     "accept length is the average since start")
        if server_accept is not None:
            accept = server_accept
            accept_source = "/server_info avg_spec_accept_length (average since start)"
        before_accept = _number(state_first.get("avg_spec_accept_length"), "/server_info avg_spec_accept_length",
                                source)
        before_gen = _number(state_first.get("last_gen_throughput"), "/server_info last_gen_throughput", source)
        traffic = (before_accept, before_gen) != (server_accept, server_gen) or bool(running)
    else:
        notes.append("neither /metrics nor /server_info answered 200: no live figures")
    summary, probe_accept, probe_tok_s = _probe(document, source)
    comparable = False
    if summary is not None:
        accept, accept_source = probe_accept, f"--probe: {summary['requests']} greedy requests"
        tok_s, throughput_source, comparable = probe_tok_s, (
            f"--probe: {summary['requests']} requests at concurrency {summary['concurrency']}, "
            f"timed by {summary['timed_by']}"), True
        traffic = True
    elif document.probe_skipped:
        notes.append("--probe not sent: the server had traffic in the window (a probe would compete with it)")
    elif not traffic and source_kind != "none":
        notes.append("no tokens were generated in the window: throughput not measured (--probe sends requests)")
        tok_s = None if tok_s == 0 else tok_s
        if tok_s is None:
            throughput_source = "not measured (no traffic)"
    live = Live(accept_length=accept, accept_source=accept_source, output_tok_s=tok_s,
                throughput_source=throughput_source, throughput_comparable=comparable,
                server_gen_tok_s=server_gen, running=running, queued=queued, traffic=traffic,
                window_s=round(window, 3) if document.reads else None, source=source_kind)
    return live, summary, info or {}


def _record(value: dict | None, what: str, notes: list[str], model: type[R]) -> R | None:
    """The record as its model; one that is not says so in a note (status reads, it never fails on a record)."""
    if value is None:
        return None
    if "unreadable" in value:
        notes.append(f"{what} is not JSON: {str(value['unreadable'])[:80]!r}")
        return None
    if not isinstance(value.get("argv"), list):
        notes.append(f"{what} is not a deployment record (no argv)")
        return None
    try:
        return validated(model, value)
    except RecordShapeError as exc:
        notes.append(f"{what} is not a deployment record ({str(exc)[:120]})")
        return None


def _figure(value: Any) -> float | None:
    """A recorded figure, or None when it is not a finite positive number (never compared then)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return float(value)


def _baseline(good: LastGood | None, deployment: DeploymentRecord | None) -> Baseline | None:
    from deploy.facts.server import same_deployment

    if good is None:
        return None
    metrics = good.metrics or Metrics()
    return Baseline(
        run=good.run, drafter_fingerprint=good.drafter_fingerprint, drafter_path=good.drafter_path,
        verified_at=good.verified_at, draft_tokens=metrics.draft_tokens,
        accept_length=_figure(metrics.accept_length), output_tok_s=_figure(metrics.output_tok_s),
        bench_settings=metrics.bench_settings, same_deployment=same_deployment(good, deployment))


def _argv_value(argv: list, flag: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == flag and isinstance(argv[i + 1], str):
            return argv[i + 1]
    return None


def parse_status(exit_code: int, stdout: str, stderr: str, source: str) -> HostStatus:
    """The whole answer of ``status_command``: the server, its figures and its last good numbers."""
    document = parse_document(exit_code, stdout, stderr, source)
    notes: list[str] = []
    deployment = _record(document.record, "deployment.json", notes, DeploymentRecord)
    good = _record(document.last_good, "last-good.json", notes, LastGood)
    if document.alive:
        live, probe, info = _live(document, source, notes)
    else:
        why = "no PID file" if not document.pidfile else \
            f"the PID file holds {document.pidfile!r}" if document.pid is None else f"PID {document.pid} is not running"
        notes.append(f"no SGLang server of deployctl's is running ({why})")
        live, probe, info = Live(accept_length=None, accept_source="not measured", output_tok_s=None,
                                 throughput_source="not measured", throughput_comparable=False,
                                 server_gen_tok_s=None, running=None, queued=None, traffic=False,
                                 window_s=None, source="none"), None, {}
    argv = deployment.argv if deployment else None
    tokens = info.get("speculative_num_draft_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        text = _argv_value(argv, "--speculative-num-draft-tokens") if argv else None
        tokens = int(text) if text is not None and text.isdigit() else None
    health = document.health
    return HostStatus(
        pid=document.pid, alive=document.alive, health=health.status if health else None,
        health_error=health.error if health else None, uptime_s=document.uptime_s, deployment=deployment,
        drafter_fingerprint=deployment.drafter_fingerprint if deployment else None,
        drafter_path=deployment.drafter_path if deployment else None, draft_tokens=tokens,
        sglang_version=deployment.sglang_version if deployment else None,
        live=live, last_good=_baseline(good, deployment), probe=probe, notes=notes,
        canary=_canary(document, notes))


#: the window's figures a canary mark may carry (status shows the finite, non-negative ones)
CANARY_FIGURES = ("acceptance_ratio", "speed_ratio", "intervals", "canary_requests")


def _canary(document: StatusDocument, notes: list[str]) -> CanaryMark | None:
    """The canary mark (records.CanaryMark), when it names the running server and its window has not passed
    (a mark left by a deployctl killed mid-window names a server that is gone, or a time that passed)."""
    if document.canary is None:
        return None
    try:
        mark = validated(CanaryMark, document.canary)
    except RecordShapeError as exc:
        notes.append(f"canary.json is not a canary mark of this deployctl's ({str(exc)[:200]}): ignored")
        return None
    if mark.pid != document.pid or not document.alive or (document.now is not None and document.now > mark.until):
        return None
    unusable = [key for key in CANARY_FIGURES if (value := getattr(mark, key)) is not None
                and not (math.isfinite(value) and value >= 0)]
    return mark.but(run=mark.run[:200], others=mark.others[:64]).without(*unusable)
