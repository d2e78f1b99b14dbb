"""The sweep report of ``deployctl bench``: one JSON document and one self-contained HTML page.

Per host and draft-token value: accept length, output tok/s, mean and p99 inter-token latency and
time to first token, the best value per host (highest output tok/s) marked. The page draws its
charts as inline SVG made here (no script, no network, no plotting library), so it opens from
the state directory anywhere, years later. Written to ``$XDG_STATE_HOME/deployctl/bench/``
as ``report-<time>.json`` and ``report-<time>.html``. Pure except ``write``.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deploy.local.state import ensure_directory, replace_file, state_home

METRICS = (("output_tok_s", "output tok/s", ".1f"), ("accept_length", "accept length", ".2f"),
           ("mean_itl_ms", "mean ITL ms", ".2f"), ("p99_itl_ms", "p99 ITL ms", ".2f"),
           ("mean_ttft_ms", "mean TTFT ms", ".1f"), ("p99_ttft_ms", "p99 TTFT ms", ".1f"))
#: charted, in this order (TTFT is in the table: it barely depends on the draft tokens)
CHARTS = ("output_tok_s", "accept_length", "mean_itl_ms", "p99_itl_ms")
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def rows(rounds) -> list[dict[str, Any]]:
    """``rounds``: [(draft tokens, [HostReport])] -> one row per host and value, best marked."""
    out: list[dict[str, Any]] = []
    for tokens, reports in rounds:
        for report in reports:
            step = next((s for s in report.steps if s.name == "benchmark"), None)
            data = step.data if step is not None and step.status == "ok" else {}
            row: dict[str, Any] = {"host": report.host.name, "draft_tokens": tokens, "ok": report.ok and bool(data)}
            row |= {key: data.get(key) for key, _, _ in METRICS}
            # the rounds behind the median (benchmark ``rounds``) and, where the playbook gates, the verdict
            row |= {"output_tok_s_rounds": data.get("output_tok_s_rounds"),
                    "throughput_gate": (report.facts or {}).get("throughput_gate")}
            row |= {"dataset": data.get("dataset"), "dataset_sha256": data.get("dataset_sha256"),
                    "error": str(report.error).splitlines()[0][:300] if report.error is not None else None,
                    "best": False}
            out.append(row)
    return mark_best(out)


def mark_best(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host, the measured row with the highest output tok/s (ties: fewer draft tokens) is best."""
    for host in {r["host"] for r in table}:
        measured = [r for r in table if r["host"] == host and r["ok"] and isinstance(r.get("output_tok_s"), (int, float))]
        if measured:
            max(measured, key=lambda r: (r["output_tok_s"], -r["draft_tokens"]))["best"] = True
    return table


def document(run_name: str, configured_tokens: int, table: list[dict[str, Any]], serving: list[dict[str, Any]],
             created: datetime | None = None) -> dict[str, Any]:
    created = created or datetime.now(timezone.utc)
    datasets = sorted({(r["dataset"], r["dataset_sha256"]) for r in table if r.get("dataset")}, key=str)
    return {"command": "bench", "run": run_name, "created": created.isoformat(timespec="seconds"),
            "configured_draft_tokens": configured_tokens,
            "datasets": [{"dataset": d, "dataset_sha256": s} for d, s in datasets],
            "rows": table, "serving": serving}


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def rounds_cell(rounds: Any) -> str:
    """``n rounds, min-max`` of a row's throughput rounds (the median is the output tok/s column)."""
    if not isinstance(rounds, list) or not rounds or not all(isinstance(x, (int, float)) for x in rounds):
        return "-"
    return "1 round" if len(rounds) == 1 else f"{len(rounds)} rounds, {min(rounds):.1f}-{max(rounds):.1f}"


def gate_cell(gate: Any) -> str:
    """The throughput gate's verdict, ratio and 95% interval against the floor; '-' where none judged."""
    if not isinstance(gate, dict) or not isinstance(gate.get("ratio"), (int, float)):
        return "-"
    interval = (f" [{gate['low']:.1%}, {gate['high']:.1%}]" if isinstance(gate.get("low"), (int, float))
                and isinstance(gate.get("high"), (int, float)) else " [no interval]")
    floor = f", minimum {gate['floor']:.0%}" if isinstance(gate.get("floor"), (int, float)) else ""
    return f"{str(gate.get('outcome', '?')).upper()} {gate['ratio']:.1%}{interval}{floor}"


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        high = low + 1.0
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 2.5, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int((high - first) / step) + 2) if first + i * step <= high + step * 0.999]


