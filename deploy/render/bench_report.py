"""The sweep report of ``deployctl bench``: one JSON document and one self-contained HTML page.

Per host and draft-token value: accept length, output tok/s, mean and p99 inter-token latency and
time to first token, the best value per host (highest output tok/s) marked. The page says first
what was measured (drafter, target, SGLang version, prompts, concurrency, rounds) and a one-line
verdict in words; an empty cell says why it is empty. The page draws its charts as inline SVG made
here (no script, no network, no plotting library), so it opens from the state directory anywhere,
years later. Each host has its own colour, dash pattern and marker, and its name at the end of its
line: two hosts whose lines coincide stay told apart. Written to ``$XDG_STATE_HOME/deployctl/bench/``
as ``report-<time>.json`` and ``report-<time>.html``. Pure except ``write``.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deploy.base.secrets import mask_secrets
from deploy.local.state import ensure_directory, replace_file, state_home

METRICS = (("output_tok_s", "output tok/s", ".1f"), ("accept_length", "accept length", ".2f"),
           ("mean_itl_ms", "mean ITL ms", ".2f"), ("p99_itl_ms", "p99 ITL ms", ".2f"),
           ("mean_ttft_ms", "mean TTFT ms", ".1f"), ("p99_ttft_ms", "p99 TTFT ms", ".1f"))
#: charted, in this order (TTFT is in the table: it barely depends on the draft tokens)
CHARTS = ("output_tok_s", "accept_length", "mean_itl_ms", "p99_itl_ms")
#: per host, in sorted host order: Okabe and Ito's colour-blind-safe palette (its yellow left out: unreadable
#: on white), a dash pattern and a marker each, so lines that overlap stay distinguishable without colour
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#8C564B")
DASHES = ("", "8 4", "2 3", "10 3 2 3", "5 2", "1 3", "12 3 3 3", "6 2 1 2 1 2")
MARKERS = ("circle", "square", "triangle", "diamond", "triangle-down", "cross", "plus", "bar")
#: the benchmark load the header names (benchmark step settings)
LOAD_KEYS = ("num_prompts", "max_concurrency", "output_len", "input_len", "rounds")


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
            row |= {"sglang_version": (report.facts or {}).get("sglang_version"), "settings": data.get("settings")}
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
             created: datetime | None = None, *, drafter: str | None = None, target: str | None = None,
             load: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report: what was measured (``drafter``, ``target``: the run's base model; ``load``: the
    benchmark step's settings), the rows, the one-line verdict, what serves now."""
    created = created or datetime.now(timezone.utc)
    datasets = sorted({(r["dataset"], r["dataset_sha256"]) for r in table if r.get("dataset")}, key=str)
    versions: dict[str, str] = {}
    for r in table:
        if r.get("sglang_version"):
            versions[r["host"]] = r["sglang_version"]
    return {"command": "bench", "run": run_name, "created": created.isoformat(timespec="seconds"),
            "configured_draft_tokens": configured_tokens,
            "drafter": drafter, "target": target, "sglang_versions": dict(sorted(versions.items())),
            "load": load_of(table, load),
            "datasets": [{"dataset": d, "dataset_sha256": s} for d, s in datasets],
            "verdict": verdict(table, configured_tokens),
            "rows": table, "serving": serving}


def load_of(table: list[dict[str, Any]], load: dict[str, Any] | None) -> dict[str, Any]:
    """The benchmark load: the playbook's settings where given, else what the measured rows ran with."""
    if load:
        given = {k: load.get(k) for k in LOAD_KEYS}
        if load.get("dataset") not in (None, "random-ids"):  # the input length applies to random ids only
            given["input_len"] = None
        return given
    found: dict[str, Any] = {k: None for k in LOAD_KEYS}
    for r in table:
        settings: dict[str, Any] = r["settings"] if isinstance(r.get("settings"), dict) else {}
        for key in LOAD_KEYS[:-1]:
            if found[key] is None and settings.get(key) is not None:
                found[key] = settings[key]
        rounds = r.get("output_tok_s_rounds")
        if found["rounds"] is None and isinstance(rounds, list) and rounds:
            found["rounds"] = len(rounds)
    return found


def _tok(row: dict[str, Any]) -> float | None:
    value = row.get("output_tok_s")
    return float(value) if row.get("ok") and isinstance(value, (int, float)) and not isinstance(value, bool) else None


