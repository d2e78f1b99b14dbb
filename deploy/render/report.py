"""Rendering for humans (rich) and scripts (JSON). Deciding happens elsewhere.

Every text that came from a host or a local state file goes through deploy/base/terminal.py before it
reaches a terminal (control characters shown escaped) and into rich as plain Text, never markup;
JSON documents carry the raw text (json.dumps escapes it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO, cast

from deploy.base.errors import ExitCode
from deploy.facts.gpus import GpuRow
from deploy.engine.fanout import HostOutcome, exit_code
from deploy.base.secrets import mask_secrets
from deploy.base.terminal import safe_line, safe_text

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod

# rich is imported where a table is drawn, not here: ~30 ms of start-up that `--json` output never
# uses (gpu-status on 8 hosts is measured against plain OpenSSH: tests/benchmarks/bench_gpu_status.py).


def console(stream: TextIO | None = None) -> Console:
    from rich.console import Console

    return Console(file=stream or sys.stdout, highlight=False, soft_wrap=True)


#: how many documents print_json wrote to stdout in this process: deploy/cli/main.py prints an error
#: document for a failing ``--json`` verb only when the verb printed none (its own is the outcome)
stdout_documents = 0


def print_json(document: Any, stream: TextIO | None = None, *, one_line: bool = False) -> None:
    global stdout_documents
    out = stream or sys.stdout
    # every --json document: SGLang's API keys masked (a plan's argv, a reason, a recorded argv; issue 38)
    out.write(json.dumps(mask_secrets(document), indent=None if one_line else 2, sort_keys=False, default=str) + "\n")
    out.flush()
    if out is sys.stdout:
        stdout_documents += 1


def error_document(command: str, exit_code: int, message: str) -> dict:
    """What a ``--json`` verb prints when it ends before its own document: a config error, a usage
    error, a lock refusal, an interruption, an internal error (docs/exit-codes.md). One line: it
    may end ``status --watch --json``'s one document per line."""
    return {"command": command, "ok": False, "exit_code": int(exit_code), "error": message}


def _holders_text(row: GpuRow) -> str:
    if not row.holders:
        return "-"
    parts = []
    for app in row.holders:
        mem = f"{app.used_mib} MiB" if app.used_mib is not None else "? MiB"
        parts.append(f"{app.pid} {safe_line(app.process_name)} ({mem})")
    return "\n".join(parts)


def _reached_as(host, endpoint: dict | None) -> str:
    if endpoint is None or "hostname" not in endpoint:
        return f"{host.user}@{host.address}:{host.port}"
    via = "".join(f" via {j['alias']}" for j in endpoint["jumps"][-1:])
    return f"{endpoint['user']['value']}@{endpoint['hostname']['value']}:{endpoint['port']['value']}{via}"


def gpu_status_tables(outcomes: Sequence[HostOutcome[list[GpuRow]]], out: Console,
                      endpoints: dict | None = None) -> None:
    from rich.table import Table

    for outcome in outcomes:
        host = outcome.host
        title = f"{host.name}  {_reached_as(host, (endpoints or {}).get(host.name))}"
        if outcome.error is not None:
            code = int(outcome.error.exit_code)
            # a host that answered but whose nvidia-smi failed is not "unreachable": say which
            label = "UNREACHABLE" if code == ExitCode.CONNECTION else "GPU QUERY FAILED (host reachable)"
            out.print(f"[bold]{title}[/bold]  [red]{label}[/red] (exit {code})")
            out.print(f"  {safe_text(outcome.error)}", markup=False)
            continue
        rows = outcome.value or []
        busy = sum(1 for r in rows if r.used_mib > 0)
        table = Table(title=f"{title}  ({len(rows) - busy}/{len(rows)} free)", title_justify="left")
        table.add_column("GPU", justify="right")
        table.add_column("used / total MiB", justify="right")
        table.add_column("util", justify="right")
        table.add_column("held by (pid, process, memory)")
        from rich.text import Text

        for row in rows:
            style = "yellow" if row.used_mib > 0 else ""
            util = f"{row.utilization_pct}%" if row.utilization_pct is not None else "n/a"
            table.add_row(str(row.index), f"{row.used_mib} / {row.total_mib}", util, Text(_holders_text(row)), style=style)
        out.print(table)


