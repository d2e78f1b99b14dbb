"""Benchmark: how many requests and seconds the live canary needs to decide, and how often it is wrong.

    python tests/benchmarks/bench_canary.py [--windows 200] [--rate 6] [--replicas 3] [--interval 5]
                                            [--window 600] [--seed 43]

Not collected by pytest (bench_*.py); needs no sandbox (a pure replay, about a minute). Simulates
canary windows and replays deploy/local/canary_gate.decide after every interval, as the canary
phase does (deploy/fleet/canary.py), stopping at the first decision.

The traffic is stand-in traffic, not a GPU's (docs/benchmarks.md says so beside the figures):

- ``--rate`` requests per second through the router, spread uniformly at random over ``--replicas``
  replicas (the canary gets ~1/N of them);
- each request is of one prompt kind; the mix drifts in waves (each kind's weight follows a sine
  of its own period and phase, 2-8 minutes), so the live acceptance of every replica moves by
  +-15% within a window: what the pairing in time must cancel;
- a request's accept length is its kind's mean for the last good drafter (KIND_ACCEPT, the sandbox
  stand-in's per-kind table, sandbox/sim_sglang/sglang/srt/speculative/prompt_kinds.py) x a
  per-request lognormal spread (sigma 12%) x (1 - drop) on the canary;
- what deployctl reads per replica at each instant is SGLang's ``sglang:spec_accept_length``
  gauge, the last decode log interval's accept length (every 40 decode steps): modelled as the
  token-weighted mean over the last ``GAUGE_REQUESTS`` requests the replica finished (a noisier
  reading than the interval's mean); and the per-token latency histogram's mean over the interval
  (step time / accept length, x lognormal 6% for the batch the replica happened to run).

Goals (issue 43): 0 wrong rollbacks in 200 windows of an unchanged drafter; a 10% drop caught in
at least 95% of windows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "sandbox" / "sim_sglang"))

from deploy.local.canary_gate import Interval, Settings, Side, decide  # noqa: E402

# the stand-in package's import pays a real SGLang's import time (2.5 s); only its per-kind table is read here
os.environ.setdefault("SGLANG_SIM_IMPORT_SECONDS", "0")

from sglang.srt.speculative.prompt_kinds import KIND_ACCEPT  # noqa: E402

PER_REQUEST_SIGMA = 0.12
LATENCY_SIGMA = 0.06
GAUGE_REQUESTS = 8
STEP_S = 0.0195
TOKENS = (64, 512)


def window(rng: random.Random, drop: float, args) -> dict:
    """One canary window: the decision and when it came."""
    kinds = list(KIND_ACCEPT)
    periods = [rng.uniform(120, 480) for _ in kinds]
    phases = [rng.uniform(0, 2 * math.pi) for _ in kinds]
    settings = Settings(min_requests=args.min_requests, looks=max(1, int(args.window // args.interval)))
    intervals: list[Interval] = []
    recent: list[list[tuple[float, int]]] = [[] for _ in range(args.replicas)]
    t = 0.0
    canary_requests = 0
    while t < args.window:
        t += args.interval
        weights = [1 + 0.9 * math.sin(2 * math.pi * t / p + ph) for p, ph in zip(periods, phases)]
        count = [0] * args.replicas
        tokens_sum = [0.0] * args.replicas
        accepted_weighted = [0.0] * args.replicas
        arrivals = _poisson(rng, args.rate * args.interval)
        for _ in range(arrivals):
            replica = rng.randrange(args.replicas)
            kind = rng.choices(kinds, weights)[0]
            accept = KIND_ACCEPT[kind] * math.exp(rng.gauss(0, PER_REQUEST_SIGMA))
            if replica == 0:
                accept *= 1 - drop
            accept = max(1.0, accept)
            tokens = rng.randint(*TOKENS)
            count[replica] += 1
            tokens_sum[replica] += tokens
            accepted_weighted[replica] += accept * tokens
            recent[replica] = (recent[replica] + [(accept, tokens)])[-GAUGE_REQUESTS:]
        sides = []
        for r in range(args.replicas):
            gauge = (sum(a * n for a, n in recent[r]) / sum(n for _, n in recent[r])) if recent[r] else None
            mean_accept = accepted_weighted[r] / tokens_sum[r] if tokens_sum[r] else None
            token_s = STEP_S / mean_accept * math.exp(rng.gauss(0, LATENCY_SIGMA)) if mean_accept else None
            sides.append(Side(gauge if count[r] else None, count[r], token_s))
        others = sides[1:]
        total = sum(s.requests for s in others)
        if total:
            accept = sum(s.accept * s.requests for s in others if s.accept is not None) / total
            token_s = sum(s.token_s * s.requests for s in others if s.token_s is not None) / total
            other = Side(accept, total, token_s)
        else:
            other = Side(None, 0, None)
        intervals.append(Interval(t, sides[0], other))
        canary_requests += count[0]
        decision = decide(intervals, settings, final=t >= args.window)
        if decision.outcome != "watching":
            return {"outcome": decision.outcome, "figure": decision.figure, "seconds": t,
                    "canary_requests": canary_requests}
    raise AssertionError("the window ended without a final decision")


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method is fine at these means (<= ~100); a normal approximation above
    if mean > 100:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def run(args) -> dict:
    results = {}
    for drop in (0.0, 0.05, 0.10, 0.20):
        rng = random.Random(f"{args.seed}-{drop}")
        started = time.monotonic()
        outcomes = [window(rng, drop, args) for _ in range(args.windows)]
        counts = {k: sum(1 for o in outcomes if o["outcome"] == k) for k in ("promote", "roll-back", "inconclusive")}
        decided = [o for o in outcomes if o["outcome"] == ("roll-back" if drop else "promote")]
        results[f"{drop:.0%}"] = {
            **counts,
            "by_speed": sum(1 for o in outcomes if o["outcome"] == "roll-back" and o["figure"] == "speed"),
            "median_seconds": statistics.median(o["seconds"] for o in decided) if decided else None,
            "p95_seconds": _p95([o["seconds"] for o in decided]),
            "median_canary_requests": statistics.median(o["canary_requests"] for o in decided) if decided else None,
            "p95_canary_requests": _p95([o["canary_requests"] for o in decided]),
            "replay_s": round(time.monotonic() - started, 1)}
    return results


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--rate", type=float, default=6.0, help="requests per second through the router")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--window", type=float, default=600.0)
    parser.add_argument("--min-requests", type=int, default=200)
    parser.add_argument("--seed", default="43")
    args = parser.parse_args()
    results = run(args)
    print(json.dumps({"settings": vars(args), "results": results}, indent=2))
    unchanged, ten = results["0%"], results["10%"]
    ok = unchanged["roll-back"] == 0 and ten["roll-back"] >= 0.95 * args.windows
    print(f"unchanged drafter: {unchanged['roll-back']} wrong rollback(s) in {args.windows} windows; "
          f"10% drop caught in {ten['roll-back']}/{args.windows}: {'GOALS MET' if ok else 'GOALS MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
