"""deployctl status: what each host's server measures now, next to its last good deployment.

Read-only and lock-free: per host one SSH connection and ONE remote command
(``deploy/facts/status.py``: deploy/remote/server_status.py, sent inline), in parallel over the hosts.
Nothing on the host is written or restarted; ``--probe`` only sends a few greedy requests.

A drafter that deployed fine can lose acceptance while the server keeps running (sglang#32176:
4.49 -> 1.59 after HiCache loadback; #28771: 3.4 -> 1.9 over two hours). Nothing restarts, so no
deploy-time check sees it: ``evaluate`` compares the live figures with the last good record's
using the nightly regression gate's fractions, and ``status --check`` exits 12 below them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.config.models import Config, Host, Run
from deploy.base.errors import DeployError, ExitCode
from deploy.facts.status import HostStatus, parse_status, status_command
from deploy.engine.fanout import HostOutcome, for_each_host
from deploy.ssh.transport import HostConnection, JumpConnections

#: the SSH command's own bound beyond the window and the probe (connect, python start, 6 GETs)
COMMAND_SLACK_S = 60.0
PROBE_REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Gate:
    """The nightly regression gate's fractions (playbooks/nightly.yaml, regression-gate)."""

    min_accept_fraction: float = 0.9
    min_throughput_fraction: float = 0.9


@dataclass
class Verdict:
    #: healthy | regression | not-serving | unknown | unreachable | error
    state: str
    lines: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"healthy": 0, "unknown": 0, "regression": int(ExitCode.REGRESSION),
                "not-serving": int(ExitCode.FAILED)}.get(self.state, int(ExitCode.FAILED))


@dataclass
class HostReading:
    host: Host
    status: HostStatus | None = None
    error: DeployError | None = None
    #: the recorded deployment is what this run launches (argv with its store drafter, env)
    configured: bool | None = None
    differences: list[str] = field(default_factory=list)
    verdict: Verdict = field(default_factory=lambda: Verdict("unknown"))
    #: where the run's router reaches this replica (fleet.router.worker_url), when the run has a router
    worker_url: str | None = None

    @property
    def exit_code(self) -> int:
        return int(self.error.exit_code) if self.error is not None else self.verdict.exit_code


@dataclass
class RouterReading:
    """The run's router, judged next to its replicas (issue 44: status looked only at the replicas, so
    `status --check` said "healthy" while the fleet's front door was gone).

    ``state``: healthy | down (no router process deployctl started) | not-answering (its worker list
    did not answer 200) | missing (a replica that serves is not listed healthy) | unreachable | error."""

    host: str
    url: str | None = None
    pid: int | None = None
    state: str = "healthy"
    workers: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    error_code: int | None = None

    @property
    def exit_code(self) -> int:
        if self.error_code is not None:
            return self.error_code
        return 0 if self.state == "healthy" else int(ExitCode.FAILED)


def judge_router(row: dict[str, Any], readings: Sequence[HostReading]) -> RouterReading:
    """What ``read_router``'s row says of the fleet's front door (pure): every replica whose server
    serves (alive, /health 200) must be listed healthy by a live, answering router."""
    reading = RouterReading(host=str(row.get("host")), url=row.get("url"), pid=row.get("pid"),
                            workers=list(row.get("workers") or []))
    if "error" in row:
        code = int(row.get("exit_code") or ExitCode.FAILED)
        reading.state = "unreachable" if code == ExitCode.CONNECTION else "error"
        reading.error_code = code
        reading.lines.append(str(row["error"]))
        return reading
    if not row.get("alive"):
        reading.state = "down"
        reading.lines.append(str(row.get("note") or f"no router deployctl started is running on {reading.host}"))
        return reading
    if not row.get("answering"):
        reading.state = "not-answering"
        reading.lines.append(f"the router (pid {reading.pid}) did not answer its worker list")
        return reading
    healthy = {w["url"] for w in reading.workers if w.get("healthy")}
    reading.missing = [r.host.name for r in readings
                       if r.status is not None and r.status.serving and r.worker_url not in healthy]
    if reading.missing:
        reading.state = "missing"
        reading.lines.append("serving but not in the router's rotation: " + ", ".join(reading.missing))
    else:
        reading.lines.append(f"{len(healthy)} healthy worker(s) listed")
    return reading