def gpu_status_document(outcomes: Sequence[HostOutcome[list[GpuRow]]], endpoints: dict | None = None) -> dict:
    hosts = []
    for outcome in outcomes:
        entry: dict[str, Any] = {"host": outcome.host.name, "address": outcome.host.address, "ok": outcome.ok}
        if endpoints is not None:
            entry["ssh"] = endpoints[outcome.host.name]
        if outcome.error is not None:
            entry["error"] = str(outcome.error)
            entry["exit_code"] = int(outcome.error.exit_code)
            entry["reachable"] = outcome.error.exit_code != ExitCode.CONNECTION
        else:
            rows = outcome.value or []
            entry["exit_code"] = 0
            entry["gpus"] = [r.to_dict() for r in rows]
            entry["all_free"] = all(r.used_mib == 0 for r in rows)
        hosts.append(entry)
    return {"command": "gpu-status", "ok": all(o.ok for o in outcomes), "hosts": hosts}


_STATUS_STYLE = {"ok": "green", "skipped": "cyan", "failed": "red", "not-run": "dim", "disabled": "dim"}


def progress_printer(stream: TextIO | None = None):
    """Progress lines for people and cron logs alike: `[host] step: message`, to stderr."""
    import threading

    lock = threading.Lock()
    out = stream or sys.stderr

    def show(host: str, step: str, message: str) -> None:
        stamp = __import__("time").strftime("%H:%M:%S")
        with lock:
            out.write(f"{stamp} [{safe_line(host)}] {safe_line(step)}: {safe_text(message)}\n")
            out.flush()

    return show


