#!/usr/bin/env python3
"""What the running SGLang server measures now, read-only: ``deployctl status``'s host side.

Standalone, Python 3.8+ standard library only. deployctl sends it inline (``python3 -c``, bundled
with host_ops.py by deploy/facts/inline.py), so a status run needs no helper of a given version on
the host and writes nothing there. It prints one JSON document: the PID file's server (alive,
uptime), ``deployment.json`` and ``last-good.json``, ``/health``, and two reads of the server's
figures ``--window`` seconds apart (/metrics, /server_info, /v1/loads); with ``--probe``, when the
server generated nothing in the window, a few greedy /generate requests (the verify prompts). It
reports; deploy/facts/status.py parses strictly and decides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Dict, List

if __package__:  # imported locally, as deploy.remote.server_status
    from . import host_ops
else:  # sent inline: deploy/facts/inline.py registers host_ops beside it
    import host_ops  # type: ignore[no-redef]
#: the Prometheus series deployctl reads (SGLang 0.5.23 srt/metrics/collector.py; --enable-metrics)
STATUS_METRICS = ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:gen_throughput",
                  "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:generation_tokens_total",
                  "sglang:prompt_tokens_total", "sglang:num_requests_total")
#: bounds on what one status read takes from the server
STATUS_BODY_LIMIT = 512 * 1024
STATUS_MAX_LINES = 4000


def _status_get(url: str, timeout: float, limit: int = STATUS_BODY_LIMIT, auth=None) -> dict:
    """GET url: {"status", "error", "body", "truncated"}; at most ``limit`` bytes of the body are kept;
    ``auth``: the server's --api-key header (/server_info and /v1/loads answer 401 without it)."""
    result = {"status": None, "error": None, "body": "", "truncated": False}  # type: Dict[str, Any]
    try:
        result["status"], _, data = host_ops._http().fetch("GET", url, None, auth, timeout, limit + 1)
    except (OSError, ValueError) as exc:
        result["error"] = str(exc)[:200]
        return result
    if result["status"] >= 400:  # as urlopen's HTTPError was: the status, no body
        return result
    result["truncated"] = len(data) > limit
    result["body"] = data[:limit].decode("utf-8", "replace")
    return result


def _status_metrics(base: str, timeout: float) -> dict:
    """GET /metrics, keeping only the lines of STATUS_METRICS' series (a real /metrics is ~100 KB)."""
    answer = _status_get(base + "/metrics", timeout)
    text = answer.pop("body")
    lines = []
    for line in text.splitlines():
        name = re.split(r"[{\s]", line, 1)[0]
        if name in STATUS_METRICS:
            lines.append(line[:1000])
    answer["lines"] = lines[:STATUS_MAX_LINES]
    answer["total_lines"] = text.count("\n")
    return answer


def _status_read(base: str, timeout: float, metrics: bool, auth=None) -> dict:
    read = {"t": time.monotonic()}  # type: Dict[str, Any]
    read["metrics"] = _status_metrics(base, timeout) if metrics else None
    read["server_info"] = _status_get(base + "/server_info", timeout, auth=auth)
    if read["server_info"]["status"] == 404:  # SGLang before 0.4.7 has only the older name
        read["server_info"] = _status_get(base + "/get_server_info", timeout, auth=auth)
    read["loads"] = _status_get(base + "/v1/loads", timeout, 64 * 1024, auth)
    return read


def _status_uptime(pid: int):
    """Seconds since the process started (/proc/PID/stat starttime, in clock ticks since boot)."""
    try:
        raw = host_ops._read("/proc/%d/stat" % pid) or ""
        start_ticks = int(raw[raw.rfind(")") + 2:].split()[19])
        boot_s = float((host_ops._read("/proc/uptime") or "").split()[0])
        return round(max(0.0, boot_s - start_ticks / os.sysconf("SC_CLK_TCK")), 1)
    except (ValueError, IndexError, OSError):
        return None


