"""Issue 21: `deployctl status` without SSH: the Prometheus parser (with generated hostile lines),
the verdict, the Prometheus textfile output (label escaping, atomic write), the escaping of host
output, the watch loop's bounds, the stand-in's /metrics and its acceptance decay."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from deploy.config.models import Host, Run
from deploy.base.errors import ExitCode, RemoteOutputError
from deploy.host.records import DeploymentRecord
from deploy.facts import status as facts
from deploy.facts.server import env_hash
from deploy.host.sglang_argv import sglang_argv
from deploy.verbs import status
from deploy.render.status import cells, clean, findings, plain_lines, table

REPO = Path(__file__).resolve().parents[2]
HOST = Host(name="kimi-a", address="10.1.230.174", state_dir="/var/lib/deployctl")
RUN = Run(name="r", hosts=["kimi-a"], base_model="/data/models/Kimi-K2.5", drafter="/data/drafters/d",
          draft_tokens=16)
LABELS = '{engine_type="unified",model_name="kimi",pp_rank="0",tp_rank="0"}'
GATE = status.Gate(0.9, 0.9)


# -- Prometheus text ---------------------------------------------------------------------------------


def test_sample_lines_parse_with_labels_escapes_and_timestamps():
    series = facts.parse_metric_lines([
        f"sglang:spec_accept_length{LABELS} 2.91",
        'sglang:num_running_reqs{model_name="a \\"quoted\\" \\\\ back\\nslash",tp_rank="1",} 3 1764000000000',
        "sglang:generation_tokens_total 1.5e3",
    ], "gpu-a")
    assert series["sglang:spec_accept_length"] == {tuple(sorted({"engine_type": "unified", "model_name": "kimi",
                                                                   "pp_rank": "0", "tp_rank": "0"}.items())): 2.91}
    [(labels, value)] = series["sglang:num_running_reqs"].items()
    assert dict(labels) == {"model_name": 'a "quoted" \\ back\nslash', "tp_rank": "1"} and value == 3.0
    assert series["sglang:generation_tokens_total"] == {(): 1500.0}


HOSTILE_VALUES = ["NaN", "nan", "+Inf", "-Inf", "Inf", "-1", "-0.5", "1e400", "0x10", "٣", "2.9.1", "1_000", "",
                  "2,9", "true", "'2.9'"]
HOSTILE_LINES = (
    [f"sglang:spec_accept_length{LABELS} {v}".rstrip() for v in HOSTILE_VALUES]
    + [f"sglang:spec_accept_length{{{labels}}} 2.9" for labels in (
        'tp_rank="0"', 'tp_rank="0",tp_rank="1"', 'tp_rank=0', 'tp_rank="0" x="1"', '0tp="1"', 'tp_rank="\\"',
        'tp_rank="0"}{x="1"')]
    + ['sglang:spec_accept_length{tp_rank="0" 2.9', "sglang:spec_accept_length", "{} 2.9", "2.9",
       "sglang:spec accept 2.9", "sglang:spec_accept_length 2.9 not-a-timestamp", "\x1b[2Jsglang:x 1"]
)


@pytest.mark.parametrize("line", HOSTILE_LINES, ids=range(len(HOSTILE_LINES)))
def test_a_hostile_metric_line_is_an_error_naming_the_host_never_a_figure(line):
    lines = [line]
    if line == 'sglang:spec_accept_length{tp_rank="0"} 2.9':  # a valid line: make it a duplicate series
        lines = [line, line]
    with pytest.raises(RemoteOutputError) as exc:
        facts.parse_metric_lines(lines, "gpu-a")
    assert "gpu-a: status metrics:" in str(exc.value)


# -- the verdict -------------------------------------------------------------------------------------


def host_status(accept=2.9, tok_s=None, comparable=False, good_accept=3.0, good_tok_s=560.0, alive=True,
                health=200, good_run="r", good_tokens=16, draft_tokens=16, good=True) -> facts.HostStatus:
    live = facts.Live(accept_length=accept, accept_source="sglang:spec_accept_length", output_tok_s=tok_s,
                      throughput_source="--probe" if comparable else "sglang:generation_tokens_total",
                      throughput_comparable=comparable, server_gen_tok_s=None, running=0, queued=0,
                      traffic=tok_s is not None, window_s=2.0, source="metrics")
    baseline = facts.Baseline(run=good_run, drafter_fingerprint="f" * 64, drafter_path="/s/f", verified_at=None,
                              draft_tokens=good_tokens, accept_length=good_accept, output_tok_s=good_tok_s,
                              bench_settings=None, same_deployment=True) if good else None
    return facts.HostStatus(pid=4242, alive=alive, health=health if alive else None, health_error=None, uptime_s=61.0,
                            deployment=None, drafter_fingerprint="f" * 64, drafter_path="/s/f",
                            draft_tokens=draft_tokens, sglang_version="0.5.23", live=live, last_good=baseline,
                            probe=None, notes=[])


VERDICTS = [
    ({}, "healthy", 0),
    ({"accept": 2.69}, "regression", 12),                       # 89.7% < 90%
    ({"accept": 2.70}, "healthy", 0),                           # exactly 90%
    ({"accept": 1.59, "good_accept": 4.49}, "regression", 12),  # sglang#32176
    ({"tok_s": 400.0, "comparable": True}, "regression", 12),
    ({"tok_s": 400.0, "comparable": False}, "healthy", 0),      # live traffic: another load, not compared
    ({"tok_s": 540.0, "comparable": True}, "healthy", 0),
    ({"accept": None}, "unknown", 0),
    ({"good": False}, "unknown", 0),
    ({"good_run": "other"}, "unknown", 0),
    ({"good_tokens": 10}, "unknown", 0),
    ({"good_accept": None}, "unknown", 0),
    ({"alive": False}, "not-serving", 1),
    ({"health": 503}, "not-serving", 1),
]


@pytest.mark.parametrize("kwargs,state,code", VERDICTS, ids=[str(v[0]) for v in VERDICTS])
def test_verdict_against_the_last_good_deployment(kwargs, state, code):
    verdict = status.evaluate(RUN, host_status(**kwargs), GATE)
    assert (verdict.state, verdict.exit_code) == (state, code), verdict.lines
    if state == "regression":
        assert verdict.regressions and "minimum 90%" in verdict.regressions[0]


def test_the_gate_comes_from_the_nightly_playbook_and_flags_override_it():
    assert status.gate_of("nightly") == status.Gate(0.9, 0.9)
    assert status.gate_of("nightly", min_accept_fraction=0.5, min_throughput_fraction=None) == status.Gate(0.5, 0.9)


def test_exit_code_is_the_first_failing_host_in_config_order():
    ok = status.HostReading(HOST, host_status(), verdict=status.Verdict("healthy"))
    bad = status.HostReading(HOST, host_status(), verdict=status.Verdict("regression"))
    down = status.HostReading(HOST, error=RemoteOutputError("x"), verdict=status.Verdict("error"))
    assert status.exit_code([ok, bad, down], check=True) == 12
    assert status.exit_code([ok, down, bad], check=True) == ExitCode.REMOTE_OUTPUT
    assert status.exit_code([ok, bad], check=False) == 0


def test_configured_compares_argv_with_its_store_drafter_and_the_environment():
    argv = sglang_argv(RUN, HOST, 16, "/s/f")
    deployment = DeploymentRecord(run="r", argv=argv, drafter_path="/s/f", env_hash=env_hash({}))
    st = host_status().model_copy(update={"deployment": deployment})
    assert status.configured(RUN, HOST, st) == (True, [])
    other = st.model_copy(update={"deployment": deployment.but(env_hash="x", argv=argv[:-1])})
    assert status.configured(RUN, HOST, other) == (False, ["argv", "environment"])
    assert status.configured(RUN, HOST, host_status())[0] is None


def test_up_starts_sglang_with_enable_metrics():
    assert "--enable-metrics" in sglang_argv(RUN, HOST, 16)


# -- Prometheus textfile output ----------------------------------------------------------------------


HOSTILE_NAMES = ['a"b', "a\\b", "a\nb", 'x\\"}\n{y="1', "ünï", "\\n", 'end\\']


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_prom_text_escapes_label_values_and_parses_back(name):
    host = Host.model_construct(**(HOST.model_dump() | {"name": name}))
    reading = status.HostReading(host, host_status(), verdict=status.Verdict("regression"))
    text = status.prom_text(RUN, [reading], now=1764000000.0)
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert all("\n" not in s for s in samples) and len(samples) == len(text.splitlines()) - text.count("# ")
    series = facts.parse_metric_lines(samples, "here")
    assert dict(next(iter(series["deployctl_status_regression"])))["host"] == name
    assert series["deployctl_status_regression"][tuple(sorted({"host": name, "run": "r"}.items()))] == 1.0


def test_unknown_figures_are_absent_not_zero():
    reading = status.HostReading(HOST, host_status(accept=None, good=False), verdict=status.Verdict("unknown"))
    text = status.prom_text(RUN, [reading], now=1.0)
    assert "deployctl_status_accept_length{" not in text and "deployctl_status_last_good" not in text
    unreachable = status.HostReading(HOST, error=RemoteOutputError("x"), verdict=status.Verdict("error"))
    assert 'deployctl_status_reachable{host="kimi-a",run="r"} 0' in status.prom_text(RUN, [unreachable], now=1.0)


def test_prom_file_is_replaced_atomically_and_a_failed_write_leaves_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "deployctl.prom"
    status.write_prom_file(path, "old 1\n")
    assert path.read_text() == "old 1\n" and oct(path.stat().st_mode & 0o777) == "0o644"
    status.write_prom_file(path, "new 2\n")
    assert path.read_text() == "new 2\n" and [p.name for p in tmp_path.iterdir()] == ["deployctl.prom"]

    def refuse(src, dst):
        assert Path(src).parent == path.parent and not Path(src).name.endswith(".prom")  # collector ignores it
        raise OSError(28, "No space left on device")

    from deploy.local.state import LocalStateError

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(LocalStateError, match="No space left"):
        status.write_prom_file(path, "newer 3\n")
    assert path.read_text() == "new 2\n" and [p.name for p in tmp_path.iterdir()] == ["deployctl.prom"]


# -- host output is escaped before printing ----------------------------------------------------------


CONTROL = [chr(c) for c in list(range(0, 0x20)) + list(range(0x7F, 0xA0))] + ["\u202e", "\u2028", "\ufeff"]


@pytest.mark.parametrize("ch", CONTROL, ids=[f"U+{ord(c):04X}" for c in CONTROL])
def test_every_control_character_from_a_host_is_escaped(ch):
    out = clean(f"fp{ch}x")
    assert ch not in out and out.startswith("fp\\") and out.endswith("x")


def test_a_hostile_record_cannot_reach_the_terminal_or_rich_markup():
    hostile = host_status().model_copy(update={"drafter_fingerprint": "[bold]\x1b]0;pwned\x07\x1b[2J",
                                               "notes": ["\x1b[31mred"]})
    reading = status.HostReading(HOST, hostile, verdict=status.Verdict("unknown", ["\x1b[1mx\r\nforged line"]))
    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=250, color_system=None).print(table([reading], "t"))
    text = buffer.getvalue() + "\n".join(plain_lines([reading])) + "\n".join(findings([reading]))
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert "[bold]" in cells(reading)["drafter"] and "\\x1b" in text
    assert len(plain_lines([reading])) == 1 and "\n" not in plain_lines([reading])[0]


# -- watch -------------------------------------------------------------------------------------------


def test_watch_is_bounded_by_rounds_and_sleeps_the_rest_of_each_interval():
    shown, slept = [], []
    done = status.watch(3, 5.0, lambda: ["reading"], shown.append, slept.append)
    assert done == 3 and len(shown) == 3 and len(slept) == 2 and all(0 < s <= 5.0 for s in slept)


def test_watch_ends_on_ctrl_c_with_the_interrupt_raised_to_the_cli():
    def interrupted(_):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        status.watch(None, 1.0, lambda: [], lambda r: None, interrupted)


@pytest.mark.parametrize("argv,fragment", [
    (["status", "--check", "--watch"], "--check reads once"),
    (["status", "--rounds", "2"], "--rounds needs --watch"),
    (["status", "--watch", "0.1"], "0.1"),
    (["status", "--window", "nan"], "nan"),
    (["status", "--watch", "nan"], "nan"),
    (["status", "--min-accept-fraction", "nan"], "nan"),
    (["status", "--min-throughput-fraction", "inf"], "inf"),
    (["status", "--min-accept-fraction", "2"], "2"),
])
def test_bad_flags_are_usage_errors(argv, fragment, capsys):
    from deploy.cli.main import main

    assert main(["-c", str(REPO / "configs" / "kimi-k25-eagle3.yaml"), *argv]) == ExitCode.USAGE
    assert fragment in capsys.readouterr().err


# -- the stand-in's /metrics -------------------------------------------------------------------------


def stand_in():
    sys.path.insert(0, str(REPO / "sandbox" / "sim_sglang"))
    try:
        os.environ.setdefault("SGLANG_SIM_IMPORT_SECONDS", "0")
        from sglang import launch_server
    finally:
        sys.path.pop(0)
    return launch_server


def test_the_stand_in_metrics_are_prometheus_text_in_sglang_names():
    sim = stand_in()
    state = sim.MetricsState()
    state.decode_logged(2.91, 0.127)
    state.finished(12, 256)
    text = state.render('k"25', 2, 431.5)
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    series = facts.parse_metric_lines(samples, "sim")
    assert list(series["sglang:spec_accept_length"].values()) == [2.91]
    assert list(series["sglang:generation_tokens_total"].values()) == [256.0]
    assert dict(next(iter(series["sglang:generation_tokens_total"]))) == {"model_name": 'k"25'}
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput", "sglang:spec_accept_rate",
            "sglang:prompt_tokens_total", "sglang:num_requests_total"} <= set(series)


@pytest.mark.parametrize("factor", [1.0, 0.8, 0.5, 0.3, 0.1])
def test_the_stand_in_decay_keeps_only_that_share_of_accepted_draft_tokens(factor):
    sim = stand_in()
    state = sim.MetricsState()
    steps = [state.decayed(4, factor) for _ in range(1000)]
    assert all(1 <= s <= 4 for s in steps)
    assert abs(sum(steps) / len(steps) - (1 + 3 * factor)) < 0.01


@pytest.mark.parametrize("text,factor", [("0.5", 0.5), ("1", 1.0), ("0", 1.0), ("-1", 1.0), ("2", 1.0),
                                         ("nan", 1.0), ("x", 1.0), ("", 1.0)])
def test_the_stand_in_decay_file_is_read_strictly(tmp_path, monkeypatch, text, factor):
    sim = stand_in()
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "accept_factor").write_text(text)
    monkeypatch.setenv("SGLANG_SIM_CONFIG", str(tmp_path / "config.json"))
    assert sim.accept_factor() == factor


# -- the shipped crontab line ------------------------------------------------------------------------


def test_the_shipped_crontab_line_is_valid_cron_and_valid_flags_and_is_the_documented_one():
    import shlex
    import subprocess

    from deploy.cli.status import command

    crontab = REPO / "contrib" / "cron" / "deployctl-status.crontab"
    [line] = [ln for ln in crontab.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    fields = line.split(None, 5)
    assert fields[0] == "*/5" and fields[1:5] == ["*"] * 4 and "%" not in fields[5]
    subprocess.run(["sh", "-n", "-c", fields[5]], check=True)
    words = shlex.split(fields[5].split(" 2>&1 > ", 1)[0].split("$(", 1)[1])
    start = next(i for i, w in enumerate(words) if w.endswith("/deployctl"))
    assert words[start + 1] == "status"
    ctx = command.make_context("status", words[start + 2:])  # click validates every flag and value
    assert ctx.params["check"] is True and ctx.params["prom_file"].suffix == ".prom"
    assert line in (REPO / "docs" / "status.md").read_text()


# -- a host's document of another shape: always RemoteOutputError, never a traceback or a figure ------


def _captured(case: str) -> dict:
    return json.loads((REPO / "tests" / "facts" / "status" / f"{case}.json").read_text())


def _document(case: str) -> dict:
    return json.loads(_captured(case)["stdout"])


WRONG = [None, "x", -1, 1.5, True, [], {}, 2 ** 70]
TOP_KEYS = sorted(_document("metrics_with_traffic"))


#: every field with every wrong value, except the captured value itself
WRONG_FIELDS = [pytest.param(key, value, id=f"{value!r}-{key}") for value in WRONG for key in TOP_KEYS
                if not (_document("metrics_with_traffic")[key] == value
                        and type(_document("metrics_with_traffic")[key]) is type(value))]


@pytest.mark.parametrize("key,value", WRONG_FIELDS)
def test_every_field_of_the_document_with_a_wrong_value_is_an_error_or_read_as_absent(key, value):
    original = _document("metrics_with_traffic")
    try:
        fact = facts.parse_status(0, json.dumps(original | {key: value}) + "\n", "", "gpu-a")
    except RemoteOutputError as exc:
        assert str(exc).startswith("gpu-a: status ")
        return
    # accepted only where the value is of the field's own kind; a record that is no record is read as none
    if key in ("record", "last_good"):
        assert value in (None, {}) and (fact.deployment if key == "record" else fact.last_good) is None
    else:
        assert (key, value) in {("pidfile", "x"), ("uptime_s", 1.5), ("uptime_s", None), ("probe", None), ("probe_skipped", True)}, \
            (key, value, fact)


@pytest.mark.parametrize("key, field, value", [("record", "pid", "4242"), ("record", "drafter_update", {"how": "x"}),
                                               ("last_good", "metrics", {"draft_tokens": "16"}),
                                               ("last_good", "surprise", 1)])
def test_a_record_field_of_another_shape_is_a_note_naming_the_file_and_field_and_status_reads_on(key, field, value):
    """Issue 37: the records are typed (deploy/host/records.py); status reads on and says which field."""
    original = _document("probe_at_the_benchmark_load")
    fact = facts.parse_status(0, json.dumps(original | {key: original[key] | {field: value}}) + "\n", "", "gpu-a")
    name = "deployment.json" if key == "record" else "last-good.json"
    assert (fact.deployment if key == "record" else fact.last_good) is None
    assert any(n.startswith(f"{name} is not a deployment record ({field}") for n in fact.notes), fact.notes
    assert fact.live.accept_length is not None  # the server's own figures are still read


INFO_BODIES = ["[]", "not json", '{"internal_states": "x"}', '{"internal_states": []}', '{"internal_states": [1]}',
               '{"internal_states": [{"avg_spec_accept_length": NaN}]}',
               '{"internal_states": [{"avg_spec_accept_length": -2}]}',
               '{"internal_states": [{"last_gen_throughput": "fast"}]}',
               '{"internal_states": [{"avg_spec_accept_length": true}]}']


@pytest.mark.parametrize("body", INFO_BODIES)
def test_a_hostile_server_info_body_is_an_error_naming_the_host(body):
    document = _document("server_info_without_metrics")
    for read in document["reads"]:
        read["server_info"]["body"] = body
    with pytest.raises(RemoteOutputError) as exc:
        facts.parse_status(0, json.dumps(document) + "\n", "", "gpu-a")
    assert "gpu-a: status /server_info" in str(exc.value)


@pytest.mark.parametrize("meta", [{"completion_tokens": -1, "spec_verify_ct": 3}, {"completion_tokens": 9, "spec_verify_ct": 0},
                                  {"completion_tokens": "9", "spec_verify_ct": 3}, {"completion_tokens": 9.5, "spec_verify_ct": 3},
                                  {"completion_tokens": 9, "spec_verify_ct": 3, "e2e_latency": "1"}, None])
def test_a_hostile_probe_answer_is_an_error(meta):
    document = _document("probe_at_the_benchmark_load")
    document["probe"]["requests"][1] = {"wall_s": 1.0, "meta": meta}
    with pytest.raises(RemoteOutputError) as exc:
        facts.parse_status(0, json.dumps(document) + "\n", "", "gpu-a")
    assert "gpu-a: status " in str(exc.value)


def test_a_truncated_metrics_answer_is_not_read():
    document = _document("metrics_with_traffic")
    document["reads"][1]["metrics"]["truncated"] = True
    with pytest.raises(RemoteOutputError, match="more than the status read's limit"):
        facts.parse_status(0, json.dumps(document) + "\n", "", "gpu-a")


@pytest.mark.parametrize("enabled,code", [(True, 200), (False, 404)])
def test_the_stand_in_serves_metrics_only_with_enable_metrics(enabled, code):
    """Like SGLang: the /metrics route exists only with --enable-metrics (404 otherwise)."""
    import threading
    import types
    import urllib.error
    import urllib.request

    sim = stand_in()
    state = sim.MetricsState()
    args = types.SimpleNamespace(enable_metrics=enabled, served_model_name="kimi")
    engine = types.SimpleNamespace(args=args, metrics=lambda: state.render("kimi", 0, 0.0))
    server = sim.SimHTTPServer(("127.0.0.1", 0), engine)
    server.server_bind()
    server.server_activate()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                got, body = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            got, body = exc.code, ""
        assert got == code
        if enabled:
            assert "sglang:spec_accept_length{" in body and "sglang:generation_tokens_total{" in body
    finally:
        server.shutdown()
        server.server_close()


# -- the Prometheus text read back by the reference parser (issue 25) ---------------------------------


@pytest.mark.parametrize("now", [1764636000.0, 1764636001.75, 2 ** 31 + 3.0])
def test_the_prom_file_parses_with_prometheus_client_and_keeps_the_timestamp_to_the_second(tmp_path, now):
    # `{:.6g}` wrote 1764636000 as 1.76464e+09: 4000 s off, the staleness alert docs/status.md
    # recommends fired or stayed silent wrongly
    from prometheus_client.parser import text_string_to_metric_families

    readings = [status.HostReading(HOST, host_status(accept=2.912345678, tok_s=612.125, comparable=True),
                                   configured=True, verdict=status.Verdict("healthy")),
                status.HostReading(Host.model_construct(**(HOST.model_dump() | {"name": 'b"\\\n'})),
                                   error=RemoteOutputError("x"), verdict=status.Verdict("error"))]
    path = tmp_path / "deployctl.prom"
    status.write_prom_file(path, status.prom_text(RUN, readings, now=now))
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert set(families) <= set(status.PROM_METRICS) and all(f.type == "gauge" for f in families.values())
    stamps = {s.labels["host"]: s.value for s in families["deployctl_status_timestamp_seconds"].samples}
    assert stamps == {"kimi-a": now, 'b"\\\n': now} and int(stamps["kimi-a"]) == int(now)
    values = {(f.name, s.labels["host"]): s.value for f in families.values() for s in f.samples}
    assert values[("deployctl_status_accept_length", "kimi-a")] == 2.912345678  # every digit, not 2.91235
    assert values[("deployctl_status_output_tokens_per_second", "kimi-a")] == 612.125
    assert values[("deployctl_status_reachable", 'b"\\\n')] == 0.0
    assert values[("deployctl_status_configured", "kimi-a")] == 1.0


@pytest.mark.parametrize("value,text", [(1764636000.0, "1764636000"), (0.0, "0"), (1.0, "1"), (2.5, "2.5"),
                                        (0.1 + 0.2, "0.30000000000000004"), (1e-7, "1e-07"), (2.0 ** 60, "1.152921504606847e+18"),
                                        (float("inf"), "+Inf"), (float("-inf"), "-Inf"), (float("nan"), "NaN")])
def test_a_prom_value_reads_back_as_the_same_float(value, text):
    assert status.prom_value(value) == text
    if value == value:
        assert float(text.replace("Inf", "inf")) == value


@pytest.mark.parametrize("width", [80, 60, 160])
def test_the_status_table_is_readable_at_its_terminal_width(width):
    """Issue 27: the table needed ~120 columns: at 80 a PID split across lines, at 60 columns were 2
    characters wide. Below 120 it is one block per host, every value on one line."""
    from rich.console import Console

    from deploy.render import status as status_render

    hosts = [Host(name=f"kimi-{c}", address="10.1.230.174") for c in "ab"]
    readings = [status.HostReading(hosts[0], host_status(), verdict=status.Verdict("healthy")),
                status.HostReading(hosts[1], host_status(accept=1.2), verdict=status.Verdict("regression"))]
    console = Console(width=width, record=True, color_system=None)
    console.print(status_render.table(readings, "deployctl status, run r", console.width))
    lines = console.export_text().splitlines()
    assert lines and max(len(line) for line in lines) <= width, "\n".join(lines)
    assert sum("4242" in line for line in lines) == 2                          # each PID whole, on one line
    assert any("2.90 / 3.00 97%" in line for line in lines)                    # the accept pair unbroken
    if width < status_render.WIDE_COLUMNS:
        assert any(line.split() == ["kimi-b", "regression"] for line in lines)
        assert any(line.split()[:1] == ["pid"] for line in lines)


# -- the run's router (issue 44: status --check said "healthy" while the fleet's router was gone) ------

URL = "http://10.0.0.2:30000"


def _served(worker_url=URL, alive=True):
    reading = status.HostReading(HOST, host_status(alive=alive), verdict=status.Verdict("healthy"))
    reading.worker_url = worker_url
    return reading


ROUTER_ROWS = {
    "healthy": ({"host": "r", "alive": True, "answering": True, "pid": 7,
                 "workers": [{"url": URL, "healthy": True}]}, "healthy", 0),
    "down": ({"host": "r", "alive": False, "pid": None}, "down", ExitCode.FAILED),
    "another-users-pid": ({"host": "r", "alive": False, "pid": 9,
                           "note": "PID 9 from x runs a router but owned by uid 0; not touched"}, "down", ExitCode.FAILED),
    "not-answering": ({"host": "r", "alive": True, "answering": False, "pid": 7}, "not-answering", ExitCode.FAILED),
    "not-listed": ({"host": "r", "alive": True, "answering": True, "pid": 7, "workers": []}, "missing",
                   ExitCode.FAILED),
    "listed-unhealthy": ({"host": "r", "alive": True, "answering": True, "pid": 7,
                          "workers": [{"url": URL, "healthy": False}]}, "missing", ExitCode.FAILED),
    "unreachable": ({"host": "r", "error": "r: connection refused", "exit_code": 4}, "unreachable", ExitCode.CONNECTION),
    "unexpected": ({"host": "r", "error": "r: fleet_ops printed ...", "exit_code": 5}, "error", ExitCode.REMOTE_OUTPUT),
}


@pytest.mark.parametrize("name", sorted(ROUTER_ROWS))
def test_the_router_is_judged_next_to_its_replicas(name):
    row, state, code = ROUTER_ROWS[name]
    readings = [_served()]
    router = status.judge_router(row, readings)
    assert router.state == state and router.exit_code == code
    assert status.exit_code(readings, True, router) == code
    # without --check only a router host that could not be read changes the exit code
    assert status.exit_code(readings, False, router) == (code if "error" in row else 0)
    doc = status.document(RUN, readings, status.Gate(), router)
    assert doc["router"]["verdict"] == state and doc["router"]["exit_code"] == code
    found = findings(readings, router)
    assert (state != "healthy") == any(line.startswith("router on r:") for line in found), found
    assert any(line.split()[1] == "router@r" and line.split()[2] == state for line in plain_lines(readings, router))
    prom = status.prom_text(RUN, readings, now=1.0, router=router)
    if "error" not in row:
        assert f'deployctl_status_router_up{{host="r",run="{RUN.name}"}} {int(state == "healthy")}' in prom


def test_a_replica_that_does_not_serve_is_not_missing_from_the_router():
    router = status.judge_router(ROUTER_ROWS["not-listed"][0], [_served(alive=False)])
    assert router.state == "healthy"


@pytest.mark.parametrize("run_name", ["kimi-k25-eagle3", "r", "a-very-long-run-name-" * 6, "x\x1b[2Jy" * 20])
@pytest.mark.parametrize("fractions", [(0.9, 0.9), (0.95, 0.875), (1.0, 1.0)])
def test_the_watch_title_fits_80_columns_and_is_drawn_whole(run_name, fractions):
    """Issue 39: the title line was ~105 columns and clipped on an 80-column terminal."""
    from rich.console import Console

    from deploy.render.status import title

    text = title(run_name, status.Gate(*fractions))
    assert len(text) <= 80, text
    assert f"min {fractions[0]:.0%} / {fractions[1]:.0%}" in text and "live / last good" in text and "UTC" in text
    assert "\x1b" not in text
    if len(run_name) < 20:
        assert f"run {run_name}," in text
    console = Console(file=io.StringIO(), width=80, force_terminal=False, color_system=None)
    console.print(table([], text, 80))
    assert text in console.file.getvalue().splitlines()[0]