def verdict(table: list[dict[str, Any]], configured: int) -> str:
    """One line in words: which draft tokens gave the most output tok/s against the configured value,
    hosts with the same finding named together."""
    findings: dict[str, list[str]] = {}  # the finding, "{hosts}" in place of the hosts' names -> hosts
    for host in sorted({r["host"] for r in table}):
        mine = [r for r in table if r["host"] == host]
        measured = [r for r in mine if _tok(r) is not None]
        if not measured:
            findings.setdefault("nothing was measured on {hosts}", []).append(host)
            continue
        best = next((r for r in measured if r["best"]), max(measured, key=lambda r: _tok(r) or 0.0))
        base = next((r for r in measured if r["draft_tokens"] == configured), None)
        best_tok = _tok(best) or 0.0
        if base is None:
            failed = any(r["draft_tokens"] == configured for r in mine)
            finding = (f"{best['draft_tokens']} draft tokens gave the most throughput on {{hosts}} ({best_tok:.0f} "
                       f"output tok/s; the configured {configured} {'failed' if failed else 'was not in the sweep'})")
        elif base is best:
            finding = f"the configured {configured} draft tokens gave the most throughput on {{hosts}}"
        else:
            base_tok = _tok(base) or 0.0
            ratio = f"{best_tok / base_tok:.1f}x the" if base_tok > 0 else "more"
            finding = (f"{best['draft_tokens']} draft tokens gave {ratio} throughput of the configured {configured} "
                       f"on {{hosts}} ({best_tok:.0f} vs {base_tok:.0f} output tok/s)")
        findings.setdefault(finding, []).append(host)
    if not findings:
        return "Nothing was measured."
    line = "; ".join(f.replace("{hosts}", _names(hosts)) for f, hosts in findings.items())
    rounds = {len(r["output_tok_s_rounds"]) for r in table if isinstance(r.get("output_tok_s_rounds"), list)}
    note = " (one round each: no interval)" if rounds == {1} else ""
    return line[0].upper() + line[1:] + note + "."


def _names(hosts: list[str]) -> str:
    return hosts[0] if len(hosts) == 1 else ", ".join(hosts[:-1]) + " and " + hosts[-1]


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def rounds_cell(rounds: Any) -> str:
    """``n rounds, min-max`` of a row's throughput rounds (the median is the output tok/s column)."""
    if not isinstance(rounds, list) or not rounds or not all(isinstance(x, (int, float)) for x in rounds):
        return "-"
    return "1 round: no interval" if len(rounds) == 1 else f"{len(rounds)} rounds, {min(rounds):.1f}-{max(rounds):.1f}"


def gate_cell(gate: Any) -> str:
    """The throughput gate's verdict, ratio and 95% interval against the floor; '-' where none judged."""
    if not isinstance(gate, dict) or not isinstance(gate.get("ratio"), (int, float)):
        return "-"
    interval = (f" [{gate['low']:.1%}, {gate['high']:.1%}]" if isinstance(gate.get("low"), (int, float))
                and isinstance(gate.get("high"), (int, float)) else " [no interval]")
    floor = f", minimum {gate['floor']:.0%}" if isinstance(gate.get("floor"), (int, float)) else ""
    return f"{str(gate.get('outcome', '?')).upper()} {gate['ratio']:.1%}{interval}{floor}"


#: why a cell is empty: (the few words shown next to its "-", the whole reason in its tooltip)
EMPTY = {"failed": ("round failed", "this round failed (its result column says why): nothing was measured"),
         "output_tok_s_rounds": ("not measured", "no throughput round was recorded for this row"),
         "throughput_gate": ("not gated", "the playbook has no regression-gate step: bench compares, nightly gates"),
         "metric": ("not reported", "bench_serving did not report this figure for the round")}


def empty_reason(row: dict[str, Any], column: str) -> tuple[str, str]:
    """Why ``column`` of ``row`` has no value: (short, long)."""
    if not row.get("ok"):
        return EMPTY["failed"]
    return EMPTY.get(column, EMPTY["metric"])


