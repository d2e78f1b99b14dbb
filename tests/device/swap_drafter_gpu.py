"""One real drafter swap on a GPU machine with SGLang 0.5.21+ installed (issue 41). Not collected by
pytest, never run in the sandbox: what only a GPU shows (CUDA IPC handles, the real load_weights into
the running draft model, the sender's copy and CUDA context in GPU memory, the real swap time, the
requests the model-update lock holds back, acceptance after the swap).

    python tests/device/swap_drafter_gpu.py --target Qwen/Qwen3-8B --drafter /path/eagle3-a \\
        --new-drafter /path/eagle3-b [--tp 1] [--port 31000] [--api-key K] [--admin-api-key M]

Run it with the python SGLang is installed in (the sender imports torch, safetensors and sglang
there, as under a run's ``sglang_python``). It launches ``python -m sglang.launch_server`` with EAGLE-3
and ``--drafter`` on 127.0.0.1, waits for /health, measures acceptance, starts streaming requests,
runs deployctl's own sender (deploy/remote/drafter_swap.py send) with ``--new-drafter`` while sampling
nvidia-smi, checks /model_info's weight_version, measures acceptance again, stops the server it started
(by its process group) and prints one JSON line:

- ``send``: the sender's summary (``ok``, ``seconds``, ``held_s``, ``held``: begin/update/end);
- ``longest_request_during_swap_s`` and the requests' count: what the writer lock held back;
- ``gpu_mib``: per GPU, used before, the peak during the send (the sender's copy and context), after;
- ``accept_length``: before and after (completion tokens / verify steps of /generate's meta_info);
- ``weight_version``: what /model_info reports after (the sender's version on success).

The two drafters must be two checkpoints of one training run (same config and shapes), converted for
SGLang (``deployctl fix-keys``). Exit status 0 when the swap was verified (weight_version moved and the
server still serves), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SENDER = REPO / "deploy" / "remote" / "drafter_swap.py"
PROMPTS = ["Explain how a hash map handles collisions.", "Write a short poem about the sea.",
           "List five prime numbers and say why they are prime.", "Summarise the causes of the French Revolution."]


def request(url: str, body: dict | None = None, key: str | None = None, timeout: float = 300) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read(500).decode("utf-8", "replace")}
    except (OSError, ValueError) as exc:
        return 0, {"error": f"{type(exc).__name__}: {exc}"}


def gpu_used() -> dict[int, int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return {int(i): int(u) for i, u in (line.split(",") for line in out.strip().splitlines())}


def accept_length(url: str, key: str | None, rounds: int = 8) -> float | None:
    """Completion tokens per verify step over a few greedy generations (SGLang's meta_info)."""
    tokens = steps = 0
    for i in range(rounds):
        status, answer = request(f"{url}/generate", {"text": PROMPTS[i % len(PROMPTS)],
                                                     "sampling_params": {"max_new_tokens": 256, "temperature": 0}}, key)
        meta = answer.get("meta_info") or {} if status == 200 else {}
        tokens += int(meta.get("completion_tokens") or 0)
        steps += int(meta.get("spec_verify_ct") or 0)
    return round(tokens / steps, 3) if steps else None


class Load(threading.Thread):
    """Streaming requests while the swap runs: the longest one is what the writer lock held back."""

    def __init__(self, url: str, key: str | None) -> None:
        super().__init__(daemon=True)
        self.url, self.key = url, key
        self.stop = threading.Event()
        self.timeline: list[tuple[float, float, int]] = []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            started = time.monotonic()
            status, _ = request(f"{self.url}/generate", {"text": PROMPTS[i % len(PROMPTS)],
                                                         "sampling_params": {"max_new_tokens": 512}}, self.key)
            self.timeline.append((started, time.monotonic(), status))
            i += 1


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak: dict[int, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for gpu, used in gpu_used().items():
                self.peak[gpu] = max(self.peak.get(gpu, 0), used)
            self.stop.wait(0.2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="the drafter the server starts with")
    parser.add_argument("--new-drafter", required=True, help="the drafter swapped in (same config and shapes)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--port", type=int, default=31000)
    parser.add_argument("--api-key")
    parser.add_argument("--admin-api-key")
    parser.add_argument("--load-clients", type=int, default=4)
    parser.add_argument("--startup-timeout", type=float, default=1800)
    args = parser.parse_args()

    url = f"http://127.0.0.1:{args.port}"
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", args.target, "--host", "127.0.0.1",
            "--port", str(args.port), "--tp", str(args.tp), "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", args.drafter, "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    for flag, value in (("--api-key", args.api_key), ("--admin-api-key", args.admin_api_key)):
        if value:
            argv += [flag, value]
    normal_key = args.api_key
    state = Path(tempfile.mkdtemp(prefix="swap-device-"))
    # the sender reads the keys from the host's deployment record, as on a deployctl host
    (state / "deployment.json").write_text(json.dumps({"argv": argv}))
    log = open(state / "server.log", "w")
    result: dict = {"target": args.target, "tp": args.tp, "state_dir": str(state)}
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + args.startup_timeout
        while request(f"{url}/health", timeout=5)[0] != 200:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not come up (exit {server.poll()}); see {state / 'server.log'}")
            time.sleep(2)
        result["sglang"] = request(f"{url}/server_info", key=normal_key)[1].get("version")
        result["accept_length"] = {"before": accept_length(url, normal_key)}
        before = gpu_used()
        load = [Load(url, normal_key) for _ in range(args.load_clients)]
        for client in load:
            client.start()
        time.sleep(3)  # requests in flight when the session begins
        sampler = Sampler()
        sampler.start()
        version = f"device-check-{int(time.time())}"
        started = time.monotonic()
        sent = subprocess.run([sys.executable, str(SENDER), "send", "--url", url, "--drafter", args.new_drafter,
                               "--weight-version", version, "--tp", str(args.tp), "--base-gpu-id", "0",
                               "--state-dir", str(state), "--timeout", "900"], capture_output=True, text=True)
        ended = time.monotonic()
        sampler.stop.set()
        sampler.join()
        time.sleep(3)
        for client in load:
            client.stop.set()
        for client in load:
            client.join(timeout=600)
        try:
            result["send"] = json.loads(sent.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            result["send"] = {"exit": sent.returncode, "stderr": sent.stderr[-2000:]}
        overlapping = [end - start for c in load for start, end, _ in c.timeline if end >= started and start <= ended]
        result["longest_request_during_swap_s"] = round(max(overlapping, default=0.0), 3)
        result["requests_during_swap"] = len(overlapping)
        result["requests_failed"] = sum(1 for c in load for *_, status in c.timeline if status != 200)
        after = gpu_used()
        result["gpu_mib"] = {str(g): {"before": before.get(g), "peak_during_send": sampler.peak.get(g),
                                      "after": after.get(g)} for g in sorted(before)}
        result["weight_version"] = request(f"{url}/model_info", key=normal_key)[1].get("weight_version")
        result["healthy_after"] = request(f"{url}/health", timeout=10)[0] == 200
        result["same_server"] = server.poll() is None
        result["accept_length"]["after"] = accept_length(url, normal_key)
        ok = result["weight_version"] == version and result["healthy_after"] and result["same_server"]
        result["verified"] = ok
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()
    print(json.dumps(result, sort_keys=True))
    return 0 if result.get("verified") else 1


if __name__ == "__main__":
    sys.exit(main())