def chart_svg(key: str, label: str, table: list[dict[str, Any]], width: int = 460, height: int = 290) -> str:
    """One line chart: ``key`` against draft tokens, one line per host, the best value ringed."""
    hosts = sorted({r["host"] for r in table})
    points = [(r["host"], r["draft_tokens"], float(r[key]), r["best"]) for r in table
              if r["ok"] and isinstance(r.get(key), (int, float))]
    left, right, top, bottom = 64, 16, 34, 70
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-metric="{html.escape(key)}" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{html.escape(label)} against draft tokens">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
             f'{html.escape(label)} by draft tokens</text>']
    if not points:
        parts.append(f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" font-size="12">'
                     'not measured</text></svg>')
        return "".join(parts)
    xs = sorted({p[1] for p in points} | {r["draft_tokens"] for r in table})
    ys = [p[2] for p in points]
    y_ticks = _ticks(min(0.0, min(ys)), max(ys) * 1.08 if max(ys) > 0 else 1.0)
    y_low, y_high = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (plot_w / 2 if len(xs) == 1 else (x - xs[0]) / (xs[-1] - xs[0]) * plot_w)

    def sy(y: float) -> float:
        return top + plot_h - (y - y_low) / ((y_high - y_low) or 1.0) * plot_h

    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>')
    for y in y_ticks:
        parts.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + plot_w}" y2="{sy(y):.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11">{y:g}</text>')
    for x in xs:
        parts.append(f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle" font-size="11">{x}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 32}" text-anchor="middle" font-size="12">'
                 'draft tokens</text>')
    for index, host in enumerate(hosts):
        colour = COLOURS[index % len(COLOURS)]
        mine = sorted((p for p in points if p[0] == host), key=lambda p: p[1])
        if len(mine) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for _, x, y, _ in mine)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for _, x, y, best in mine:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{colour}">'
                         f'<title>{html.escape(host)}: T={x}, {html.escape(label)} {y:g}</title></circle>')
            if best:
                parts.append(f'<circle class="best" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="8" fill="none" '
                             f'stroke="{colour}" stroke-width="2"/>')
        # the legend under the axis, never over the data: up to 3 hosts a line
        lx, ly = left + (index % 3) * (plot_w // 3), top + plot_h + 44 + (index // 3) * 14
        parts.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="{ly + 9}" font-size="11">{html.escape(host[:24])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(doc: dict[str, Any]) -> str:
    table = doc["rows"]
    title = f"deployctl bench: run {doc['run']}, {doc['created']}"
    data_lines = ", ".join(f"{d['dataset']} (sha256 {d['dataset_sha256'] or '-'})" for d in doc["datasets"]) or "-"
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in METRICS)
    body = []
    for r in table:
        cells = "".join(f"<td class='num'>{_fmt(r.get(key), spec)}</td>" for key, _, spec in METRICS)
        mark = " ★ best" if r["best"] else ""
        configured = " (configured)" if r["draft_tokens"] == doc["configured_draft_tokens"] else ""
        result = "ok" if r["ok"] else html.escape(r.get("error") or "failed")
        body.append(f"<tr class='{'best' if r['best'] else ''}'><td>{html.escape(r['host'])}</td>"
                    f"<td class='num'>{r['draft_tokens']}{configured}{mark}</td>{cells}"
                    f"<td>{html.escape(rounds_cell(r.get('output_tok_s_rounds')))}</td>"
                    f"<td>{html.escape(gate_cell(r.get('throughput_gate')))}</td><td>{result}</td></tr>")
    serving = "".join(f"<li><b>{html.escape(s['host'])}</b>: {html.escape(s['serves'])}</li>" for s in doc["serving"])
    charts = "".join(chart_svg(key, label, table) for key, label, _ in METRICS if key in CHARTS)
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}"
            "td,th{border:1px solid #ccc;padding:4px 8px}td.num{text-align:right}tr.best{background:#fff4c2}"
            ".charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{border:1px solid #ddd}"
            "</style></head><body>"
            f"<h1>{html.escape(title)}</h1>"
            f"<p>Dataset: {html.escape(data_lines)}. Configured draft tokens: {doc['configured_draft_tokens']}. "
            "Best value per host: highest output tok/s (★, ringed in the charts); each figure is the median of "
            "the row's benchmark rounds. Throughput gate: regression only when the ratio is below the minimum "
            "and its whole 95% interval below 100%; otherwise inconclusive or pass.</p>"
            f"<div class='charts'>{charts}</div>"
            f"<table><thead><tr><th>host</th><th>draft tokens</th>{head}<th>tok/s rounds</th>"
            "<th>throughput gate (ratio, 95% interval)</th><th>result</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>"
            f"<h2>Serving when bench ended</h2><ul>{serving}</ul>"
            "</body></html>\n")


def write(doc: dict[str, Any], directory: Path | None = None) -> tuple[Path, Path]:
    """(JSON path, HTML path) under ``$XDG_STATE_HOME/deployctl/bench/``; LocalStateError on failure."""
    directory = ensure_directory(directory or state_home() / "bench", "deployctl's bench report folder")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    json_path, html_path = directory / f"report-{stamp}.json", directory / f"report-{stamp}.html"
    # the one local write (never through a link planted under the name: issue 44)
    replace_file(json_path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"), "the bench report")
    replace_file(html_path, render_html(doc).encode("utf-8"), "the bench report")
    return json_path, html_path
