"""The sweep report opens in a real headless Chromium (Debian's ``chromium``) with its charts.

Two renders: ``--dump-dom`` (the DOM the browser built: the SVG charts, their lines and points,
the best value ringed) and ``--screenshot`` (a PNG that is not blank: the chart's pixels are
there). Offline: every network feature of Chromium is off, and the page needs none. Skipped, with
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