def read_router_of(config: Config, run: Run, readings: Sequence[HostReading]) -> RouterReading | None:
    """The run's router read and judged (None: the run has no router)."""
    if run.router is None:
        return None
    from deploy.verbs.inspect import read_router

    with JumpConnections() as jumps:
        return judge_router(read_router(config, run, jumps), readings)


def gate_of(playbook_name: str = "nightly", **overrides: float | None) -> Gate:
    """The regression gate's settings of ``playbook_name`` (flags given override them)."""
    from deploy.engine.playbook import load_playbook

    playbook = load_playbook(playbook_name)
    step = next((s for s in playbook.steps if s.name == "regression-gate"), None)
    found = {} if step is None else {k: getattr(step.settings, k) for k in ("min_accept_fraction",
                                                                             "min_throughput_fraction")}
    found.update({k: v for k, v in overrides.items() if v is not None})
    return Gate(**found)


def configured(run: Run, host: Host, status: HostStatus) -> tuple[bool | None, list[str]]:
    """(runs what this run would launch?, what differs): the recorded deployment against the run's
    desired deployment (deploy/host/deployment.py, what launch and converge compute), with the
    drafter's store path and the doctor's draft-quantization decision as the launch recorded them.
    Read-only and quick: the drafter checkpoint is not fingerprinted again and the doctor not re-run
    (``deployctl plan``/``up`` converge on both). A node group is read at rank 0: its argv carries
    rank 0's ``--nnodes --node-rank --dist-init-addr``."""
    from deploy.host.deployment import desired_deployment, recorded_draft_quantization

    record = status.deployment
    if record is None:
        return None, ["no deployment recorded on the host"]
    wanted = run
    if run.nodes:
        from deploy.fleet.nodes import dist_init_addr, node_run

        wanted = node_run(run, 0, len(run.nodes), dist_init_addr(run, host))
    drafter = record.drafter_path
    desired = desired_deployment(wanted, host, run.draft_tokens, drafter_path=drafter,
                                 draft_quantization=recorded_draft_quantization(record, run))
    draft_tokens = status.draft_tokens or run.draft_tokens
    differences = []
    if record.run != run.name:
        differences.append(f"deployed by run {str(record.run)[:60]!r}")
    if desired.differences(record, ("argv",)):
        differences.append("argv" if draft_tokens == run.draft_tokens else
                           f"draft tokens {draft_tokens} (configured {run.draft_tokens})")
    if desired.differences(record, ("env_hash",)):
        differences.append("environment")
    return not differences, differences


def evaluate(run: Run, status: HostStatus, gate: Gate) -> Verdict:
    """Live vs last good, with the gate's fractions; pure."""
    if not status.alive:
        return Verdict("not-serving", ["no SGLang server of deployctl's is running"])
    if status.health != 200:
        return Verdict("not-serving", [f"/health answers {status.health or status.health_error}"])
    good = status.last_good
    if good is None:
        return Verdict("unknown", ["no last good deployment is recorded on this host: nothing to compare with"])
    if good.run is not None and good.run != run.name:
        return Verdict("unknown", [f"the last good record is of run {good.run!r}, not {run.name!r}: not compared"])
    if good.draft_tokens is not None and status.draft_tokens is not None and good.draft_tokens != status.draft_tokens:
        return Verdict("unknown", [f"the last good record was measured at {good.draft_tokens} draft tokens, the server "
                                   f"runs {status.draft_tokens}: not compared"])
    live = status.live
    verdict = Verdict("healthy")
    if not good.same_deployment:
        verdict.lines.append("the running deployment is not the recorded last good one (not verified yet?): "
                             "compared with it anyway")
    compared = 0
    for label, now, then, fraction, why_not in (
            ("accept length", live.accept_length, good.accept_length, gate.min_accept_fraction,
             live.accept_source),
            ("output tok/s", live.output_tok_s if live.throughput_comparable else None, good.output_tok_s,
             gate.min_throughput_fraction,
             live.throughput_source if live.output_tok_s is None else
             "live traffic, not the benchmark's load; --probe measures at it")):
        if now is None or then is None or then <= 0:
            reason = why_not if now is None else "no last good figure"
            verdict.lines.append(f"{label}: not compared ({reason})")
            continue
        compared += 1
        ratio = now / then
        line = f"{label} {now:.2f} vs last good {then:.2f} ({ratio:.0%}, minimum {fraction:.0%})"
        verdict.lines.append(line)
        if ratio < fraction:
            verdict.regressions.append(line)
    if verdict.regressions:
        verdict.state = "regression"
    elif not compared:
        verdict.state = "unknown"
    return verdict


