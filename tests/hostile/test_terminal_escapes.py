"""Host output and local state text never reach a terminal raw: C0/C1 controls, DEL, ESC sequences
(OSC window title and clipboard writes, CSI line rewrites), CR and bidi overrides are shown escaped
in every rendered place; ``--json`` keeps the raw text as JSON strings. A log line may *say* what
deployctl says ("12:00:00 [gpu-a] launch: ok") but cannot rewrite what is on the screen.

Generated: every control code point, times every rendering path.
"""

from __future__ import annotations

import io
import json

import pytest

from deploy.render import report as render
from deploy.config.models import Host
from deploy.base.errors import RemoteOutputError
from deploy.engine.fanout import HostOutcome
from deploy.engine.records import HostReport, StepRecord
from deploy.base.terminal import SafeStream, safe_line, safe_text

CONTROLS = [chr(c) for c in list(range(0x00, 0x20)) + list(range(0x7F, 0xA0))] + \
    ["\u2028", "\u2029", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\ufeff"]
SEQUENCES = {
    "osc-title": "\x1b]0;owned\x07", "osc-title-st": "\x1b]2;owned\x1b\\", "osc-clipboard": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "osc-hyperlink": "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\", "csi-erase-line": "\x1b[2K\rdeployctl: ok",
    "csi-up": "\x1b[1A\x1b[2K", "csi-color": "\x1b[31mred\x1b[0m", "c1-csi": "\x9b2J", "c1-osc": "\x9d0;t\x9c",
    "dcs": "\x1bP+q544e\x1b\\", "cr-forgery": "bad\r12:00:00 [gpu-a] launch: ok", "bell": "\x07\x07",
    "backspaces": "danger\x08\x08\x08\x08\x08\x08safe", "rtl": "\u202eexe.txt", "nul": "a\x00b",
}


def _printable(text: str, multiline: bool) -> bool:
    return all(ch.isprintable() or ch == " " or (multiline and ch in "\n\t") for ch in text)


@pytest.mark.parametrize("ch", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_every_control_is_escaped(ch):
    line, text = safe_line(f"a{ch}b"), safe_text(f"a{ch}b")
    assert _printable(line, False) and "\\" in line
    if ch in "\n\t":
        assert text == f"a{ch}b"
    else:
        assert _printable(text, True) and "\\" in text


def test_plain_text_is_unchanged():
    sample = "INFO 12:00:00 [gpu-a] ok: accept length 3.21, café, 日本語, [red]tag[/red]"
    assert safe_line(sample) == sample and safe_text(sample + "\nnext") == sample + "\nnext"


def _host():
    return Host(name="gpu-a", address="10.0.0.1")


def _report(text: str) -> HostReport:
    return HostReport(host=_host(), steps=[StepRecord("launch", "failed", 1.0, detail=text)],
                      error=RemoteOutputError(f"gpu-a: server said {text}"), warnings=[f"warned {text}"],
                      left_running=f"SGLang pid 42 ({text})")


def _rich_console(out):
    from rich.console import Console

    return Console(file=out, width=400, force_terminal=True, color_system=None)


def _renderings(text: str) -> dict[str, str]:
    """Every rendering of host/state text, as it would reach a terminal."""
    outputs = {}
    out = io.StringIO()
    render.step_summary_tables("up", [_report(text)], _rich_console(out))
    outputs["summary-table"] = out.getvalue()
    outputs["plain-lines"] = "\n".join(render.plain_report_lines("up", [_report(text)], "12:00:00")) + "\n"
    out = io.StringIO()
    render.progress_printer(out)("gpu-a", "launch", text)
    outputs["progress"] = out.getvalue()
    out = io.StringIO()
    render.doctor_tables([("gpu-a", [{"name": "c", "status": "fail", "reason": text, "fix": text}])], _rich_console(out))
    outputs["doctor"] = out.getvalue()
    out = io.StringIO()
    render.gpu_status_tables([HostOutcome(_host(), error=RemoteOutputError(text))], _rich_console(out))
    outputs["gpu-status-error"] = out.getvalue()
    from deploy.facts.gpus import ComputeApp, GpuRow

    app = ComputeApp(gpu_uuid="GPU-1", pid=7, process_name=text, used_mib=10)
    row = GpuRow(index=0, uuid="GPU-1", used_mib=10, total_mib=80, utilization_pct=1, holders=(app,))
    out = io.StringIO()
    render.gpu_status_tables([HostOutcome(_host(), value=[row])], _rich_console(out))
    outputs["gpu-holders"] = out.getvalue()
    outputs["endpoint"] = "\n".join(render.endpoint_lines({"error": text, "exit_code": 3}))
    outputs["history-lines"] = "\n".join(render.history_lines([{"host": text, "outcome": text}]))
    return outputs


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_no_rendering_passes_a_control_through(name):
    text = SEQUENCES[name]
    for where, output in _renderings(text).items():
        assert "\x1b" not in output and "\r" not in output and "\x9b" not in output, (where, output)
        assert _printable(output.replace("\n", ""), False), (where, repr(output))


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_json_keeps_the_raw_text(name):
    text = SEQUENCES[name]
    document = render.report_document("up", "r1", [_report(text)])
    out = io.StringIO()
    render.print_json(document, out)
    assert "\x1b" not in out.getvalue()  # JSON escapes controls itself
    back = json.loads(out.getvalue())
    assert back["hosts"][0]["steps"][0]["detail"] == text


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_logs_verb_escapes_the_server_log(tmp_path, capsys, monkeypatch, name):
    from deploy.verbs import inspect as orchestrator  # read_logs lives in deploy/verbs/inspect.py
    from deploy.cli.main import main
    from tests.hostile.test_config_corpus import BASE, dump

    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE))
    log = f"INFO ready\n{SEQUENCES[name]}\nINFO done\n"
    monkeypatch.setattr(orchestrator, "read_logs", lambda config, hosts, lines: [HostOutcome(h, value=log) for h in hosts])
    code = main(["-c", str(config), "logs"])
    captured = capsys.readouterr()
    assert code == 0
    body = captured.out.split("\n", 1)[1]
    assert "\x1b" not in body and "\r" not in body and "\x07" not in body
    assert body.count("\n") == 3  # no line added or removed
    assert body.startswith("INFO ready\n") and body.endswith("INFO done\n")


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_error_messages_are_escaped(tmp_path, capsys, monkeypatch, name):
    from deploy.verbs import inspect as orchestrator  # read_logs lives in deploy/verbs/inspect.py
    from deploy.cli.main import main
    from tests.hostile.test_config_corpus import BASE, dump

    config = tmp_path / "deployctl.yaml"
    config.write_bytes(dump(BASE))
    monkeypatch.setattr(orchestrator, "read_logs", lambda config, hosts, lines:
                        [HostOutcome(h, error=RemoteOutputError(f"tail said {SEQUENCES[name]}")) for h in hosts])
    code = main(["-c", str(config), "logs"])
    captured = capsys.readouterr()
    assert code == 5
    assert "\x1b" not in captured.err and "\r" not in captured.err and "tail said" in captured.err


@pytest.mark.parametrize("chunks", [["a\r\n", "b\r\n"], ["a\r", "\nb\r\n"], ["\x1b]0;t\x07x\r\n"], ["a\rb\r\n"]])
def test_logs_follow_stream(chunks):
    out = io.StringIO()
    stream = SafeStream(out)
    for chunk in chunks:
        stream.write(chunk)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\r" not in text and text.endswith("\n")