def step_summary_tables(command: str, reports, out: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    for report in reports:
        host = report.host
        if getattr(report, "not_run", False):
            verdict = "[yellow]NOT RUN[/yellow]"
        else:
            verdict = "[green]OK[/green]" if report.ok else f"[red]FAILED (exit {int(report.error.exit_code)})[/red]"
        table = Table(title=f"{command} on {host.name} ({host.address}): {verdict}", title_justify="left")
        table.add_column("step")
        table.add_column("result")
        table.add_column("time", justify="right")
        table.add_column("detail", overflow="fold")
        for step in report.steps:
            style = _STATUS_STYLE.get(step.status, "")
            first_line = step.detail.splitlines()[0] if step.detail else ""
            table.add_row(step.name, f"[{style}]{step.status}[/{style}]" if style else step.status,
                          f"{step.duration_s:.1f}s", Text(safe_line(first_line[:300])))
        if report.rollback:
            for step in report.rollback:
                style = _STATUS_STYLE.get(step.status, "")
                first_line = step.detail.splitlines()[0] if step.detail else ""
                table.add_row(f"rollback/{step.name}", f"[{style}]{step.status}[/{style}]" if style else step.status,
                              f"{step.duration_s:.1f}s", Text(safe_line(first_line[:300])))
        out.print(table)
        for warning in report.warnings:
            out.print(f"warning: {safe_text(warning)}", markup=False, style="yellow")
        if report.error is not None:
            out.print(safe_text(report.error), markup=False, style="red")
        if report.left_running is not None:
            out.print(f"left running on {host.name}: {safe_text(report.left_running)}", markup=False)
        serving = getattr(report, "serving", None)
        if serving is not None and (report.error is not None or serving.state != "serving"):
            out.print(f"{host.name}: {safe_text(serving.headline())}", markup=False)


def report_document(command: str, run_name: str, reports) -> dict:
    return {"command": command, "run": run_name, "ok": all(r.ok for r in reports),
            "hosts": [r.to_dict() for r in reports]}


def plan_document(command: str, run_name: str, plans: dict, endpoints: dict | None = None) -> dict:
    return {
        "command": command,
        "run": run_name,
        "dry_run": True,
        "hosts": [
            {"host": host, **({"ssh": endpoints[host]} if endpoints is not None else {}),
             "steps": [{"step": name, "commands": [c.to_dict() for c in commands]} for name, commands in steps]}
            for host, steps in plans.items()
        ],
    }


def endpoint_lines(endpoint: dict) -> list[str]:
    """`deployctl plan`'s view of how a host is reached: each effective value and its source."""
    if "error" in endpoint:
        return [f"ssh: ERROR (exit {endpoint['exit_code']}): {safe_text(endpoint['error'])}"]

    def one(ep: dict) -> str:
        parts = []
        for key in ("hostname", "user", "port", "identity_files", "host_key_policy", "known_hosts",
                    "connect_timeout_s"):
            value = ep[key]["value"]
            if isinstance(value, list):
                value = ",".join(value) or "(agent / default keys)"
            parts.append(f"{key}={safe_line(value)} [{ep[key]['source']}]")
        return " ".join(parts)

    lines = [f"ssh: {one(endpoint)}"]
    for jump in endpoint["jumps"]:
        lines.append(f"  via jump host {safe_line(jump['alias'])}: {one(jump)}")
    return lines


def plan_text(command: str, plans: dict, out: Console, endpoints: dict | None = None) -> None:
    """Each host's plan as one rich Text, printed once: ~56 ``print`` calls per host cost 18 ms of
    deployctl's CPU per host (issue 37: `plan` grew 37 ms per extra host)."""
    from rich.text import Text

    for host, steps in plans.items():
        text = Text()
        text.append(f"{command} on {host}", style="bold")
        text.append(" (dry run: nothing is changed)\n")
        for line in endpoint_lines(endpoints[host]) if endpoints is not None else []:
            text.append(f"  {line}\n", style="dim")
        n = 0
        for name, commands in steps:
            text.append("  ")
            text.append(name, style="cyan")
            text.append("\n")
            for planned in commands:
                n += 1
                text.append(f"    {n}. {safe_text(planned.description)}\n")
                if planned.when:
                    text.append(f"       (only when {safe_text(planned.when)})\n")
                text.append(f"       {'$' if planned.kind != 'upload' else '>'} {safe_text(planned.shown)}\n",
                            style="dim")
        text.rstrip()
        out.print(text)


def _bench_rows(rounds):
    for tokens, reports in rounds:
        for report in reports:
            step = next((s for s in report.steps if s.name == "benchmark"), None)
            data = step.data if step is not None and step.status == "ok" else {}
            yield {"host": report.host.name, "draft_tokens": tokens, "ok": report.ok and bool(data),
                   "accept_length": data.get("accept_length"), "output_tok_s": data.get("output_tok_s"),
                   "mean_itl_ms": data.get("mean_itl_ms"), "p99_itl_ms": data.get("p99_itl_ms"),
                   "mean_ttft_ms": data.get("mean_ttft_ms"), "p99_ttft_ms": data.get("p99_ttft_ms"),
                   "dataset": data.get("dataset"), "dataset_sha256": data.get("dataset_sha256"),
                   "duration_s": data.get("duration_s"),
                   "error": str(report.error) if report.error is not None else None}


def bench_document(run_name: str, rounds) -> dict:
    return {"command": "bench", "run": run_name,
            "ok": all(r.ok for _, reports in rounds for r in reports),
            "results": list(_bench_rows(rounds)),
            "rounds": [{"draft_tokens": t, "hosts": [r.to_dict() for r in reports]} for t, reports in rounds]}


def bench_table(rounds, out: Console) -> None:
    from rich.markup import escape as rich_escape
    from rich.table import Table

    table = Table(title="bench: sglang.bench_serving per host and draft-token count", title_justify="left")
    for name, justify in (("host", "left"), ("draft tokens", "right"), ("accept length", "right"),
                          ("output tok/s", "right"), ("mean ITL ms", "right"), ("p99 ITL ms", "right"),
                          ("mean TTFT ms", "right"), ("dataset", "left"), ("result", "left")):
        table.add_column(name, justify=cast("JustifyMethod", justify))

    def fmt(value, spec):
        return format(value, spec) if isinstance(value, (int, float)) else "-"

    for row in _bench_rows(rounds):
        from rich.text import Text

        result = Text("ok", style="green") if row["ok"] else \
            Text(safe_line((row["error"] or "failed").splitlines()[0][:80]), style="red")
        table.add_row(row["host"], str(row["draft_tokens"]), fmt(row["accept_length"], ".2f"),
                      fmt(row["output_tok_s"], ".1f"), fmt(row["mean_itl_ms"], ".2f"), fmt(row["p99_itl_ms"], ".2f"),
                      fmt(row["mean_ttft_ms"], ".1f"), rich_escape(str(row["dataset"] or "-")), result)
    out.print(table)


def logs_document(run_name: str, outcomes: Sequence[HostOutcome[str]], log_path) -> dict:
    """``logs --json``: each host's log path and last lines, or its error. The lines are a server's
    log (and whatever its requests made it print): terminal sequences are stripped, as in a
    message quoting a log tail, so a script reads the words (json.dumps escapes any control left)."""
    from deploy.base.terminal import strip_escapes

    hosts = []
    for outcome in outcomes:
        entry: dict[str, Any] = {"host": outcome.host.name, "path": log_path(outcome.host), "ok": outcome.ok}
        if outcome.error is not None:
            entry |= {"exit_code": int(outcome.error.exit_code), "error": str(outcome.error)}
        else:
            entry |= {"exit_code": 0, "lines": strip_escapes(outcome.value or "").splitlines()}
        hosts.append(entry)
    return {"command": "logs", "run": run_name, "ok": all(o.ok for o in outcomes),
            "exit_code": int(exit_code(outcomes)), "hosts": hosts}


def doctor_document(results) -> dict:
    """``results``: [(host name, [check dicts])]; the shape `deployctl doctor --json` promises."""
    return {"hosts": [{"host": name, "ok": all(c["status"] != "fail" for c in checks), "checks": checks}
                      for name, checks in results]}


def doctor_tables(results, out: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    style = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    for name, checks in results:
        table = Table(title=name, title_justify="left")
        for column in ("check", "status", "reason", "fix"):
            table.add_column(column)
        for c in checks:
            # reasons quote host output and paths: plain Text, never rich markup
            table.add_row(c["name"], Text(c["status"], style=style[c["status"]]), Text(safe_text(c["reason"])),
                          Text(safe_text(c["fix"])))
        out.print(table)


def plain_report_lines(command: str, reports, stamp: str) -> list[str]:
    """One line per host (plus its error and what it left running): for cron mail and log files."""
    lines = []
    for report in reports:
        facts = report.facts or {}
        numbers = ", ".join(f"{k.replace('_', ' ')} {facts[k]:.2f}" for k in ("accept_length", "output_tok_s")
                            if isinstance(facts.get(k), (int, float)))
        code = int(report.error.exit_code) if report.error is not None else 0
        lines.append(f"{stamp} [{report.host.name}] {command}: {report.outcome} (exit {code})"
                     + (f", {numbers}" if numbers else ""))
        gate = facts.get("throughput_gate")
        if isinstance(gate, dict):
            lines.append(f"{stamp} [{report.host.name}] throughput gate: {gate_text(gate)}")
        canary = facts.get("canary")
        if isinstance(canary, dict):
            lines.append(f"{stamp} [{report.host.name}] canary: {canary_text(canary)}")
        for warning in report.warnings:
            lines.append(f"{stamp} [{report.host.name}] warning: {safe_line(warning)}")
        if report.error is not None:
            lines.extend(f"{stamp} [{report.host.name}]   {safe_line(line)}" for line in str(report.error).splitlines()[:60])
        if report.left_running is not None:
            lines.append(f"{stamp} [{report.host.name}] left running: {safe_line(report.left_running)}")
        serving = getattr(report, "serving", None)
        if serving is not None and (report.error is not None or serving.state != "serving"):
            lines.append(f"{stamp} [{report.host.name}] serving: {safe_line(serving.headline())}")
    return lines


def canary_text(canary: dict) -> str:
    """A canary host's live window in one line (fleet/canary.py's short form)."""
    def pct(value) -> str:
        return f"{value:.1%}" if isinstance(value, (int, float)) else "-"
    return safe_line(f"{canary.get('outcome')} after {canary.get('intervals')} interval(s) "
                     f"({canary.get('canary_requests') or 0:.0f} requests): acceptance {pct(canary.get('acceptance_ratio'))}, "
                     f"speed {pct(canary.get('speed_ratio'))} of {', '.join(canary.get('others') or []) or 'the others'}"
                     + (f"; {canary['cause']}" if canary.get("cause") else "")
                     + (f"; {canary['why']}" if canary.get("why") else ""))


def gate_text(gate: dict) -> str:
    """The throughput gate's verdict in one line: outcome, ratio, interval, floor, rounds."""
    def pct(value):
        return f"{value:.1%}" if isinstance(value, (int, float)) else "-"

    interval = f" [{pct(gate.get('low'))}, {pct(gate.get('high'))}]" if gate.get("low") is not None else " [no interval]"
    rounds = gate.get("rounds") or ["?", "?"]
    against = f" ({gate['against']})" if isinstance(gate.get("against"), str) else ""
    drift = f"; the host's speed {pct(gate['drift_ratio'])} of the bar's night" \
        if isinstance(gate.get("drift_ratio"), (int, float)) else ""
    return (f"{str(gate.get('outcome', '?')).upper()}: now/last good{against} {pct(gate.get('ratio'))}{interval}, "
            f"minimum {pct(gate.get('floor'))} ({rounds[0]} vs {rounds[1]} rounds; regression only when below the "
            f"minimum and the whole 95% interval is below 100%){drift}")


def _history_field(value, spec=""):
    """A history value for a terminal: a number formatted, text escaped (the file is anyone's to edit)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return format(value, spec)
        except (ValueError, OverflowError):
            return safe_line(value)
    if value is None:
        return "-"
    return safe_line(value if isinstance(value, str) else json.dumps(value, default=str))


def _gate(value) -> str | None:
    return value.get("outcome") if isinstance(value, dict) and isinstance(value.get("outcome"), str) else None


def _drafter(value) -> str | None:
    return value[:12] if isinstance(value, str) and value else None


def history_table(rows, out: Console) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title="deployctl history", title_justify="left")
    for name, justify in (("time", "left"), ("verb", "left"), ("run", "left"), ("host", "left"),
                          ("SGLang", "left"), ("drafter", "left"), ("T", "right"), ("accept", "right"),
                          ("tok/s", "right"), ("gate", "left"), ("outcome", "left"), ("exit", "right"), ("s", "right")):
        table.add_column(name, justify=cast("JustifyMethod", justify))

    def fmt(value, spec=""):
        return Text(_history_field(value, spec))  # a cell as str would be read as rich markup

    for row in rows:
        table.add_row(fmt(row.get("time")), fmt(row.get("verb")), fmt(row.get("run")), fmt(row.get("host")),
                      fmt(row.get("sglang_version")), fmt(_drafter(row.get("drafter_fingerprint"))),
                      fmt(row.get("draft_tokens")), fmt(row.get("accept_length"), ".2f"),
                      fmt(row.get("output_tok_s"), ".1f"), fmt(_gate(row.get("throughput_gate"))), fmt(row.get("outcome")),
                      fmt(row.get("exit_code")),
                      fmt(row.get("duration_s"), ".1f"))
    out.print(table)


def history_lines(rows) -> list[str]:
    """One plain line per record (for pipes, cron mail and grep): nothing is cut short."""
    fmt = _history_field
    return [" ".join([fmt(r.get("time")), fmt(r.get("verb")), f"run={fmt(r.get('run'))}", f"host={fmt(r.get('host'))}",
                      f"sglang={fmt(r.get('sglang_version'))}", f"drafter={fmt(_drafter(r.get('drafter_fingerprint')))}",
                      f"T={fmt(r.get('draft_tokens'))}", f"accept={fmt(r.get('accept_length'), '.2f')}",
                      f"tok/s={fmt(r.get('output_tok_s'), '.1f')}", f"gate={fmt(_gate(r.get('throughput_gate')))}",
                      f"outcome={fmt(r.get('outcome'))}",
                      f"exit={fmt(r.get('exit_code'))}", f"{fmt(r.get('duration_s'), '.1f')}s"]) for r in rows]
