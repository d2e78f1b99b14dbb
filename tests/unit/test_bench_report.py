"""Issue 42: the bench report says what it measured (drafter, target, SGLang version, prompts,
concurrency, rounds), gives a one-line verdict in words, says why an empty cell is empty, and draws
each host with its own colour, dash pattern, marker and direct label. Pure; the browser renders it in
tests/unit/test_bench_report_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deploy.base.errors import DeployError
from deploy.render import bench_report
from tests.unit.test_bench_datasets import FakeHost, FakeReport, Step

REPO = Path(__file__).resolve().parents[2]
LOAD = {"num_prompts": 64, "max_concurrency": 8, "output_len": 512, "input_len": 1024, "rounds": 1,
        "dataset": "builtin"}


def report(host: str, tokens: int, tok_s: float, accept: float = 2.5, ok: bool = True, rounds: int = 1,
           sglang: str | None = "0.5.23") -> FakeReport:
    data = {"accept_length": accept, "output_tok_s": tok_s, "mean_itl_ms": 9.0 + tokens, "p99_itl_ms": 20.0 + tokens,
            "mean_ttft_ms": 300.0, "p99_ttft_ms": None, "dataset": "builtin", "dataset_sha256": "a" * 64,
            "output_tok_s_rounds": [tok_s] * rounds,
            "settings": {"num_prompts": 64, "max_concurrency": 8, "output_len": 512}}
    return FakeReport(FakeHost(host), error=None if ok else DeployError("server died while loading"),
                      facts={"sglang_version": sglang} if sglang else {},
                      steps=[Step("benchmark", "ok" if ok else "failed", data if ok else {})])


def overlapping_rounds():
    """Three hosts at draft tokens 4 (configured), 3 and 8: h200-a and h200-b measure exactly the same
    (their lines coincide), h200-c's round at 3 fails."""
    return [(4, [report("h200-a", 4, 800.0, 2.6), report("h200-b", 4, 800.0, 2.6), report("h200-c", 4, 700.0)]),
            (3, [report("h200-a", 3, 1680.0, 2.9), report("h200-b", 3, 1680.0, 2.9),
                 report("h200-c", 3, 0.0, ok=False)]),
            (8, [report("h200-a", 8, 600.0, 3.4), report("h200-b", 8, 600.0, 3.4), report("h200-c", 8, 650.0, 3.3)])]


def overlapping_doc() -> dict:
    rows = bench_report.rows(overlapping_rounds())
    return bench_report.document("kimi-k25-eagle3", 4, rows, [{"host": "h200-a", "serves": "the configured deployment"}],
                                 drafter="/data/drafters/kimi-k25-eagle3-5ep", target="/data/models/Kimi-K2.5",
                                 load=LOAD)


def test_the_document_says_what_was_measured():
    doc = overlapping_doc()
    assert doc["drafter"] == "/data/drafters/kimi-k25-eagle3-5ep" and doc["target"] == "/data/models/Kimi-K2.5"
    assert doc["sglang_versions"] == {"h200-a": "0.5.23", "h200-b": "0.5.23", "h200-c": "0.5.23"}
    # input_len applies to random ids only: not named for the builtin prompts
    assert doc["load"] == {"num_prompts": 64, "max_concurrency": 8, "output_len": 512, "input_len": None, "rounds": 1}
    json.dumps(doc)  # the report's JSON file


def test_without_the_playbooks_load_the_rows_say_it():
    rows = bench_report.rows([(16, [report("a", 16, 900.0, rounds=3)])])
    assert bench_report.document("r", 16, rows, [])["load"] == {
        "num_prompts": 64, "max_concurrency": 8, "output_len": 512, "input_len": None, "rounds": 3}


@pytest.mark.parametrize("rounds, configured, expected", [
    (overlapping_rounds(), 4,
     "3 draft tokens gave 2.1x the throughput of the configured 4 on h200-a and h200-b (1680 vs 800 output tok/s); "
     "the configured 4 draft tokens gave the most throughput on h200-c (one round each: no interval)."),
    ([(16, [report("a", 16, 900.0, rounds=3)]), (10, [report("a", 10, 1000.0, rounds=3)])], 16,
     "10 draft tokens gave 1.1x the throughput of the configured 16 on a (1000 vs 900 output tok/s)."),
    ([(16, [report("a", 16, 0.0, ok=False)]), (10, [report("a", 10, 1000.0)])], 16,
     "10 draft tokens gave the most throughput on a (1000 output tok/s; the configured 16 failed) "
     "(one round each: no interval)."),
    ([(10, [report("a", 10, 1000.0)])], 16,
     "10 draft tokens gave the most throughput on a (1000 output tok/s; the configured 16 was not in the sweep) "
     "(one round each: no interval)."),
    ([(16, [report("a", 16, 0.0, ok=False)])], 16, "Nothing was measured on a."),
    ([], 16, "Nothing was measured."),
])
def test_the_verdict_is_one_line_in_words(rounds, configured, expected):
    line = bench_report.verdict(bench_report.rows(rounds), configured)
    assert line == expected and "\n" not in line


