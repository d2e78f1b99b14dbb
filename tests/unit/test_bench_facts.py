"""bench_serving result parsing, from output in SGLang 0.5.x's format."""

import pytest

from deploy.errors import RemoteOutputError
from deploy.facts.bench import parse_bench_result

REAL = """\
Namespace(backend='sglang', base_url='http://127.0.0.1:30000', dataset_name='random-ids', num_prompts=64)
#Input tokens: 65536
#Output tokens: 32768
Starting warmup with 1 sequences...
Warmup completed with 1 sequences. Starting main benchmark run...

============ Serving Benchmark Result ============
Backend:                                 sglang
Traffic request rate:                    inf
Max request concurrency:                 8
Successful requests:                     64
Benchmark duration (s):                  52.31
Total input tokens:                      65536
Total generated tokens:                  32768
Total generated tokens (retokenized):    32711
Request throughput (req/s):              1.22
Input token throughput (tok/s):          1252.82
Output token throughput (tok/s):         626.41
Total token throughput (tok/s):          1879.23
Concurrency:                             7.96
Accept length:                           2.95
----------------End-to-End Latency----------------
Mean E2E Latency (ms):                   6505.12
Median E2E Latency (ms):                 6498.77
---------------Time to First Token----------------
Mean TTFT (ms):                          412.30
Median TTFT (ms):                        398.02
P99 TTFT (ms):                           901.55
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          11.92
---------------Inter-Token Latency----------------
Mean ITL (ms):                           35.11
Median ITL (ms):                         33.40
P95 ITL (ms):                            60.02
==================================================
"""


def test_real_block():
    result = parse_bench_result(REAL)
    assert result.successful_requests == 64 and result.output_tokens == 32768
    assert result.output_tok_s == 626.41 and result.accept_length == 2.95
    assert result.mean_itl_ms == 35.11 and result.duration_s == 52.31


def test_without_speculation_accept_length_is_absent():
    result = parse_bench_result(REAL.replace("Accept length:                           2.95\n", ""))
    assert result.accept_length is None


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda s: s.split("============ Serving")[0], "no 'Serving Benchmark Result' block"),
        (lambda s: s.replace("Output token throughput (tok/s):         626.41\n", ""), "lacks Output token throughput"),
        (lambda s: s.replace("626.41", "n/a"), "not a number"),
        (lambda s: s.replace("Successful requests:                     64", "Successful requests:                     6.5"), "whole number"),
        (lambda s: s.rsplit("=====", 1)[0].rsplit("\n", 1)[0], "not closed"),
        (lambda s: s.replace("Concurrency:                             7.96", "garbage line without colon"), "unexpected line"),
    ],
)
def test_malformed_output_is_an_error(mutate, fragment):
    with pytest.raises(RemoteOutputError, match=fragment):
        parse_bench_result(mutate(REAL), source="kimi-a")
