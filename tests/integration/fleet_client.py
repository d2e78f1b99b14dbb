"""A client that streams requests through the router without pause and counts what failed.

Used by the fleet tests and tests/benchmarks/bench_rolling_restart.py. A request fails when the
router answers anything but 200, the connection breaks, or the stream ends without ``data: [DONE]``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field


@dataclass
class ClientStats:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    #: (monotonic start, monotonic end, ok)
    timeline: list[tuple[float, float, bool]] = field(default_factory=list)


def stream_once(address: str, port: int, max_new_tokens: int = 32, timeout: float = 30,
                text: str = "rolling restart probe") -> tuple[bool, str]:
    conn = http.client.HTTPConnection(address, port, timeout=timeout)
    try:
        body = json.dumps({"text": text, "stream": True,
                           "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
        conn.request("POST", "/generate", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return False, f"status {resp.status}: {resp.read(200)!r}"
        events, done = 0, False
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if line == "data: [DONE]":
                done = True
                break
            if line.startswith("data:"):
                json.loads(line[5:])
                events += 1
        if not done:
            return False, f"stream ended without [DONE] after {events} event(s)"
        return True, ""
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


class StreamingClient:
    def __init__(self, address: str, port: int, concurrency: int = 2, max_new_tokens: int = 32,
                 prompts: tuple[str, ...] = ("rolling restart probe",), pause_s: float = 0.0):
        """``prompts``: cycled, one per request (the canary tests' live mix); ``pause_s``: each client's
        pause between requests (steady traffic at a bounded rate)."""
        self.address, self.port = address, port
        self.concurrency, self.max_new_tokens = concurrency, max_new_tokens
        self.prompts, self.pause_s = prompts, pause_s
        self._sent = 0
        self.stats = ClientStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with self._lock:
                text = self.prompts[self._sent % len(self.prompts)]
                self._sent += 1
            ok, why = stream_once(self.address, self.port, self.max_new_tokens, text=text)
            with self._lock:
                self.stats.timeline.append((started, time.monotonic(), ok))
                if ok:
                    self.stats.ok += 1
                else:
                    self.stats.failed += 1
                    self.stats.errors.append(why)
            if self.pause_s:
                self._stop.wait(self.pause_s)

    def __enter__(self) -> "StreamingClient":
        for i in range(self.concurrency):
            thread = threading.Thread(target=self._loop, name=f"client-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
