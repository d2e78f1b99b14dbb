"""SIMULATED ``python3 -m sglang.bench_serving``: a TEST DOUBLE from deployctl's sandbox.

Sends requests to the stand-in server (/generate) and prints SGLang's result block, including
``Accept length:`` (read from /server_info's internal_states[0].avg_spec_accept_length, as the real
tool does) and ``Output token throughput (tok/s):``.

Faithful: the flag names and defaults used by deployctl, the result-block layout, that the
``random`` and ``sharegpt`` datasets need the Hugging Face hub (the sandbox is offline, so they fail
like an offline host) while ``random-ids`` does not, --flush-cache before the run.
Not faithful: durations and throughputs come from the stand-in's simulated latencies (its
``meta_info.e2e_latency``), not the wall clock; no streaming, so TTFT/ITL are estimates; only
``--backend sglang``; requests go out in order with at most --max-concurrency in flight.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_serving.py",
                                description="SIMULATED sglang.bench_serving (deployctl sandbox test double).")
    a = p.add_argument
    a("--backend", type=str, default="sglang", choices=["sglang", "sglang-native", "sglang-oai"])
    a("--base-url", type=str, default=None)
    a("--host", type=str, default="0.0.0.0")
    a("--port", type=int, default=None)
    a("--dataset-name", type=str, default="sharegpt",
      choices=["sharegpt", "random", "random-ids", "generated-shared-prefix", "mmmu"])
    a("--dataset-path", type=str, default="")
    a("--model", type=str, default=None)
    a("--tokenizer", type=str, default=None)
    a("--num-prompts", type=int, default=1000)
    a("--random-input-len", type=int, default=1024)
    a("--random-output-len", type=int, default=1024)
    a("--random-range-ratio", type=float, default=0.0)
    a("--request-rate", type=float, default=float("inf"))
    a("--max-concurrency", type=int, default=None)
    a("--seed", type=int, default=1)
    a("--output-file", type=str, default=None)
    a("--disable-tqdm", action="store_true")
    a("--disable-stream", action="store_true")
    a("--flush-cache", action="store_true")
    a("--warmup-requests", type=int, default=1)
    return p


def _request(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        payload = resp.read()
    try:
        return json.loads(payload) if payload else {}
    except ValueError:
        return {}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dataset_name != "random-ids":
        # The real tool downloads ShareGPT (also for "random") from the hub; sandbox hosts are offline.
        print("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', "
              "port=443): Max retries exceeded with url: /datasets/anon8231489123/"
              "ShareGPT_Vicuna_unfiltered/resolve/main/ShareGPT_V3_unfiltered_cleaned_split.json "
              "(Caused by NameResolutionError: Failed to resolve 'huggingface.co')", file=sys.stderr)
        return 1
    base = args.base_url or f"http://{args.host}:{args.port or 30000}"
    print(f"Namespace({', '.join(f'{k}={v!r}' for k, v in vars(args).items())})")
    print("SIMULATED sglang.bench_serving (deployctl sandbox test double)")
    try:
        _request(f"{base}/get_model_info", timeout=30)
    except (OSError, urllib.error.URLError) as exc:
        print(f"Initial test run failed - Please make sure benchmark arguments are correctly "
              f"specified. Error: {exc}", file=sys.stderr)
        return 1
    rng = random.Random(args.seed)
    lo = max(1, int(args.random_input_len * args.random_range_ratio))
    lo_out = max(1, int(args.random_output_len * args.random_range_ratio))
    prompts = [(rng.randint(lo, args.random_input_len), rng.randint(lo_out, args.random_output_len))
               for _ in range(args.num_prompts)]
    print(f"#Input tokens: {sum(p for p, _ in prompts)}")
    print(f"#Output tokens: {sum(o for _, o in prompts)}")
    for _ in range(args.warmup_requests):
        _request(f"{base}/generate", {"input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 16}})
    if args.flush_cache:
        _request(f"{base}/flush_cache", {})

    def one(item: tuple[int, int]) -> dict:
        n_in, n_out = item
        body = {"input_ids": [rng.randrange(1, 30000) for _ in range(min(n_in, 64))] + [1] * max(0, n_in - 64),
                "sampling_params": {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}}
        return _request(f"{base}/generate", body)["meta_info"]

    concurrency = args.max_concurrency or len(prompts) or 1
    with ThreadPoolExecutor(max_workers=min(concurrency, 64)) as pool:
        metas = list(pool.map(one, prompts))
    info = _request(f"{base}/get_server_info")
    accept = (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")

    latencies = [m["e2e_latency"] for m in metas] or [0.0]
    duration = max(1e-9, sum(latencies) / min(concurrency, max(1, len(metas))))
    total_in = sum(m["prompt_tokens"] for m in metas)
    total_out = sum(m["completion_tokens"] for m in metas)
    ttft = [0.05 + m["prompt_tokens"] * 0.0001 for m in metas] or [0.0]
    itl = [(m["e2e_latency"] - t) / max(1, m["completion_tokens"] - 1) for m, t in zip(metas, ttft)] or [0.0]

    def row(label: str, value, fmt: str = "<10") -> None:
        print("{:<40} {:{}}".format(label, value, fmt))

    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    row("Backend:", args.backend)
    row("Traffic request rate:", args.request_rate)
    row("Max request concurrency:", args.max_concurrency if args.max_concurrency else "not set")
    row("Successful requests:", len(metas))
    row("Benchmark duration (s):", duration, "<10.2f")
    row("Total input tokens:", total_in)
    row("Total generated tokens:", total_out)
    row("Total generated tokens (retokenized):", total_out)
    row("Request throughput (req/s):", len(metas) / duration, "<10.2f")
    row("Input token throughput (tok/s):", total_in / duration, "<10.2f")
    row("Output token throughput (tok/s):", total_out / duration, "<10.2f")
    row("Total token throughput (tok/s):", (total_in + total_out) / duration, "<10.2f")
    row("Concurrency:", sum(latencies) / duration, "<10.2f")
    if accept is not None:
        row("Accept length:", accept, "<10.2f")
    print("{s:{c}^{n}}".format(s="End-to-End Latency", n=50, c="-"))
    row("Mean E2E Latency (ms):", statistics.mean(latencies) * 1000, "<10.2f")
    row("Median E2E Latency (ms):", statistics.median(latencies) * 1000, "<10.2f")
    print("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
    row("Mean TTFT (ms):", statistics.mean(ttft) * 1000, "<10.2f")
    row("Median TTFT (ms):", statistics.median(ttft) * 1000, "<10.2f")
    print("{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"))
    row("Mean ITL (ms):", statistics.mean(itl) * 1000, "<10.2f")
    row("Median ITL (ms):", statistics.median(itl) * 1000, "<10.2f")
    print("=" * 50)
    if args.output_file:
        result = {"backend": args.backend, "dataset_name": args.dataset_name,
                  "completed": len(metas), "duration": duration, "total_input_tokens": total_in,
                  "total_output_tokens": total_out, "output_throughput": total_out / duration,
                  "accept_length": accept, "mean_e2e_latency_ms": statistics.mean(latencies) * 1000,
                  "simulated": True}
        with open(args.output_file, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