def _base_url(run: Run, host: Host) -> str:
    from deploy.host.sglang_argv import probe_address

    address = probe_address(run, host)
    return f"http://{'[' + address + ']' if ':' in address else address}:{run.port}"


def read_host(conn, host: Host, run: Run, *, window_s: float, probe: int) -> HostStatus:
    """One remote command on an open connection: the host's status, parsed strictly."""
    timeout = COMMAND_SLACK_S + window_s + (PROBE_REQUEST_TIMEOUT_S * 4 if probe else 0)
    command = status_command(host.python, host.state_dir, _base_url(run, host), window_s=window_s, probe=probe)
    result = conn.run(command, timeout=timeout)
    return parse_status(result.exit_code, result.stdout, result.stderr, host.name)


def gather(config: Config, run: Run, hosts: Sequence[Host], gate: Gate, *, window_s: float = 2.0,
           probe: int = 0) -> list[HostReading]:
    """Every host's status, in parallel, each evaluated against its last good deployment.

    A multi-node run (``nodes``) is one server: only rank 0 serves HTTP and measures, so only rank
    0 is read (the other ranks are not checked here)."""
    from deploy.engine.session import network_host

    if run.nodes:
        hosts = [h for h in hosts if h.name == run.nodes[0]]

    def work(host: Host) -> HostReading:
        with HostConnection(host, config.ssh, jumps) as conn:
            here = network_host(host, conn.endpoint.hostname.value)
            status = read_host(conn, here, run, window_s=window_s, probe=probe)
        reading = HostReading(host, status)
        if run.router is not None:
            from deploy.fleet.router import worker_url

            reading.worker_url = worker_url(run, here)
        reading.configured, reading.differences = configured(run, here, status)
        reading.verdict = evaluate(run, status, gate)
        return reading

    with JumpConnections() as jumps:
        outcomes: list[HostOutcome[HostReading]] = for_each_host(hosts, work, config.ssh.max_parallel)
    readings = []
    for outcome in outcomes:
        if outcome.value is not None:
            readings.append(outcome.value)
        else:
            state = "unreachable" if outcome.error is not None and \
                outcome.error.exit_code == ExitCode.CONNECTION else "error"
            readings.append(HostReading(outcome.host, error=outcome.error, verdict=Verdict(state)))
    return readings


@dataclass(frozen=True)
class StatusReader:
    """``deployctl status`` resolved: the run, its gate, and ``read()``, one round of every host's
    reading and the router's (the ``--prom-file`` written after each round)."""

    run: Run
    gate: Gate
    read: Callable[[], tuple[list[HostReading], RouterReading | None]]


