"""Regenerate tests/facts/status/*.json: `deployctl status`'s one host command, run for real here.

    .venv/bin/python tests/facts/capture_status.py

The command is the product's (deploy/facts/status.py ``status_command``: server_status.py sent inline),
run under this machine's python against a small HTTP server started here that answers like SGLang
0.5.23 does (/metrics lines in SGLang's names and labels, a /server_info with internal_states,
/v1/loads, /generate with meta_info), and a process whose command line says sglang (a ``sleep``
this script owns, the only process it signals). The expected facts come from what the server was
told to answer, never from the parser. The inline program is stored as ``<host_ops.py, inline>``.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from deploy.facts.status import status_command, status_program  # noqa: E402

OUT = Path(__file__).resolve().parent / "status"
PY = sys.executable
PROGRAM = "<server_status.py + host_ops.py, inline>"
LABELS = '{engine_type="unified",model_name="kimi-k25",pp_rank="0",tp_rank="0"}'


class Server:
    """What the stand-in answers; counters advance per /metrics read when ``tokens_per_read``."""

    def __init__(self) -> None:
        self.metrics: str | None = None  # None: 404 (no --enable-metrics)
        self.generated = 1000
        self.tokens_per_read = 0
        self.accept = 2.91
        self.info_accepts = [2.87, 2.87]
        self.info_reads = 0
        self.meta = {"completion_tokens": 256, "spec_verify_ct": 88, "e2e_latency": 1.77}
        self.extra_lines: list[str] = []

    def metrics_text(self) -> str:
        self.generated += self.tokens_per_read
        rows = [f"# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.",
                "# TYPE sglang:spec_accept_length gauge",
                f"sglang:spec_accept_length{LABELS} {self.accept}",
                f"sglang:spec_accept_rate{LABELS} 0.127",
                f"sglang:num_running_reqs{LABELS} 3.0", f"sglang:num_queue_reqs{LABELS} 1.0",
                f"sglang:gen_throughput{LABELS} 431.5",
                f"sglang:cache_hit_rate{LABELS} 0.5",
                f'sglang:generation_tokens_total{{model_name="kimi-k25"}} {float(self.generated)}',
                f'sglang:generation_tokens_created{{model_name="kimi-k25"}} 1.7648e+09',
                *self.extra_lines]
        return "\n".join(rows) + "\n"


def handler(state: Server):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802
            if self.path == "/health":
                self._send(200, b"")
            elif self.path == "/metrics" and state.metrics is not None:
                self._send(200, state.metrics_text().encode(), "text/plain; version=0.0.4")
            elif self.path == "/server_info":
                accept = state.info_accepts[min(state.info_reads, len(state.info_accepts) - 1)]
                state.info_reads += 1
                self._send(200, json.dumps({"speculative_num_draft_tokens": 16, "version": "0.5.23",
                                            "internal_states": [{"avg_spec_accept_length": accept,
                                                                 "last_gen_throughput": 140.2}]}).encode())
            elif self.path == "/v1/loads":
                self._send(200, json.dumps({"loads": [{"dp_rank": 0, "num_running_reqs": 2,
                                                       "num_waiting_reqs": 0}]}).encode())
            else:
                self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            self._send(200, json.dumps({"text": "x", "meta_info": state.meta}).encode())

    return Handler


def record(state_dir: Path, argv_tokens: int = 16) -> dict:
    return {"run": "kimi-k25-eagle3", "argv": ["python3", "-m", "sglang.launch_server",
                                               "--speculative-num-draft-tokens", str(argv_tokens)],
            "drafter_fingerprint": "f" * 64, "drafter_path": "~/.deployctl/drafters/" + "f" * 64,
            "env_hash": "e" * 64, "sglang_version": "0.5.23", "pid": 0, "log": str(state_dir / "logs/x.log")}


def save(case: str, result: dict, tmp: str, expect: dict) -> None:
    text = json.dumps(result | expect, indent=1, sort_keys=True).replace(tmp, "/TMP").replace(PY, "python3")
    OUT.mkdir(exist_ok=True)
    (OUT / f"{case}.json").write_text(text + "\n")


def capture(case: str, tmp: Path, state: Server, expect: dict, *, probe: int = 0, pid_alive: bool = True,
            good: dict | None = None) -> None:
    if "live" in expect:  # the parser table flattens the live figures to live_<field>
        expect = expect | {"fact": expect.get("fact", {}) | {f"live_{k}": v for k, v in expect["live"].items()}}
        del expect["live"]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = subprocess.Popen([PY, "-c", "import time; time.sleep(60)", "sglang.launch_server"])
    try:
        state_dir = tmp / case
        state_dir.mkdir()
        (state_dir / "server.pid").write_text(f"{server.pid if pid_alive else 2 ** 22 - 3}\n")
        deployment = record(state_dir) | {"pid": server.pid}
        (state_dir / "deployment.json").write_text(json.dumps(deployment))
        if good is not None:
            (state_dir / "last-good.json").write_text(json.dumps(deployment | good))
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        command = status_command(PY, str(state_dir), base, window_s=0.3, probe=probe)
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=120)
        shown = status_command("python3", str(state_dir), "http://127.0.0.1:PORT", window_s=0.3, probe=probe,
                               script=PROGRAM)
        stdout = done.stdout.replace(str(server.pid), "4242").replace(base, "http://127.0.0.1:PORT")
        save(case, {"command": shown, "exit_code": done.returncode, "stdout": stdout, "stderr": done.stderr},
             str(tmp), expect | {"source": "captured here: server_status.py against an SGLang-shaped HTTP stand-in"})
    finally:
        server.kill()
        server.wait(timeout=10)
        httpd.shutdown()
        httpd.server_close()


GOOD = {"metrics": {"draft_tokens": 16, "accept_length": 2.95, "output_tok_s": 560.0,
                    "bench_settings": {"num_prompts": 16, "input_len": 512, "output_len": 256, "max_concurrency": 4}},
        "verified_at": "2026-12-01T03:15:00+00:00"}


def main() -> None:
    assert status_program()  # the inline program builds
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        s = Server()
        s.metrics, s.tokens_per_read = "on", 900
        capture("metrics_with_traffic", tmp, s, {"fact": {
            "alive": True, "health": 200, "draft_tokens": 16, "drafter_fingerprint": "f" * 64,
            "notes": [], "pid": 4242}, "live": {"accept_length": 2.91, "source": "metrics", "running": 3,
                                                "queued": 1, "traffic": True, "server_gen_tok_s": 431.5,
                                                "throughput_comparable": False}}, good=GOOD)
        s = Server()
        s.metrics = "on"
        capture("metrics_idle", tmp, s, {"fact": {"alive": True}, "live": {
            "accept_length": 2.91, "output_tok_s": None, "traffic": False, "source": "metrics"}})
        s = Server()
        s.metrics, s.accept = "on", 0.0
        capture("metrics_before_first_decode", tmp, s, {"live": {"accept_length": None, "source": "metrics"}})
        s = Server()
        s.info_accepts = [2.87, 2.80]
        capture("server_info_without_metrics", tmp, s, {"live": {
            "accept_length": 2.80, "source": "server_info", "traffic": True, "running": 2, "queued": 0,
            "server_gen_tok_s": 140.2}})
        s = Server()
        s.metrics = "on"
        capture("probe_at_the_benchmark_load", tmp, s, {"fact": {"probe": {
            "requests": 4, "concurrency": 4, "max_new_tokens": 256, "completion_tokens": 1024,
            "spec_verify_ct": 352, "timed_by": "server e2e_latency"}}, "live": {
            "throughput_comparable": True, "traffic": True}}, probe=4, good=GOOD)
        s = Server()
        s.metrics, s.tokens_per_read = "on", 900
        capture("probe_skipped_under_traffic", tmp, s, {"fact": {"probe": None, "notes": [
            "--probe not sent: the server had traffic in the window (a probe would compete with it)"]},
            "live": {"throughput_comparable": False, "traffic": True, "accept_length": 2.91}}, probe=4, good=GOOD)
        s = Server()
        s.metrics = "on"
        s.meta = {"completion_tokens": 256}
        capture("probe_without_speculation", tmp, s, {"error": "meta_info lacks completion_tokens/spec_verify_ct"},
                probe=4)
        s = Server()
        s.metrics, s.extra_lines = "on", [f"sglang:num_queue_reqs{{tp_rank=\"1\"}} NaN"]
        capture("metrics_nan", tmp, s, {"error": "metrics: sglang:num_queue_reqs has value 'NaN'"})
        s = Server()
        s.metrics, s.extra_lines = "on", [f'sglang:spec_accept_length{{tp_rank="1" 2.5']
        capture("metrics_garbled_line", tmp, s, {"error": "metrics: not a Prometheus sample line"})
        s = Server()
        s.metrics, s.extra_lines = "on", [f"sglang:spec_accept_length{LABELS} 1.5"]
        capture("metrics_series_twice", tmp, s, {"error": "appears twice"})
        capture("no_server_running", tmp, Server(), {"fact": {"alive": False, "health": None, "notes": [
            "no SGLang server of deployctl's is running (PID 4194301 is not running)"]}}, pid_alive=False)


if __name__ == "__main__":
    main()