def axes(left: float, top: float, plot_w: float, plot_h: float, y_ticks: list[float], sy) -> list[str]:
    """A chart's two axes and its horizontal grid with the y labels (the bench and canary charts)."""
    parts = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>']
    for y in y_ticks:
        parts.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + plot_w}" y2="{sy(y):.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11">{y:g}</text>')
    return parts


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


def host_style(index: int) -> tuple[str, str, str]:
    """(colour, dash pattern, marker) of the host at ``index`` in sorted host order."""
    return COLOURS[index % len(COLOURS)], DASHES[index % len(DASHES)], MARKERS[index % len(MARKERS)]


def marker_svg(kind: str, x: float, y: float, colour: str, size: float = 4.5) -> str:
    """A filled marker with a white rim (a marker drawn over another's stays visible at its edge)."""
    rim = 'stroke="#ffffff" stroke-width="1"'
    if kind == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size:.1f}" fill="{colour}" {rim}/>'
    if kind == "square":
        return (f'<rect x="{x - size:.1f}" y="{y - size:.1f}" width="{2 * size:.1f}" height="{2 * size:.1f}" '
                f'fill="{colour}" {rim}/>')
    shapes = {"triangle": [(0, -1.25), (1.1, 0.8), (-1.1, 0.8)], "triangle-down": [(0, 1.25), (1.1, -0.8), (-1.1, -0.8)],
              "diamond": [(0, -1.3), (1.1, 0), (0, 1.3), (-1.1, 0)]}
    if kind in shapes:
        points = " ".join(f"{x + dx * size:.1f},{y + dy * size:.1f}" for dx, dy in shapes[kind])
        return f'<polygon points="{points}" fill="{colour}" {rim}/>'
    lines: dict[str, list[tuple[float, float, float, float]]] = {
        "cross": [(-1, -1, 1, 1), (-1, 1, 1, -1)], "plus": [(-1.2, 0, 1.2, 0), (0, -1.2, 0, 1.2)],
        "bar": [(-1.3, 0, 1.3, 0)]}
    strokes = lines[kind]
    return "".join(f'<line x1="{x + a * size:.1f}" y1="{y + b * size:.1f}" x2="{x + c * size:.1f}" '
                   f'y2="{y + d * size:.1f}" stroke="{colour}" stroke-width="2.5"/>' for a, b, c, d in strokes)


def spread_labels(wanted: list[float], low: float, high: float, gap: float = 13.0) -> list[float]:
    """Label heights near ``wanted`` (same order), at least ``gap`` apart, within [low, high]."""
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed = [0.0] * len(wanted)
    previous = low - gap
    for i in order:
        placed[i] = max(wanted[i], previous + gap)
        previous = placed[i]
    overflow = previous - high
    if overflow > 0:  # pushed past the bottom: shift the stack up as a whole
        placed = [max(low, y - overflow) for y in placed]
    return placed


def _dodge(points: list[tuple[str, float, float]], apart: float = 8.0) -> dict[tuple[str, float], float]:
    """Horizontal offsets of markers that would hide each other (same x, y within 4 px): side by side,
    centred on the point, so every host's marker stays visible where the lines meet."""
    groups: dict[tuple[float, int], list[str]] = {}
    for host, x, y in sorted(points, key=lambda p: (p[1], p[2])):
        near = next((k for k in groups if k[0] == x and abs(k[1] - y) <= 4), None)
        groups.setdefault(near or (x, round(y)), []).append(host)
    return {(host, key[0]): (i - (len(hosts) - 1) / 2) * apart
            for key, hosts in groups.items() for i, host in enumerate(sorted(hosts))}