def status_reader(config: Config, run_name: str | None, host_names: Sequence[str], *, playbook_name: str,
                  min_accept_fraction: float | None, min_throughput_fraction: float | None, window_s: float,
                  probe: bool, prom_file: Path | None) -> StatusReader:
    """Resolve the run, its hosts and gate (every refusal here, nothing read yet) and the reader."""
    from deploy.verbs.selection import run_and_hosts

    run, hosts = run_and_hosts(config, run_name, tuple(host_names))
    gate = gate_of(playbook_name, min_accept_fraction=min_accept_fraction,
                   min_throughput_fraction=min_throughput_fraction)

    def read() -> tuple[list[HostReading], RouterReading | None]:
        readings = gather(config, run, hosts, gate, window_s=window_s, probe=4 if probe else 0)
        router = read_router_of(config, run, readings)
        if prom_file is not None:
            try:
                write_prom_file(prom_file, prom_text(run, readings, router=router))
            except OSError as exc:
                raise DeployError(f"--prom-file {prom_file}: cannot write: {exc.strerror or exc}",
                                  exit_code=ExitCode.IO) from None
        return readings, router

    return StatusReader(run, gate, read)


def exit_code(readings: Sequence[HostReading], check: bool, router: RouterReading | None = None) -> int:
    """Without --check: 0 unless a host (or the router host) could not be read (its code). With it,
    the first host's non-zero code in config order: 12 regression, 1 not serving, 4 unreachable, 5
    unexpected output; then the router's: 1 when it is down, not answering or missing a serving replica."""
    for reading in readings:
        code = reading.exit_code if check else (int(reading.error.exit_code) if reading.error else 0)
        if code:
            return code
    if router is not None:
        return router.exit_code if check else (router.error_code or 0)
    return 0


def watch(rounds: int | None, interval_s: float, read: Callable[[], Any],
          show: Callable[[Any], None], sleep: Callable[[float], None] = time.sleep) -> int:
    """Read and show every ``interval_s`` until Ctrl-C (KeyboardInterrupt, raised to the caller) or
    ``rounds`` rounds; returns the rounds done."""
    done = 0
    while rounds is None or done < rounds:
        started = time.monotonic()
        show(read())
        done += 1
        if rounds is not None and done >= rounds:
            break
        sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return done


# -- JSON and Prometheus ---------------------------------------------------------------------------


def router_document(router: RouterReading) -> dict[str, Any]:
    return {"host": router.host, "url": router.url, "pid": router.pid, "verdict": router.state,
            "exit_code": router.exit_code, "workers": router.workers, "missing": router.missing,
            "detail": router.lines}


def document(run: Run, readings: Sequence[HostReading], gate: Gate,
             router: RouterReading | None = None) -> dict[str, Any]:
    hosts = []
    for r in readings:
        entry: dict[str, Any] = {"host": r.host.name, "verdict": r.verdict.state, "exit_code": r.exit_code,
                                 "comparisons": r.verdict.lines, "regressions": r.verdict.regressions}
        if r.error is not None:
            entry["error"] = str(r.error)
        if r.status is not None:
            entry |= r.status.model_dump(mode="json", exclude={"deployment"})
            entry["configured"] = r.configured
            entry["differences"] = r.differences
        hosts.append(entry)
    doc = {"run": run.name, "gate": {"min_accept_fraction": gate.min_accept_fraction,
                                     "min_throughput_fraction": gate.min_throughput_fraction},
           "hosts": hosts}
    if router is not None:
        doc["router"] = router_document(router)
    return doc


