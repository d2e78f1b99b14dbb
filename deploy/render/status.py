"""How ``deployctl status`` shows its readings: a rich table on a terminal (redrawn in place by
``--watch``), one plain line per host otherwise. Everything a host sent is printed with its
control characters escaped (``\\x1b`` as text), so a hostile record cannot move the cursor,
retitle the terminal or forge a line; cells are rich ``Text``, never markup."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from deploy.verbs.status import HostReading, RouterReading


def clean(value: object, limit: int = 200) -> str:
    """``value`` as text with control characters (C0, DEL, C1, bidi overrides) escaped, bounded."""
    from deploy.base.limits import has_control_chars

    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "..."
    return "".join(ch.encode("unicode_escape").decode("ascii") if has_control_chars(ch) else ch for ch in text)


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _pair(now: float | None, then: float | None, digits: int) -> str:
    if now is None and then is None:
        return "-"
    ratio = f" {now / then:.0%}" if now is not None and then else ""
    return f"{_num(now, digits)} / {_num(then, digits)}{ratio}"


def cells(r: HostReading) -> dict[str, str]:
    """One host's row, every value already cleaned."""
    row = {"host": clean(r.host.name), "verdict": r.verdict.state}
    s = r.status
    if s is None:
        row["detail"] = clean(str(r.error).splitlines()[0] if r.error else "")
        return row
    good = s.last_good
    throughput_then = good.output_tok_s if good else None
    row |= {
        "pid": "-" if s.pid is None else str(s.pid),
        "up": _uptime(s.uptime_s) if s.alive else "down",
        "accept": _pair(s.live.accept_length, good.accept_length if good else None, 2),
        "tok/s": _pair(s.live.output_tok_s, throughput_then, 1),
        "run/queue": f"{_count(s.live.running)}/{_count(s.live.queued)}",
        "drafter": clean((s.drafter_fingerprint or "-")[:12]),
        "T": "-" if s.draft_tokens is None else str(s.draft_tokens),
        "configured": {True: "yes", False: "no: " + clean(", ".join(r.differences), 60), None: "-"}[r.configured],
        "detail": clean("; ".join(r.verdict.regressions or r.verdict.lines[:1] or s.notes[:1]), 160),
    }
    if s.canary is not None:
        # a replica in its canary window serves a new drafter beside the others (fleet/canary.py)
        figures = ", ".join(f"{name} {ratio:.1%}" for ratio, name in ((s.canary.acceptance_ratio, "acceptance"),
                                                                       (s.canary.speed_ratio, "speed"))
                            if ratio is not None)
        row["detail"] = clean(f"CANARY in its live window, against {', '.join(s.canary.others) or '-'}"
                              + (f": {figures} of theirs" if figures else "")
                              + (f"; {row['detail']}" if row["detail"] else ""), 160)
    return row


def router_cells(router: RouterReading) -> dict[str, str]:
    """The run's router as one more row: the router host, its PID, up or down, its verdict and why."""
    return {"host": clean(f"router@{router.host}"), "verdict": router.state,
            "pid": "-" if router.pid is None else str(router.pid),
            "up": "down" if router.state in ("down", "unreachable", "error") else "yes",
            "run/queue": f"{sum(1 for w in router.workers if w.get('healthy'))} workers",
            "detail": clean("; ".join(router.lines), 160)}


COLUMNS = ("host", "pid", "up", "accept", "tok/s", "run/queue", "drafter", "T", "configured", "verdict", "detail")


#: the full table's width with typical values; a narrower terminal gets one block per host (at 80
#: columns the table split a PID across lines and, at 60, squeezed columns to 2 characters)
WIDE_COLUMNS = 120
STYLES = {"healthy": "green", "regression": "bold red", "not-serving": "red", "unreachable": "red",
          "error": "red", "unknown": "yellow", "down": "red", "not-answering": "red", "missing": "red"}


