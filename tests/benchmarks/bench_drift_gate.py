"""Benchmark: nightly's throughput verdict when the host's speed drifts between nights (issue 39).

    python tests/benchmarks/bench_drift_gate.py [--nights 200] [--rounds 12] [--drift 0.25] [--samples FILE]

Not collected by pytest (bench_*.py); needs no sandbox (a pure replay, a few seconds). The successor of
bench_regression_gate.py, whose nights all ran at one speed (0.5% drift): it replays
deploy/local/same_night.judge, the verdict nightly's regression-gate step gives, and, on the same samples,
the gate before issue 39 (deploy/local/throughput_gate.decide of tonight's rounds against the stored bar).

Drift model (stand-in numbers, not a GPU's): output tok/s = 1000 x the night's host speed x a block factor
x per-round noise, where
- the host speed of a night is uniform in [1 - drift, 1 + drift] (default +-25%), drawn independently for the
  night the stored bar was measured and for tonight: between nights the speed moves by up to -40%/+67%;
- the two blocks of one night (the control: the last good deployment's rounds before the stop; then the new
  deployment's rounds) each get their own factor, lognormal sigma 1% (the machine's load moving within the
  hour between them);
- each round: lognormal sigma 2.5%, and 1 round in 20 hit by a noisy neighbour (x 0.75-0.90), as in
  bench_regression_gate.py.

Scenarios, ``--nights`` each: an unchanged deployment (same fingerprint; no control is measured: converge finds
it running as desired); a new checkpoint of the same speed; new checkpoints really 15% and 25% slower.
Goals: 0 false rollbacks or quarantines (verdict ``regression``) over the unchanged and same-speed nights;
at least 95% of the 15% and 25% slower checkpoints caught.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from deploy.local.same_night import judge  # noqa: E402
from deploy.local.throughput_gate import decide  # noqa: E402

BASE_TOK_S = 1000.0
BLOCK_SIGMA = 0.01
ROUND_SIGMA = 0.025
OUTLIER_P = 0.05
OUTLIER_RANGE = (0.75, 0.90)
FLOOR = 0.9


def block(rng: random.Random, n: int, speed: float) -> list[float]:
    factor = speed * math.exp(rng.gauss(0, BLOCK_SIGMA))
    out = []
    for _ in range(n):
        value = BASE_TOK_S * factor * math.exp(rng.gauss(0, ROUND_SIGMA))
        if rng.random() < OUTLIER_P:
            value *= rng.uniform(*OUTLIER_RANGE)
        out.append(round(value, 2))
    return out


def nights(seed: int, count: int, n: int, drift: float, level: float, unchanged: bool) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        bar_night, tonight = rng.uniform(1 - drift, 1 + drift), rng.uniform(1 - drift, 1 + drift)
        night = {"bar_speed": round(bar_night, 4), "speed": round(tonight, 4), "bar": block(rng, n, bar_night)}
        if not unchanged:
            night["control"] = block(rng, n, tonight)
        night["now"] = block(rng, n, tonight * level)
        out.append(night)
    return out


def replay(samples: list[dict], unchanged: bool) -> dict:
    counts = {"pass": 0, "regression": 0, "inconclusive": 0, "drift": 0}
    before = {"pass": 0, "regression": 0, "inconclusive": 0}
    for night in samples:
        verdict = judge(night["now"], night["bar"], FLOOR, control=night.get("control"), unchanged=unchanged)
        counts[verdict.outcome] += 1
        before[decide(night["now"], night["bar"], FLOOR).outcome] += 1
    return {"verdicts": counts, "before_issue_39": before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=12, help="benchmark rounds per block (nightly.yaml: 12)")
    parser.add_argument("--drift", type=float, default=0.25, help="the host's speed per night: uniform in 1 +- this")
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--samples", type=Path, help="write the replayed samples here (JSON)")
    args = parser.parse_args()
    started = time.monotonic()
    scenarios = {"unchanged": (1.0, True), "same_speed_checkpoint": (1.0, False),
                 "slower_15": (0.85, False), "slower_25": (0.75, False)}
    samples = {name: nights(args.seed + i, args.nights, args.rounds, args.drift, level, unchanged)
               for i, (name, (level, unchanged)) in enumerate(scenarios.items())}
    result: dict = {"nights": args.nights, "rounds": args.rounds, "drift": args.drift, "floor": FLOOR}
    for name, (_, unchanged) in scenarios.items():
        result[name] = replay(samples[name], unchanged)
    false_alarms = result["unchanged"]["verdicts"]["regression"] + \
        result["same_speed_checkpoint"]["verdicts"]["regression"]
    caught = {name: result[name]["verdicts"]["regression"] for name in ("slower_15", "slower_25")}
    result["false_alarms"] = false_alarms
    result["caught"] = caught
    result["seconds"] = round(time.monotonic() - started, 2)
    if args.samples:
        args.samples.write_text(json.dumps(samples))
    print(json.dumps(result, indent=2))
    need = math.ceil(0.95 * args.nights)
    ok = false_alarms == 0 and all(c >= need for c in caught.values())
    old_false = result["unchanged"]["before_issue_39"]["regression"] + \
        result["same_speed_checkpoint"]["before_issue_39"]["regression"]
    print(f"false rollbacks/quarantines {false_alarms}/{2 * args.nights} (goal 0); caught 15% slower "
          f"{caught['slower_15']}/{args.nights}, 25% slower {caught['slower_25']}/{args.nights} (goal >= {need} each); "
          f"the gate before issue 39: {old_false}/{2 * args.nights} false, "
          f"{result['slower_15']['before_issue_39']['regression']} and "
          f"{result['slower_25']['before_issue_39']['regression']} caught: {'GOAL MET' if ok else 'GOAL MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