def prom_label(value: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped (exposition format)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


#: metric -> help; every one is a gauge labelled {host, run}
PROM_METRICS = {
    "deployctl_status_reachable": "1 when the host answered the status command.",
    "deployctl_status_serving": "1 when deployctl's SGLang server runs and /health answers 200.",
    "deployctl_status_regression": "1 when a live figure is under the regression gate's fraction of the last good one.",
    "deployctl_status_configured": "1 when the host runs the deployment the config describes.",
    "deployctl_status_accept_length": "Live speculative accept length.",
    "deployctl_status_last_good_accept_length": "Accept length the last good deployment was verified with.",
    "deployctl_status_output_tokens_per_second": "Live output tokens per second.",
    "deployctl_status_last_good_output_tokens_per_second": "Output tokens per second of the last good benchmark.",
    "deployctl_status_running_requests": "Requests the server is running.",
    "deployctl_status_queued_requests": "Requests waiting in the server's queue.",
    "deployctl_status_uptime_seconds": "Seconds since the server process started.",
    "deployctl_status_canary": "1 while the replica is a canary in its live window (restart/nightly --canary).",
    "deployctl_status_canary_acceptance_ratio": "A canary's live accept length over the other replicas' (its window so far).",
    "deployctl_status_canary_speed_ratio": "A canary's live output speed over the other replicas' (its window so far).",
    "deployctl_status_timestamp_seconds": "When deployctl read these figures (Unix time).",
}


def _prom_values(r: HostReading, now: float) -> dict[str, float | None]:
    s = r.status
    values: dict[str, float | None] = {"deployctl_status_reachable": float(s is not None),
                                       "deployctl_status_timestamp_seconds": now}
    if s is not None:
        good = s.last_good
        values |= {
            "deployctl_status_serving": float(s.serving),
            "deployctl_status_regression": float(r.verdict.state == "regression"),
            "deployctl_status_configured": None if r.configured is None else float(r.configured),
            "deployctl_status_accept_length": s.live.accept_length,
            "deployctl_status_last_good_accept_length": good.accept_length if good else None,
            "deployctl_status_output_tokens_per_second": s.live.output_tok_s,
            "deployctl_status_last_good_output_tokens_per_second": good.output_tok_s if good else None,
            "deployctl_status_running_requests": None if s.live.running is None else float(s.live.running),
            "deployctl_status_queued_requests": None if s.live.queued is None else float(s.live.queued),
            "deployctl_status_uptime_seconds": s.uptime_s,
            "deployctl_status_canary": float(s.canary is not None),
            "deployctl_status_canary_acceptance_ratio": s.canary.acceptance_ratio if s.canary else None,
            "deployctl_status_canary_speed_ratio": s.canary.speed_ratio if s.canary else None,
        }
    return values


def prom_value(value: float) -> str:
    """A sample value at full precision: the shortest text that reads back as the same float (``{:.6g}``
    turned the Unix timestamp 1764636000 into 1.76464e+09, 4000 s off, and the staleness alert
    docs/status.md recommends fired or stayed silent wrongly); integers as integers."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(float(value))


#: the run's router: one gauge each, labelled {host (the router host), run}
PROM_ROUTER_METRICS = {
    "deployctl_status_router_up": "1 when the run's router runs, answers and lists every serving replica.",
    "deployctl_status_router_healthy_workers": "Workers the run's router lists as healthy.",
}


def prom_text(run: Run, readings: Sequence[HostReading], now: float | None = None,
              router: RouterReading | None = None) -> str:
    """The figures in Prometheus text format (node_exporter's textfile collector); unknown = absent."""
    now = time.time() if now is None else now
    per_host = [(r.host.name, _prom_values(r, now)) for r in readings]
    if router is not None and router.error_code is None:
        per_host.append((router.host, {
            "deployctl_status_router_up": float(router.state == "healthy"),
            "deployctl_status_router_healthy_workers": float(sum(1 for w in router.workers if w.get("healthy")))}))
    lines = []
    for metric, help_text in (PROM_METRICS | PROM_ROUTER_METRICS).items():
        samples = [(name, value) for name, v in per_host if (value := v.get(metric)) is not None]
        if not samples:
            continue
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for name, value in samples:
            lines.append(f'{metric}{{host="{prom_label(name)}",run="{prom_label(run.name)}"}} {prom_value(value)}')
    return "\n".join(lines) + "\n"


def write_prom_file(path: Path, text: str) -> None:
    """Atomically, through local_state.replace_file: a temporary file in the same directory (a name
    the collector ignores: it reads only ``*.prom``), fsync, rename over ``path`` when it is a
    regular file with one name or absent. A scrape sees the old file or the new one; a link, hard
    link, device, FIFO, directory or socket at ``path`` is refused (exit 10), never written through."""
    from deploy.local.state import replace_file

    replace_file(path, text.encode("utf-8"), "the --prom-file", mode=0o644)