def _rows(readings: Sequence[HostReading], router: RouterReading | None) -> list[dict[str, str]]:
    return [cells(r) for r in readings] + ([router_cells(router)] if router is not None else [])


def table(readings: Sequence[HostReading], title: str, width: int | None = None, router: RouterReading | None = None):
    """The readings for a terminal ``width`` columns wide: a table, or per-host blocks when narrower
    than WIDE_COLUMNS (each field on its own line: ``accept  3.10 / 3.20 97%``); the run's router last."""
    from rich.table import Table
    from rich.text import Text

    if width is not None and width < WIDE_COLUMNS:
        return blocks(readings, title, router)
    grid = Table(title=Text(title), title_justify="left")
    for name in COLUMNS:
        grid.add_column(name, overflow="fold")
    for row in _rows(readings, router):
        grid.add_row(*(Text(row.get(c, ""), style=STYLES.get(row["verdict"], "") if c == "verdict" else "")
                       for c in COLUMNS))
    return grid


def blocks(readings: Sequence[HostReading], title: str, router: RouterReading | None = None):
    """One block per host: its name and verdict, then one ``field  value`` line per column."""
    from rich.table import Table
    from rich.text import Text

    grid = Table(title=Text(title), title_justify="left", show_header=False, box=None, padding=(0, 1))
    grid.add_column("field", no_wrap=True)
    grid.add_column("value", overflow="fold")
    for i, row in enumerate(_rows(readings, router)):
        if i:
            grid.add_row("", "")
        grid.add_row(Text(row["host"], style="bold"), Text(row["verdict"], style=STYLES.get(row["verdict"], "")))
        for name in COLUMNS[1:]:
            if name != "verdict" and row.get(name):
                grid.add_row(Text("  " + name), Text(row[name]))
    return grid


#: the watch's title line: a terminal of 80 columns shows it whole (issue 39: it was ~105 and clipped)
TITLE_WIDTH = 80


def title(run_name: str, gate, width: int = TITLE_WIDTH) -> str:
    """``run NAME, YYYY-MM-DD HH:MM:SS UTC; live / last good, min A% / T%`` in at most ``width`` columns: a
    long run name is shortened (with "...") before anything else is left out."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    tail = (f", {stamp}; live / last good, min {gate.min_accept_fraction:.0%} / "
            f"{gate.min_throughput_fraction:.0%}")
    name = clean(run_name, 400)
    room = max(width - len("run ") - len(tail), 8)
    if len(name) > room:
        name = name[:room - 3] + "..."
    text = f"run {name}{tail}"
    return text if len(text) <= width else text[:width - 3] + "..."


def plain_lines(readings: Sequence[HostReading], router: RouterReading | None = None) -> list[str]:
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    lines = []
    for row in _rows(readings, router):
        parts = [stamp, row["host"], row["verdict"]]
        parts += [f"{c}={row[c]}" for c in COLUMNS[1:-2] if c in row]
        if row.get("detail"):
            parts.append(f"- {row['detail']}")
        lines.append(" ".join(parts))
    return lines


def findings(readings: Sequence[HostReading], router: RouterReading | None = None) -> list[str]:
    """The lines ``--check`` prints on stderr: every host that is not healthy, with its figures; the
    run's router when it is not."""
    out = []
    for r in readings:
        if r.error is not None:
            out.append(f"{clean(r.host.name)}: {r.verdict.state}: {clean(str(r.error), 400)}")
        elif r.verdict.state == "regression":
            out.append(f"{clean(r.host.name)}: regression against the last good deployment "
                       f"(pid {r.status.pid if r.status else '?'}): {clean('; '.join(r.verdict.regressions), 400)}")
        elif r.verdict.state != "healthy":
            out.append(f"{clean(r.host.name)}: {r.verdict.state}: {clean('; '.join(r.verdict.lines), 400)}")
    if router is not None and router.state != "healthy":
        out.append(f"router on {clean(router.host)}: {router.state}: {clean('; '.join(router.lines), 400)}")
    return out
