"""SIMULATED ``python3 -m sglang.bench_serving``: a TEST DOUBLE from deployctl's sandbox.

Sends requests to the stand-in server (/generate) and prints SGLang's result block, including
``Accept length:`` (read from /server_info's internal_states[0].avg_spec_accept_length, as the real
tool does) and ``Output token throughput (tok/s):``.

Faithful: the flag names and defaults used by deployctl, the result-block layout (P99 TTFT/ITL
rows included), that ``random`` and a ``sharegpt`` without ``--dataset-path`` need the Hugging Face
hub (the sandbox is offline, so they fail like an offline host) while ``random-ids`` does not;
``--dataset-name sharegpt|custom --dataset-path FILE`` read that local file as SGLang 0.5.23 does
(sharegpt: a JSON array, ``conversations``/``conversation`` with >= 2 turns, the first two turns'
``value``; custom: JSON Lines, ``content`` or ``value``, lines that are not JSON skipped; shuffled
with --seed; prompts or outputs under 2 tokens pruned; ``--sharegpt-output-len`` fixes the output
length) and a missing file fails with FileNotFoundError; the prompts' text is what is sent, so the
numbers are the dataset's; --flush-cache before the run.
Not faithful: durations and throughputs come from the stand-in's simulated latencies (its
``meta_info.e2e_latency``), not the wall clock; no streaming, so TTFT/ITL are estimates; only
``--backend sglang``; requests go out in order with at most --max-concurrency in flight; "tokens" are words (the
stand-in server counts words too); the --output-file line also names the dataset file and its
sha256 (``simulated_dataset_sha256``: not in the real tool's output, for deployctl's tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
      choices=["sharegpt", "custom", "random", "random-ids", "generated-shared-prefix", "mmmu"])
    a("--dataset-path", type=str, default="")
    a("--sharegpt-output-len", type=int, default=None)
    a("--sharegpt-context-len", type=int, default=None)
    a("--prompt-suffix", type=str, default="")
    a("--apply-chat-template", action="store_true")
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


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def get_auth_headers() -> dict:
    """As sglang/benchmark/serving.py (0.5.21 - 0.5.23) reads a key: ``OPENAI_API_KEY`` as a bearer
    token, else ``API_KEY`` as the whole header; a server launched with ``--api-key`` answers 401
    without it."""
    openai_api_key = os.environ.get("OPENAI_API_KEY")
    if openai_api_key:
        return {"Authorization": f"Bearer {openai_api_key}"}
    api_key = os.environ.get("API_KEY")
    if api_key:
        return {"Authorization": f"{api_key}"}
    return {}


def _request(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **get_auth_headers()})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        payload = resp.read()
    try:
        return json.loads(payload) if payload else {}
    except ValueError:
        return {}


def _words(text: str) -> int:
    return len(text.split())


def _is_file_valid_json(path: str) -> bool:
    if not os.path.isfile(path):
        return False
    try:
        with open(path) as f:
            json.load(f)
        return True
    except ValueError as e:
        print(f"{path} exists but json loading fails ({e=}), thus treat as invalid file")
        return False


def _turn(turn: dict, custom: bool) -> str:
    return turn.get("content", turn.get("value", "")) if custom else turn["value"]


def sample_file_requests(args: argparse.Namespace, rng: random.Random) -> list[tuple[str, int, int]]:
    """(prompt, prompt tokens, output tokens) as sglang 0.5.23's sharegpt/custom loaders pick them."""
    custom = args.dataset_name == "custom"
    if args.sharegpt_output_len is not None and args.sharegpt_output_len < 4:
        raise ValueError("output_len too small")
    if custom:
        if not args.dataset_path:
            raise FileNotFoundError("--dataset-name custom requires --dataset-path pointing to a local jsonl file")
        if not os.path.isfile(args.dataset_path):
            raise FileNotFoundError(f"Dataset not found at {args.dataset_path}")
        dataset = []
        with open(args.dataset_path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        dataset.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue
    else:
        _is_file_valid_json(args.dataset_path)
        with open(args.dataset_path) as f:  # a missing file: FileNotFoundError, as the real tool
            dataset = json.load(f)
    pairs = []
    for data in dataset:
        convs = data.get("conversations", data.get("conversation", []))
        if len(convs) >= 2:
            pairs.append((_turn(convs[0], custom), _turn(convs[1], custom)))
    rng.shuffle(pairs)
    rows = []
    for prompt, completion in pairs:
        if len(rows) == args.num_prompts:
            break
        n_in = _words(prompt) + 1  # a BOS token, as a tokenizer adds
        n_out = _words(completion) if args.sharegpt_output_len is None else args.sharegpt_output_len
        if n_in < 2 or n_out < 2:
            continue
        if args.sharegpt_context_len and n_in + n_out > args.sharegpt_context_len:
            continue
        rows.append((prompt, n_in, n_out))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.dataset_name == "random" or (args.dataset_name == "sharegpt" and not args.dataset_path) or \
            args.dataset_name in ("generated-shared-prefix", "mmmu"):
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
    texts: list[str | None]
    if args.dataset_name in ("sharegpt", "custom"):
        try:
            rows = sample_file_requests(args, rng)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print("Traceback (most recent call last):\n  File \"sglang/bench_serving.py\", line 1, in <module>\n"
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        texts = [r[0] for r in rows]
        prompts = [(r[1], r[2]) for r in rows]
    else:
        lo = max(1, int(args.random_input_len * args.random_range_ratio))
        lo_out = max(1, int(args.random_output_len * args.random_range_ratio))
        prompts = [(rng.randint(lo, args.random_input_len), rng.randint(lo_out, args.random_output_len))
                   for _ in range(args.num_prompts)]
        texts = [None] * len(prompts)
    print(f"#Input tokens: {sum(p for p, _ in prompts)}")
    print(f"#Output tokens: {sum(o for _, o in prompts)}")
    for _ in range(args.warmup_requests):
        _request(f"{base}/generate", {"input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 16}})
    if args.flush_cache:
        _request(f"{base}/flush_cache", {})

    def one(item: tuple[tuple[int, int], str | None]) -> dict:
        (n_in, n_out), text = item
        params = {"max_new_tokens": n_out, "temperature": 0, "ignore_eos": True}
        if text is not None:
            body: dict = {"text": text, "sampling_params": params}
        else:
            body = {"input_ids": [rng.randrange(1, 30000) for _ in range(min(n_in, 64))] + [1] * max(0, n_in - 64),
                    "sampling_params": params}
        return _request(f"{base}/generate", body)["meta_info"]

    concurrency = args.max_concurrency or len(prompts) or 1
    with ThreadPoolExecutor(max_workers=min(concurrency, 64)) as pool:
        metas = list(pool.map(one, list(zip(prompts, texts))))
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
    row("P99 TTFT (ms):", _p99(ttft) * 1000, "<10.2f")
    print("{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"))
    row("Mean ITL (ms):", statistics.mean(itl) * 1000, "<10.2f")
    row("Median ITL (ms):", statistics.median(itl) * 1000, "<10.2f")
    row("P99 ITL (ms):", _p99(itl) * 1000, "<10.2f")
    print("=" * 50)
    if args.output_file:
        result = {"backend": args.backend, "dataset_name": args.dataset_name,
                  "completed": len(metas), "duration": duration, "total_input_tokens": total_in,
                  "total_output_tokens": total_out, "output_throughput": total_out / duration,
                  "accept_length": accept, "mean_e2e_latency_ms": statistics.mean(latencies) * 1000,
                  "dataset_path": args.dataset_path or None, "simulated": True}
        if args.dataset_path and os.path.isfile(args.dataset_path):
            with open(args.dataset_path, "rb") as f:
                result["simulated_dataset_sha256"] = hashlib.sha256(f.read()).hexdigest()
        with open(args.output_file, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
