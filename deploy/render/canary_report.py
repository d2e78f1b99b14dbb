"""The canary's HTML page (issue 43): its live figures against the other replicas', interval by
interval, as inline SVG charts (no script, no network, no plotting library, like the bench report),
the decision, its rule and why. Written to ``$XDG_STATE_HOME/deployctl/canary/report-<time>.html``
by ``restart``/``nightly`` when a canary window ran. Pure except ``write``.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deploy.host.records import CanaryWindow, SideFigures
from deploy.local.state import ensure_directory, replace_file, state_home
from deploy.render.bench_report import COLOURS, _ticks, axes

#: (key of an interval's side, label, how a value is shown): the per-token latency is charted as tokens/s
FIGURES = (("accept", "accept length", ".2f"), ("token_s", "output tokens/s per request (1 / per-token latency)", ".1f"))


def _value(side: SideFigures, key: str) -> float | None:
    value = getattr(side, key)
    if value is None or value <= 0:
        return None
    return 1.0 / value if key == "token_s" else float(value)


def chart_svg(canary: CanaryWindow, key: str, label: str, width: int = 620, height: int = 300) -> str:
    """One chart: the canary's and the others' ``key`` at each interval's end (seconds into the window)."""
    intervals = canary.intervals or []
    lines = {"canary " + ", ".join(canary.hosts): [(i.at, _value(i.canary, key))
                                                                for i in intervals],
             "others " + ", ".join(canary.others or []): [(i.at, _value(i.others, key))
                                                                 for i in intervals]}
    points = {name: [(x, y) for x, y in values if y is not None] for name, values in lines.items()}
    left, right, top, bottom = 64, 16, 34, 64
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-figure="{html.escape(key)}" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{html.escape(label)}: canary against the others">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
             f'{html.escape(label)}, canary against the others</text>']
    every = [p for values in points.values() for p in values]
    if not every:
        parts.append(f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" font-size="12">'
                     'not measured</text></svg>')
        return "".join(parts)
    xs, ys = [p[0] for p in every], [p[1] for p in every]
    y_ticks = _ticks(min(ys) * 0.95, max(ys) * 1.05)
    x_low, x_high = 0.0, max(xs) or 1.0
    y_low, y_high = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (x - x_low) / ((x_high - x_low) or 1.0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y_low) / ((y_high - y_low) or 1.0) * plot_h

    parts += axes(left, top, plot_w, plot_h, y_ticks, sy)
    for x in _ticks(x_low, x_high):
        parts.append(f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle" font-size="11">{x:g}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 32}" text-anchor="middle" font-size="12">'
                 'seconds into the window</text>')
    for index, (name, values) in enumerate(points.items()):
        colour = COLOURS[index % len(COLOURS)]
        if len(values) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
            parts.append(f'<polyline class="series" data-series="{index}" points="{path}" fill="none" '
                         f'stroke="{colour}" stroke-width="2"/>')
        for x, y in values:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}">'
                         f'<title>{html.escape(name)}: {x:g} s, {y:g}</title></circle>')
        lx, ly = left + index * (plot_w // 2), top + plot_h + 44
        parts.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="{ly + 9}" font-size="11">{html.escape(name[:60])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(canary: CanaryWindow, run_name: str, created: str) -> str:
    decision = canary.decision
    title = f"deployctl canary: run {run_name}, {created}"
    rows = "".join(
        f"<tr><td>{html.escape(c.figure)}</td><td class='num'>{_pct(c.ratio)}</td>"
        f"<td class='num'>[{_pct(c.low)}, {_pct(c.high)}]</td><td class='num'>{c.pairs}</td></tr>"
        for c in (decision.comparisons if decision is not None else []))
    charts = "".join(chart_svg(canary, key, label) for key, label, _ in FIGURES)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}"
            "td,th{border:1px solid #ccc;padding:4px 8px}td.num{text-align:right}"
            ".charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{border:1px solid #ddd}"
            "</style></head><body>"
            f"<h1>{html.escape(title)}</h1>"
            f"<p><b>{html.escape(canary.outcome.upper())}</b>"
            f"{' (' + html.escape(canary.action) + ')' if canary.action else ''}: "
            f"{html.escape(canary.why_decided)}</p>"
            f"<p>Canary {html.escape(', '.join(canary.hosts))} against "
            f"{html.escape(', '.join(canary.others or []) or '-')}, "
            f"{len(canary.intervals or [])} interval(s), {canary.seconds or 0:g} s.</p>"
            f"<div class='charts'>{charts}</div>"
            "<table><thead><tr><th>figure</th><th>canary / others</th><th>interval</th><th>paired intervals</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>"
            f"<p>Rule: {html.escape(decision.rule if decision is not None else '-')}</p>"
            "</body></html>\n")


def _pct(value: Any) -> str:
    return f"{value:.1%}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def write(canary: CanaryWindow, run_name: str, directory: Path | None = None) -> Path:
    """The page's path under ``$XDG_STATE_HOME/deployctl/canary/``; LocalStateError on failure."""
    directory = ensure_directory(directory or state_home() / "canary", "deployctl's canary report folder")
    now = datetime.now(timezone.utc)
    path = directory / f"report-{now.strftime('%Y%m%dT%H%M%S.%fZ')}.html"
    replace_file(path, render_html(canary, run_name, now.isoformat(timespec="seconds")).encode("utf-8"),
                 "the canary report")
    return path
