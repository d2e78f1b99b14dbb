"""``python3 -m sglang.bench_serving`` result block: strict parser.

The block is ``==== Serving Benchmark Result ====`` followed by ``Label:   value`` rows (values
left-aligned; some SGLang versions pad them to 10 columns with trailing spaces) and dashed section rules, closed by
a row of ``=``. Rows deployctl does not read are allowed (SGLang adds rows across versions: "Peak
output token throughput", "Total input text tokens", P90/P95 latencies), but each must still be a
``Label: value`` row. Missing required rows, a row given twice, numbers that do not parse or are
not finite, negative values and a missing or unclosed block are errors quoting what was seen; the
numbers are never guessed. Table-tested from published bench_serving output in tests/facts/bench_serving/.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field

from deploy.base.errors import RemoteOutputError

_ROW = re.compile(r"^(?P<label>[A-Za-z][^:]*?):\s+(?P<value>\S.*?)\s*$")
_START = re.compile(r"^=+\s*Serving Benchmark Result\s*=+$")

REQUIRED = {
    "Successful requests": "successful_requests",
    "Benchmark duration (s)": "duration_s",
    "Total generated tokens": "output_tokens",
    "Output token throughput (tok/s)": "output_tok_s",
}
OPTIONAL = {
    "Request throughput (req/s)": "request_per_s",
    "Mean E2E Latency (ms)": "mean_e2e_ms",
    "Mean TTFT (ms)": "mean_ttft_ms",
    "Mean ITL (ms)": "mean_itl_ms",
    "P99 TTFT (ms)": "p99_ttft_ms",
    "P99 ITL (ms)": "p99_itl_ms",
    "Accept length": "accept_length",
}


class BenchResult(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    successful_requests: int = Field(ge=0)
    duration_s: float = Field(ge=0)
    output_tokens: int = Field(ge=0)
    output_tok_s: float = Field(ge=0)
    #: absent when the server runs without speculative decoding
    accept_length: float | None = Field(default=None, ge=0)
    request_per_s: float | None = Field(default=None, ge=0)
    mean_e2e_ms: float | None = Field(default=None, ge=0)
    mean_ttft_ms: float | None = Field(default=None, ge=0)
    mean_itl_ms: float | None = Field(default=None, ge=0)
    #: the tail the sweep report shows next to the means (rows of SGLang's result block since 0.4)
    p99_ttft_ms: float | None = Field(default=None, ge=0)
    p99_itl_ms: float | None = Field(default=None, ge=0)

    def to_dict(self) -> dict:
        return self.model_dump()


def _number(label: str, value: str, line: str, source: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise RemoteOutputError(f"{source}: bench_serving {label!r} is {value!r}, not a number, in line {line!r}") from None
    if not math.isfinite(number) or number < 0:
        raise RemoteOutputError(f"{source}: bench_serving {label!r} is {value!r}, expected a finite number >= 0, "
                                f"in line {line!r}")
    return number


def parse_bench_result(output: str, *, source: str = "bench_serving") -> BenchResult:
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if _START.match(line.strip())), None)
    if start is None:
        tail = " | ".join(line.strip() for line in lines[-3:] if line.strip())
        raise RemoteOutputError(f"{source}: no 'Serving Benchmark Result' block in bench_serving output (ends: {tail[:300]!r})")
    fields: dict[str, float] = {}
    for line in lines[start + 1:]:
        text = line.strip()
        if re.fullmatch(r"=+", text):
            break
        if not text or re.fullmatch(r"-{3,}[^:]*-{3,}", text):  # section rule, e.g. ---Time to First Token---
            continue
        match = _ROW.match(text)
        if not match:
            raise RemoteOutputError(f"{source}: unexpected line in the bench_serving result block: {text!r}")
        label = match.group("label")
        key = REQUIRED.get(label) or OPTIONAL.get(label)
        if key is not None:
            if key in fields:
                raise RemoteOutputError(f"{source}: bench_serving result block has {label!r} twice: {text!r}")
            fields[key] = _number(label, match.group("value"), text, source)
    else:
        raise RemoteOutputError(f"{source}: the bench_serving result block is not closed (output cut short?)")
    missing = [label for label, key in REQUIRED.items() if key not in fields]
    if missing:
        raise RemoteOutputError(f"{source}: bench_serving result lacks {', '.join(missing)}")
    counts: dict[str, int] = {}
    for key in ("successful_requests", "output_tokens"):
        if fields[key] != int(fields[key]):
            raise RemoteOutputError(f"{source}: bench_serving {key} is {fields[key]}, expected a whole number")
        counts[key] = int(fields.pop(key))
    return BenchResult.model_validate({**fields, **counts})