def test_the_page_opens_with_the_verdict_then_what_was_measured():
    page = bench_report.render_html(overlapping_doc())
    body = page.split("<body>", 1)[1]
    assert re.match(r"<h1>[^<]*</h1><p class='verdict'>3 draft tokens gave 2.1x the throughput", body)
    measured = dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", page))
    assert measured["drafter"] == "/data/drafters/kimi-k25-eagle3-5ep"
    assert measured["target"] == "/data/models/Kimi-K2.5" and measured["SGLang"] == "0.5.23"
    assert measured["prompts"].startswith("64 from builtin") and measured["concurrency"] == "8"
    assert measured["rounds"].startswith("1 per draft-token value")
    assert measured["draft tokens"] == "4 (configured), 3, 8"


def test_an_old_report_without_the_new_fields_says_they_were_not_recorded():
    doc = bench_report.document("r", 16, bench_report.rows([(16, [report("a", 16, 900.0, sglang=None)])]), [])
    measured = dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", bench_report.render_html(doc)))
    assert measured["drafter"] == measured["target"] == "- (not recorded in this report)"
    assert measured["SGLang"] == "- (not read: no host reached the doctor)"


def test_every_empty_cell_says_why():
    page = bench_report.render_html(overlapping_doc())
    rows = re.findall(r"<tr class='[a-z]*'>(.*?)</tr>", page)
    for row in rows:
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row):
            assert cell.strip() not in ("-", ""), row  # a bare '-' never
    assert page.count("1 round: no interval") == 8  # every measured row: one round, no interval to show
    assert page.count("<span class='why'>not reported</span>") == 8  # p99 TTFT: bench_serving gave none
    assert page.count("<span class='why'>not gated</span>") == 8
    assert page.count("round failed: nothing measured") == 1 and "server died while loading" in page


def test_each_host_has_its_own_colour_dashes_and_marker():
    styles = [bench_report.host_style(i) for i in range(len(bench_report.COLOURS))]
    assert len({c for c, _, _ in styles}) == len({d for _, d, _ in styles}) == len({m for _, _, m in styles}) == 8
    svg = bench_report.chart_svg("output_tok_s", "output tok/s", bench_report.rows(overlapping_rounds()))
    groups = re.findall(r'<g class="host" data-host="([^"]+)">(.*?)</g></g>(?=<g class="host"|<line)', svg)
    assert [h for h, _ in groups] == ["h200-a", "h200-b", "h200-c"]
    lines = [re.search(r'<polyline [^>]*stroke="(#[0-9A-Fa-f]{6})"[^>]*?(?: stroke-dasharray="([^"]+)")?/>', g).groups()
             for _, g in groups]
    assert len(set(lines)) == 3 and lines[0] == (bench_report.COLOURS[0], None)  # the first solid, the others dashed
    labels = re.findall(r'<text class="direct-label"[^>]*fill="([^"]+)"[^>]*>([^<]+)</text>', svg)
    assert sorted(labels) == sorted(zip(bench_report.COLOURS[:3], ["h200-a", "h200-b", "h200-c"]))


def test_coinciding_points_are_drawn_side_by_side_and_labels_apart():
    offsets = bench_report._dodge([("a", 100.0, 50.0), ("b", 100.0, 51.0), ("c", 100.0, 90.0)])
    assert offsets[("a", 100.0)] == -offsets[("b", 100.0)] != 0 and offsets[("c", 100.0)] == 0
    heights = bench_report.spread_labels([50.0, 50.0, 51.0], 30.0, 200.0)
    assert all(abs(x - y) >= 13.0 for i, x in enumerate(heights) for y in heights[i + 1:])
    assert bench_report.spread_labels([199.0, 199.0], 30.0, 200.0)[1] <= 200.0


def test_bench_hands_the_report_its_run_and_load(monkeypatch, capsys):
    """The CLI (deploy/cli/bench.py) gives the report the run's drafter and target and the benchmark
    step's load (deploy/verbs/bench_sweep.py benchmark_load), the sweep itself faked."""
    from deploy.cli.main import main
    from deploy.verbs import bench_sweep

    def sweep(run_round, playbook, configured, runs, hosts, progress):
        result = bench_sweep.SweepResult()
        result.rounds = [(configured.draft_tokens, [report(hosts[0].name, configured.draft_tokens, 900.0)])]
        return result

    monkeypatch.setattr(bench_sweep, "sweep", sweep)
    config = REPO / "configs" / "kimi-k25-eagle3.yaml"
    assert main(["-c", str(config), "bench", "--json", "--max-concurrency", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    saved = json.loads(Path(doc["report_json"]).read_text())
    assert saved["drafter"] == "/data/drafters/kimi-k25-eagle3-5ep" and saved["target"] == "/data/models/Kimi-K2.5"
    assert saved["load"]["max_concurrency"] == 4 and saved["load"]["num_prompts"] == 64
    assert saved["verdict"].startswith("The configured 16 draft tokens gave the most throughput on kimi-a")
