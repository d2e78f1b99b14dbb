"""The canary's reads: every replica's own figures at the same instants, parsed strictly, and the
paired intervals deploy/local/canary_gate.py judges.

One line of ``fleet_ops.py poll SECONDS metrics URL...`` (deploy/remote/fleet_ops.py, run on the
router host: where the router reaches the workers from) holds every worker's read at one instant.
What each figure is (SGLang 0.5.23, srt/metrics/collector.py; the same names deploy/facts/status.py reads):

- ``sglang:spec_accept_length``: a gauge set at every decode log line (every 40 decode steps) to
  that stretch's accept length: the interval's figure is its value at the interval's end, taken
  only when the replica finished requests in the interval (an idle replica keeps an old value);
- ``sglang:num_requests_total``: finished requests, a counter: the interval's requests are its growth;
- ``sglang:inter_token_latency_seconds`` (older: ``time_per_output_token_seconds``): a histogram;
  the interval's mean per-token latency is the growth of its ``_sum`` over the growth of its ``_count``;
- a worker without ``--enable-metrics`` answers /metrics 404: its ``/server_info``
  ``internal_states[0].avg_spec_accept_length`` is the average since start, with no request
  count, so such a replica's intervals are not paired (deployctl's launch adds --enable-metrics).

A counter that went down (the server restarted) makes that interval unpaired, never negative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from deploy.base.errors import RemoteOutputError
from deploy.facts.status import parse_metric_lines
from deploy.local.canary_gate import Interval, Side

ACCEPT = "sglang:spec_accept_length"
REQUESTS = "sglang:num_requests_total"
TOKENS = "sglang:generation_tokens_total"
LATENCY = (("sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count"),
           ("sglang:time_per_output_token_seconds_sum", "sglang:time_per_output_token_seconds_count"))


@dataclass(frozen=True)
class Reading:
    """One replica at one instant (None: not reported)."""

    accept: float | None
    requests: float | None
    tokens: float | None
    latency_sum: float | None
    latency_count: float | None
    #: "metrics" | "server_info" | the reason nothing was read
    source: str


@dataclass(frozen=True)
class Instant:
    at: float
    readings: dict[str, Reading]


def _fail(source: str, what: str) -> RemoteOutputError:
    return RemoteOutputError(f"{source}: canary read: {what}")


def _total(series: dict, name: str) -> float | None:
    found = series.get(name)
    return None if not found else float(sum(found.values()))


def _reading(url: str, entry: Any, source: str) -> Reading:
    if not isinstance(entry, dict) or not isinstance(entry.get("status"), (int, type(None))):
        raise _fail(source, f"{url}: unexpected read {str(entry)[:200]!r}")
    if entry["status"] == 200:
        lines = entry.get("lines")
        if not isinstance(lines, list) or not all(isinstance(ln, str) for ln in lines):
            raise _fail(source, f"{url}: /metrics lines are not a list of strings")
        series = parse_metric_lines(lines, f"{source}: canary read: {url}")
        accept = _total(series, ACCEPT) if series.get(ACCEPT) and len(series[ACCEPT]) == 1 else None
        latency_sum = latency_count = None
        for total, count in LATENCY:
            if total in series and count in series:
                latency_sum, latency_count = _total(series, total), _total(series, count)
                break
        return Reading(accept if accept is not None and accept >= 1.0 else None, _total(series, REQUESTS),
                       _total(series, TOKENS), latency_sum, latency_count, "metrics")
    info = entry.get("server_info")
    if isinstance(info, dict) and info.get("status") == 200 and isinstance(info.get("body"), str):
        from deploy.base.limits import parse_json

        try:
            document = parse_json(info["body"])
        except ValueError as exc:
            raise _fail(source, f"{url}: /server_info is not JSON: {exc}") from None
        states = document.get("internal_states") if isinstance(document, dict) else None
        first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        value = first.get("avg_spec_accept_length")
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 1.0):
            raise _fail(source, f"{url}: avg_spec_accept_length is {value!r}, expected a number >= 1")
        return Reading(None if value is None else float(value), None, None, None, None, "server_info")
    why = entry.get("error") or f"/metrics answered {entry['status']}"
    return Reading(None, None, None, None, None, f"not read: {str(why)[:200]}")


def parse_instant(line: Any, urls: list[str], source: str) -> Instant:
    """One poll line: every URL asked must be there, with a read of the documented shape."""
    if not isinstance(line, dict) or not isinstance(line.get("reads"), dict):
        raise _fail(source, f"unexpected line {str(line)[:200]!r}")
    at = line.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise _fail(source, f"'at' is {at!r}, expected a time")
    missing = [u for u in urls if u not in line["reads"]]
    if missing:
        raise _fail(source, f"no read of {', '.join(missing)}")
    return Instant(float(at), {u: _reading(u, line["reads"][u], source) for u in urls})


def _growth(before: float | None, after: float | None) -> float | None:
    if before is None or after is None or after < before:
        return None  # not reported, or the counter went down: the server restarted
    return after - before


def side(before: Reading, after: Reading) -> Side:
    """One replica over one interval: its requests, its accept length at the end (only with traffic),
    its mean per-token latency."""
    requests = _growth(before.requests, after.requests) or 0.0
    accept = after.accept if requests > 0 else None
    token_s = None
    count = _growth(before.latency_count, after.latency_count)
    total = _growth(before.latency_sum, after.latency_sum)
    if count and total is not None and count > 0 and total > 0:
        token_s = total / count
    return Side(accept, requests if accept is not None else 0.0, token_s)


def combined(sides: list[Side]) -> Side:
    """The others as one side: figures weighted by the requests each finished in the interval."""
    counted = [s for s in sides if s.requests > 0 and s.accept is not None]
    total = sum(s.requests for s in counted)
    if not total:
        return Side(None, 0.0, None)
    accept = sum(s.accept * s.requests for s in counted if s.accept is not None) / total
    timed = [s for s in counted if s.token_s is not None]
    token_s = (sum(s.token_s * s.requests for s in timed if s.token_s is not None) / sum(s.requests for s in timed)
               if timed and len(timed) == len(counted) else None)
    return Side(accept, total, token_s)


def interval(start: float, before: Instant, after: Instant, canary: list[str], others: list[str]) -> Interval:
    """The paired interval between two instants: the canary's replicas against the others'."""
    return Interval(after.at - start, combined([side(before.readings[u], after.readings[u]) for u in canary]),
                    combined([side(before.readings[u], after.readings[u]) for u in others]))
