"""The sweep report opens in a real headless Chromium (Debian's ``chromium``) with its charts.

Renders: ``--dump-dom`` (the DOM the browser built: the SVG charts, their lines and points,
the best value ringed; the verdict and what was measured at the top) and ``--screenshot`` (a PNG
that is not blank: the chart's pixels are there; two hosts whose lines coincide both stay visible). Offline: every network feature of Chromium is off, and the page needs none. Skipped, with
the reason, where Chromium is missing (tests/bootstrap.sh installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from deploy.render import bench_report
from tests.unit.test_bench_datasets import bench_report_rounds
from tests.unit.test_bench_report import overlapping_doc, overlapping_rounds

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tests/bootstrap.sh installs "
                                                          "the Debian package chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars"]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"HOME": str(tmp_path)})


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    rows = bench_report.rows(bench_report_rounds())
    doc = bench_report.document("kimi", 16, rows, [{"host": "gpu-a", "serves": "the configured deployment"}])
    return bench_report.write(doc, tmp_path_factory.mktemp("report"))[1]


def test_the_browser_builds_the_charts(page, tmp_path):
    result = chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = result.stdout
    assert result.returncode == 0 and "<svg" in dom, result.stderr[-2000:]
    charts = re.findall(r'<svg[^>]*class="chart"[^>]*data-metric="([a-z0-9_]+)"', dom)
    assert charts == list(bench_report.CHARTS)
    assert dom.count("<polyline") >= len(bench_report.CHARTS)  # gpu-a has three measured values per chart
    assert dom.count('<circle class="best"') == 2 * len(bench_report.CHARTS)  # one ring per host and chart
    assert dom.count('<tr class="best"') == 2
    assert "★ best" in dom and "gpu-&lt;b&gt;" in dom


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB/RGBA PNG, as Chromium writes it."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, idat, header = 8, b"", None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        chunk = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        position += 12 + length
    assert header is not None
    width, height, depth, colour = header[:4]
    assert depth == 8 and colour in (2, 6), header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytes(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = bytes(line)
    return width, height, rows


def test_the_screenshot_shows_the_chart(page, tmp_path):
    shot = tmp_path / "report.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,760", page.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 760)
    channels = len(rows[0]) // width
    colours = {tuple(row[i:i + 3]) for row in rows[::4] for i in range(0, len(row), channels * 4)}
    assert len(colours) > 20  # not a blank page: text, axes, lines
    # the first chart's line colour (bench_report.COLOURS[0], gpu-a) is drawn
    blue = tuple(int(bench_report.COLOURS[0][i:i + 2], 16) for i in (1, 3, 5))
    assert any(tuple(row[i:i + 3]) == blue for row in rows for i in range(0, len(row), channels)), "no chart line"
    keep = os.environ.get("DEPLOYCTL_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


@pytest.fixture(scope="module")
def overlap_page(tmp_path_factory) -> Path:
    """Issue 42's page: three hosts, two of them measuring exactly the same, one failed round."""
    return bench_report.write(overlapping_doc(), tmp_path_factory.mktemp("overlap"))[1]


def test_the_browser_shows_the_verdict_and_what_was_measured_first(overlap_page, tmp_path):
    result = chromium(tmp_path, "--dump-dom", overlap_page.as_uri())
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    body = dom.split("<body>", 1)[1]
    # the page's first words after its title: the verdict, then what was measured, then the charts
    assert re.match(r"\s*<h1>[^<]*</h1>\s*<p class=\"verdict\">3 draft tokens gave 2.1x the throughput of the "
                    r"configured 4 on h200-a and h200-b", body), body[:400]
    assert body.index('class="verdict"') < body.index('class="measured"') < body.index('class="charts"')
    measured = dict(re.findall(r"<dt>([^<]*)</dt><dd>([^<]*)</dd>", dom))
    assert {k: measured[k] for k in ("drafter", "target", "SGLang", "concurrency")} == {
        "drafter": "/data/drafters/kimi-k25-eagle3-5ep", "target": "/data/models/Kimi-K2.5", "SGLang": "0.5.23",
        "concurrency": "8"}
    assert measured["prompts"].startswith("64 from builtin") and measured["rounds"].startswith("1 per")
    # per chart: three host groups, three direct labels; every empty cell says why
    assert dom.count('<g class="host"') == 3 * len(bench_report.CHARTS)
    assert dom.count('class="direct-label"') == 3 * len(bench_report.CHARTS)
    assert "1 round: no interval" in dom and "round failed: nothing measured" in dom and "not gated" in dom


def test_two_hosts_whose_lines_coincide_both_stay_visible(tmp_path):
    """One chart alone on a page (its plot area at a known place): h200-a and h200-b measured the
    same, so h200-b's line lies on h200-a's. h200-a's colour must still show inside the plot (h200-b's
    dashes, the markers side by side), and each host's name at its line's end, in its colour."""
    svg = bench_report.chart_svg("output_tok_s", "output tok/s", bench_report.rows(overlapping_rounds()))
    page = tmp_path / "chart.html"
    page.write_text(f"<!DOCTYPE html><html><body style='margin:0'>{svg}</body></html>")
    shot = tmp_path / "chart.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=460,290", page.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    channels = len(rows[0]) // width

    def count(colour: str, x0: int, x1: int) -> int:
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        return sum(1 for row in rows[34:220] for x in range(x0, x1) if tuple(row[x * channels:x * channels + 3]) == rgb)

    plot = {c: count(c, 60, 356) for c in bench_report.COLOURS[:3]}
    labels = {c: count(c, 360, 460) for c in bench_report.COLOURS[:3]}
    assert all(n > 60 for n in plot.values()), plot  # the hidden one too
    assert all(n > 20 for n in labels.values()), labels
    keep = os.environ.get("DEPLOYCTL_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, Path(keep).with_name("chart-" + Path(keep).name))


def test_the_whole_page_screenshot(overlap_page, tmp_path):
    """The page as a reader sees it (DEPLOYCTL_KEEP_SCREENSHOT=FILE keeps it): not blank, the verdict
    block at the top (its dark border), every host's colour drawn."""
    shot = tmp_path / "page.png"
    result = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1000,1700", overlap_page.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, rows = _png_pixels(shot.read_bytes())
    channels = len(rows[0]) // width
    pixels = {tuple(row[i:i + 3]) for row in rows for i in range(0, len(row), channels)}
    assert all(tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) in pixels for c in bench_report.COLOURS[:3])
    border = (0x55, 0x55, 0x55)  # p.verdict's left border, above the charts
    assert any(tuple(row[x * channels:x * channels + 3]) == border for row in rows[90:220] for x in range(20, 34))
    keep = os.environ.get("DEPLOYCTL_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, Path(keep).with_name("page-" + Path(keep).name))