def chart_svg(key: str, label: str, table: list[dict[str, Any]], width: int = 460, height: int = 290) -> str:
    """One line chart: ``key`` against draft tokens, one line per host (its colour, dashes and
    marker, its name at the line's end), the best value ringed."""
    hosts = sorted({r["host"] for r in table})
    points = [(r["host"], r["draft_tokens"], float(r[key]), r["best"]) for r in table
              if r["ok"] and isinstance(r.get(key), (int, float))]
    left, right, top, bottom = 64, 104, 34, 70
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" data-metric="{html.escape(key)}" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{html.escape(label)} against draft tokens">',
             f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
             f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="14" font-weight="bold">'
             f'{html.escape(label)} by draft tokens</text>']
    if not points:
        parts.append(f'<text x="{width / 2:.0f}" y="{height / 2:.0f}" text-anchor="middle" font-size="12">'
                     'not measured: every round failed</text></svg>')
        return "".join(parts)
    xs = sorted({p[1] for p in points} | {r["draft_tokens"] for r in table})
    ys = [p[2] for p in points]
    y_ticks = _ticks(min(0.0, min(ys)), max(ys) * 1.08 if max(ys) > 0 else 1.0)
    y_low, y_high = y_ticks[0], y_ticks[-1]

    def sx(x: float) -> float:
        return left + (plot_w / 2 if len(xs) == 1 else (x - xs[0]) / (xs[-1] - xs[0]) * plot_w)

    def sy(y: float) -> float:
        return top + plot_h - (y - y_low) / ((y_high - y_low) or 1.0) * plot_h

    parts += axes(left, top, plot_w, plot_h, y_ticks, sy)
    for x in xs:
        parts.append(f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" text-anchor="middle" font-size="11">{x}</text>')
    parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 32}" text-anchor="middle" font-size="12">'
                 'draft tokens</text>')
    dodge = _dodge([(p[0], sx(p[1]), sy(p[2])) for p in points])
    ends: list[tuple[str, str, float, float]] = []  # (host, colour, x, y) of each line's last point
    for index, host in enumerate(hosts):
        colour, dashes, marker = host_style(index)
        mine = sorted((p for p in points if p[0] == host), key=lambda p: p[1])
        dash = f' stroke-dasharray="{dashes}"' if dashes else ""
        group = [f'<g class="host" data-host="{html.escape(host)}">']
        if len(mine) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for _, x, y, _ in mine)
            group.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for _, x, y, best in mine:
            group.append(f'<g>{marker_svg(marker, sx(x) + dodge.get((host, sx(x)), 0.0), sy(y), colour)}'
                         f'<title>{html.escape(host)}: T={x}, {html.escape(label)} {y:g}</title></g>')
            if best:
                group.append(f'<circle class="best" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="9" fill="none" '
                             f'stroke="{colour}" stroke-width="2"/>')
        group.append("</g>")
        parts.extend(group)
        if mine:
            ends.append((host, colour, sx(mine[-1][1]), sy(mine[-1][2])))
        # the legend under the axis, never over the data: up to 3 hosts a line, with the line's dashes and marker
        lx, ly = left + (index % 3) * ((plot_w + right - 8) // 3), top + plot_h + 44 + (index // 3) * 14
        parts.append(f'<line x1="{lx}" y1="{ly + 5}" x2="{lx + 22}" y2="{ly + 5}" stroke="{colour}" stroke-width="2"'
                     f'{dash}/>{marker_svg(marker, lx + 11, ly + 5, colour, 3.5)}'
                     f'<text class="legend" x="{lx + 26}" y="{ly + 9}" font-size="11">{html.escape(host[:20])}</text>')
    # direct labels: each host's name at its line's end, spread apart where the lines end together
    heights = spread_labels([y for _, _, _, y in ends], top + 4, top + plot_h)
    for (host, colour, x, y), label_y in zip(ends, heights):
        lx = left + plot_w + 14
        parts.append(f'<line x1="{x + 6:.1f}" y1="{y:.1f}" x2="{lx - 2}" y2="{label_y:.1f}" stroke="{colour}" '
                     f'stroke-width="1"/><text class="direct-label" x="{lx}" y="{label_y + 4:.1f}" font-size="11" '
                     f'fill="{colour}" font-weight="bold">{html.escape(host[:14])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _cell(row: dict[str, Any], column: str, text: str, numeric: bool = True) -> str:
    kind = "num" if numeric else "text"
    if text != "-":
        return f"<td class='{kind}'>{html.escape(text)}</td>"
    short, why = empty_reason(row, column)
    return f"<td class='{kind} empty' title='{html.escape(why)}'>- <span class='why'>{html.escape(short)}</span></td>"


def _measured_list(doc: dict[str, Any]) -> str:
    """The header's "what was measured" lines, each missing field said as such."""
    load = doc.get("load") or {}
    versions = doc.get("sglang_versions") or {}
    if not versions:
        sglang = "- (not read: no host reached the doctor)"
    elif len(set(versions.values())) == 1:
        sglang = next(iter(versions.values()))
    else:
        sglang = ", ".join(f"{v} on {h}" for h, v in versions.items())
    datasets = ", ".join(f"{d['dataset']} (sha256 {(d['dataset_sha256'] or '-')[:16]})" for d in doc["datasets"]) or "-"
    sizes = ", ".join(f"{name} {load[key]}" for key, name in (("input_len", "input"), ("output_len", "output"))
                      if load.get(key) is not None)

    def value(v: Any, missing: str = "- (not recorded in this report)") -> str:
        return str(v) if v not in (None, "") else missing

    rounds = load.get("rounds")
    items = [("drafter", value(doc.get("drafter"))), ("target", value(doc.get("target"))), ("SGLang", sglang),
             ("prompts", f"{value(load.get('num_prompts'))} from {datasets}" + (f" ({sizes} tokens)" if sizes else "")),
             ("concurrency", value(load.get("max_concurrency"))),
             ("rounds", value(rounds) + (" per draft-token value (each figure is their median)" if rounds else "")),
             ("draft tokens", ", ".join(str(t) + (" (configured)" if t == doc["configured_draft_tokens"] else "")
                                       for t in dict.fromkeys(r["draft_tokens"] for r in doc["rows"]))
              or f"- (no round ran; configured {doc['configured_draft_tokens']})")]
    return "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items)


def render_html(doc: dict[str, Any]) -> str:
    table = doc["rows"]
    title = f"deployctl bench: run {doc['run']}, {doc['created']}"
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in METRICS)
    body = []
    for r in table:
        if r["ok"]:
            cells = "".join(_cell(r, key, _fmt(r.get(key), spec)) for key, _, spec in METRICS) + \
                _cell(r, "output_tok_s_rounds", rounds_cell(r.get("output_tok_s_rounds")), False) + \
                _cell(r, "throughput_gate", gate_cell(r.get("throughput_gate")), False)
        else:  # one cell for the round's every figure: nothing was measured, the result column says why
            short, why = EMPTY["failed"]
            cells = (f"<td class='text empty' colspan='{len(METRICS) + 2}' title='{html.escape(why)}'>- "
                     f"<span class='why'>{html.escape(short)}: nothing measured</span></td>")
        mark = " ★ best" if r["best"] else ""
        configured = " (configured)" if r["draft_tokens"] == doc["configured_draft_tokens"] else ""
        result = "ok" if r["ok"] else html.escape(r.get("error") or "failed")
        body.append(f"<tr class='{'best' if r['best'] else ''}'><td class='host'>{html.escape(r['host'])}</td>"
                    f"<td class='num'>{r['draft_tokens']}{configured}{mark}</td>{cells}<td>{result}</td></tr>")
    serving = "".join(f"<li><b>{html.escape(s['host'])}</b>: {html.escape(s['serves'])}</li>" for s in doc["serving"])
    charts = "".join(chart_svg(key, label, table) for key, label, _ in METRICS if key in CHARTS)
    line = doc.get("verdict") or verdict(table, doc["configured_draft_tokens"])
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:12px 0}"
            "td,th{border:1px solid #ccc;padding:4px 8px}td.num{text-align:right}tr.best{background:#fff4c2}"
            ".charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{border:1px solid #ddd}"
            "p.verdict{font-size:1.15em;font-weight:bold;border-left:4px solid #555;padding:4px 10px}"
            "dl.measured{display:grid;grid-template-columns:max-content auto;gap:2px 14px;margin:8px 0}"
            "dl.measured dt{font-weight:bold}dl.measured dd{margin:0}span.why{color:#777;font-size:0.85em}"
            "td.host{white-space:nowrap}"
            "</style></head><body>"
            f"<h1>{html.escape(title)}</h1>"
            f"<p class='verdict'>{html.escape(line)}</p>"
            f"<dl class='measured'>{_measured_list(doc)}</dl>"
            "<p>Best value per host: highest output tok/s (★, ringed in the charts); each figure is the median of "
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
    doc = mask_secrets(doc)  # SGLang's API keys never reach a report file (issue 38)
    # the one local write (never through a link planted under the name: issue 44)
    replace_file(json_path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"), "the bench report")
    replace_file(html_path, render_html(doc).encode("utf-8"), "the bench report")
    return json_path, html_path