def _status_probe(base: str, requests: int, concurrency: int, max_new_tokens: int, timeout: float,
                  auth=None) -> dict:
    """``requests`` greedy /generate calls of the verify prompts, ``concurrency`` at a time."""
    import threading

    results = [None] * requests  # type: List[Any]

    def one(i: int) -> None:
        payload = {"text": host_ops.PROMPTS[i % len(host_ops.PROMPTS)],
                   "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
        started = time.monotonic()
        try:
            reply = host_ops._post_json(base + "/generate", payload, timeout, auth)
        except (OSError, ValueError) as exc:
            results[i] = {"error": "POST /generate failed: %s" % (exc,)}
            return
        meta = reply.get("meta_info") if isinstance(reply, dict) else None
        keep = ("completion_tokens", "spec_verify_ct", "e2e_latency")
        results[i] = {"wall_s": round(time.monotonic() - started, 6),
                      "meta": dict((k, meta.get(k)) for k in keep) if isinstance(meta, dict) else None}

    started = time.monotonic()
    for first in range(0, requests, concurrency):
        threads = [threading.Thread(target=one, args=(i,), daemon=True)
                   for i in range(first, min(requests, first + concurrency))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout + 5)
    return {"concurrency": concurrency, "max_new_tokens": max_new_tokens,
            "wall_s": round(time.monotonic() - started, 6), "requests": results}


def _status_traffic(first: dict, second: dict, metrics: bool) -> bool:
    """Did the server generate between the reads? (--probe is only sent to an idle server: a probe
    competing with traffic would measure the traffic's load, not the benchmark's.)"""
    if metrics:
        def generated(read):
            return [ln for ln in read["metrics"]["lines"] if ln.startswith("sglang:generation_tokens_total")]
        return generated(first) != generated(second)

    def figures(read):
        try:
            state = host_ops.loads_json(read["server_info"]["body"])["internal_states"][0]
            return state.get("avg_spec_accept_length"), state.get("last_gen_throughput")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return None
    return figures(first) != figures(second)


def _status_int(value, default: int, limit: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit else default


def cmd_status(args) -> dict:
    """The PID file's server, its deployment and last good records, and two reads of its figures
    ``--window`` seconds apart (or around ``--probe`` requests): /metrics, /server_info, /v1/loads."""
    # bounded (64 bytes, regular file) before any int(): 5,000 digits crashed int() here (issue 31)
    text, problem = host_ops.read_regular(args.pidfile, host_ops.MAX_PIDFILE_BYTES)
    text = "(over 64 bytes or not a regular file)" if problem else (text or "").strip()
    pid, _ = host_ops.read_pidfile(args.pidfile)
    running = pid is not None and host_ops.alive(pid) and "sglang" in host_ops.cmdline(pid)
    document = {"schema": 1, "pid": pid, "alive": running, "pidfile": text[:40],
                "uptime_s": _status_uptime(pid) if running and pid is not None else None,
                "record": host_ops._read_json_file(args.record), "last_good": host_ops._read_json_file(args.last_good),
                "canary": host_ops._read_json_file(args.canary) if args.canary else None, "now": time.time(),
                "health": None, "reads": [], "probe": None, "probe_skipped": False}  # type: Dict[str, Any]
    if not running:
        return document
    health = _status_get(args.base + "/health", args.timeout, 0)
    document["health"] = {"status": health["status"], "error": health["error"]}
    # a server launched with --api-key: its key, read from its record here (host_ops.server_api_key)
    key, _ = host_ops.server_api_key(args.record)
    auth = {"Authorization": "Bearer " + key} if key else None
    first = _status_read(args.base, args.timeout, True, auth)
    metrics = first["metrics"]["status"] == 200
    time.sleep(args.window)
    second = _status_read(args.base, args.timeout, metrics, auth)
    document["probe_skipped"] = bool(args.probe) and _status_traffic(first, second, metrics)
    if args.probe and not document["probe_skipped"]:
        # 0: the load of the last good benchmark (its concurrency and output length), so that the
        # probe's output tok/s compares with the number it recorded
        bench = document["last_good"] or {}
        for key in ("metrics", "bench_settings"):
            bench = bench.get(key) if isinstance(bench.get(key), dict) else {}
        concurrency = args.concurrency or _status_int(bench.get("max_concurrency"), 4, 64)
        max_new_tokens = args.max_new_tokens or _status_int(bench.get("output_len"), 256, 4096)
        document["probe"] = _status_probe(args.base, max(args.probe, concurrency), concurrency, max_new_tokens,
                                          args.probe_timeout, auth)
    document["reads"] = [first, second]
    return document



def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="server_status.py")
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--last-good", required=True)
    parser.add_argument("--canary", default="", help="the canary mark (fleet/canary.py), read when present")
    parser.add_argument("--base", required=True, help="http://HOST:PORT of the server")
    parser.add_argument("--window", type=float, default=2.0, help="seconds between the two reads")
    parser.add_argument("--timeout", type=float, default=5.0, help="one GET's timeout")
    parser.add_argument("--probe", type=int, default=0,
                        help="when idle in the window, send at least this many greedy requests")
    parser.add_argument("--concurrency", type=int, default=0, help="0: the last good benchmark's (else 4)")
    parser.add_argument("--max-new-tokens", type=int, default=0, help="0: the last good benchmark's output length")
    parser.add_argument("--probe-timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    sys.stdout.write(json.dumps(cmd_status(args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
