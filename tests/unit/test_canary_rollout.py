"""The canary's setting, rollout, phases and reads (issue 43), without SSH: ``rollout: {canary: ...}``
is strict, the first batch is the canary, its phases are planned, and the reads are parsed strictly."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from deploy.base.errors import RemoteOutputError, UsageError
from deploy.config import load_config
from deploy.config.models import CanarySpec, Host
from deploy.facts.router import Worker
from deploy.host.records import CanaryWindow
from deploy.facts.canary import combined, interval, parse_instant, side
from deploy.fleet.phases import HostPhase
from deploy.fleet.rollout import Rollout
from deploy.local.canary_gate import Side

from tests.fixtures import fleet_config  # noqa: E402

BASE = fleet_config("    group: g\n")


def config(tmp_path: Path, extra: str = "    router: {host: a}\n"):
    path = tmp_path / "deployctl.yaml"
    path.write_text(BASE + extra)
    return load_config(path)


@pytest.mark.parametrize("value,seconds", [("10m", 600.0), ("90s", 90.0), ("1h", 3600.0), (120, 120.0),
                                           ("2.5m", 150.0)])
def test_a_window_is_a_duration(value, seconds):
    assert CanarySpec(window=value).window == seconds


@pytest.mark.parametrize("fields,fragment", [
    ({"window": "10 minutes"}, "expected a duration"),
    ({"window": "-5s"}, "expected a duration"),
    ({"window": "30s", "interval": 5}, "at least 8 intervals"),
    ({"replicas": 0}, "greater than or equal to 1"),
    ({"min_requests": True}, "boolean"),
    ({"inconclusive": "rollback"}, "'keep' or 'promote'"),
    ({"tolerance": 0.7}, "less than 0.5"),
    ({"windw": "10m"}, "Extra inputs"),
])
def test_the_canary_setting_is_strict(fields, fragment):
    with pytest.raises(ValidationError) as exc:
        CanarySpec(**fields)
    assert fragment in str(exc.value)


def test_a_canary_needs_a_router(tmp_path):
    with pytest.raises(Exception) as exc:
        config(tmp_path, "    rollout: {canary: {window: 10m}}\n")
    assert "'rollout.canary' needs a 'router'" in str(exc.value)


def rollout(cfg, verb: str, canary: bool = False, serial: int | None = None) -> Rollout:
    run = cfg.runs[0]
    return Rollout.of(run, cfg.hosts_of(run), verb, serial=serial, canary=canary)


def names(batches) -> list[list[str]]:
    return [[h.name for h in b] for b in batches]


def test_restart_and_nightly_roll_the_canary_first_up_does_not(tmp_path):
    cfg = config(tmp_path, "    router: {host: a}\n    rollout: {canary: {replicas: 2, window: 10m}}\n")
    for verb in ("restart", "nightly"):
        r = rollout(cfg, verb)
        assert r.canary is not None and r.canary.replicas == 2
        assert names(r.batches) == [["a", "b"], ["c"]]
    assert rollout(cfg, "up").canary is None and names(rollout(cfg, "up").batches) == [["a"], ["b"], ["c"]]


def test_canary_flag_takes_the_defaults_and_is_refused_where_it_cannot_be(tmp_path):
    cfg = config(tmp_path)
    r = rollout(cfg, "restart", canary=True)
    assert r.canary == CanarySpec() and names(r.batches) == [["a"], ["b"], ["c"]]
    assert names(rollout(cfg, "restart", canary=True, serial=2).batches) == [["a"], ["b", "c"]]
    with pytest.raises(UsageError, match="for restart and nightly"):
        rollout(cfg, "up", canary=True)
    with pytest.raises(UsageError, match="has no router"):
        rollout(config(tmp_path, ""), "restart", canary=True)
    whole = config(tmp_path, "    router: {host: a}\n    rollout: {canary: {replicas: 3}}\n")
    with pytest.raises(UsageError, match="at least one other replica"):
        rollout(whole, "restart")


def test_the_canary_phases_sit_around_the_first_batch_and_are_planned(tmp_path):
    from deploy.engine.playbook import load_playbook
    from deploy.fleet.plan import plan_fleet
    from deploy.fleet.rolling import fleet_phases

    cfg = config(tmp_path, "    router: {host: a}\n    rollout: {canary: {window: 2m, interval: 2}}\n")
    r = rollout(cfg, "restart")
    playbook = load_playbook("restart")
    phases = [p.name for p in fleet_phases(r, playbook)]
    assert phases[:2] == ["pre-flight: router checks, every replica's doctor", "canary: last good of a"]
    add = phases.index("batch 1/3 (canary) router-add a")
    assert phases[add + 1].startswith("canary window a: live figures against the other replicas'")
    assert phases[add + 2].startswith("batch 2/3")
    assert not any(isinstance(p, HostPhase) and "canary" in p.name for p in fleet_phases(r, playbook)[:2])
    planned = plan_fleet(cfg, r, playbook, None)
    window = next(p for p in planned["phases"] if p["phase"].startswith("canary window"))
    commands = " ".join(c["command"] for c in window["commands"])
    assert "poll 2 metrics http://10.0.0.1:30000 http://10.0.0.2:30000 http://10.0.0.3:30000" in commands
    assert any("greedy /generate" in c["description"] for c in window["commands"])  # the rollback's verification
    assert any("quarantine" in c["description"] and c["host"] == "a" for c in window["commands"])
    last_good = next(p for p in planned["phases"] if p["phase"] == "canary: last good of a")
    assert "last-good.json" in last_good["commands"][0]["command"]


def metrics(accept: float, requests: int, itl_sum: float, itl_count: int) -> dict:
    return {"status": 200, "error": None, "lines": [
        f'sglang:spec_accept_length{{model_name="k",tp_rank="0"}} {accept}',
        f'sglang:num_requests_total{{model_name="k"}} {requests}',
        f'sglang:inter_token_latency_seconds_sum{{model_name="k"}} {itl_sum}',
        f'sglang:inter_token_latency_seconds_count{{model_name="k"}} {itl_count}']}


URLS = ["http://c:1", "http://o1:1", "http://o2:1"]


def test_an_interval_pairs_the_canary_with_the_others_weighted_by_requests():
    first = parse_instant({"at": 100.0, "reads": {u: metrics(2.0, 10, 1.0, 100) for u in URLS}}, URLS, "r")
    second = parse_instant({"at": 105.0, "reads": {"http://c:1": metrics(2.5, 20, 2.0, 200),
                                                   "http://o1:1": metrics(3.0, 40, 2.0, 300),
                                                   "http://o2:1": metrics(2.0, 20, 3.0, 200)}}, URLS, "r")
    got = interval(100.0, first, second, URLS[:1], URLS[1:])
    assert got.at == 5.0
    assert got.canary == Side(2.5, 10.0, 0.01)
    assert got.others.requests == 40.0 and got.others.accept == pytest.approx((3.0 * 30 + 2.0 * 10) / 40)
    assert got.others.token_s == pytest.approx((0.005 * 30 + 0.02 * 10) / 40)


def test_a_restarted_or_idle_replica_gives_no_pair():
    before = parse_instant({"at": 1.0, "reads": {u: metrics(2.0, 50, 1.0, 100) for u in URLS}}, URLS, "r").readings
    after = parse_instant({"at": 2.0, "reads": {u: metrics(2.9, 3, 0.1, 10) for u in URLS}}, URLS, "r").readings
    assert side(before[URLS[0]], after[URLS[0]]).requests == 0.0  # the counter went down: restarted
    assert side(before[URLS[0]], before[URLS[0]]) == Side(None, 0.0, None)  # idle: the gauge is stale
    assert combined([Side(None, 0.0, None)]) == Side(None, 0.0, None)


def test_without_metrics_the_server_info_average_is_read_but_never_paired():
    entry = {"status": 404, "error": None, "server_info": {"status": 200, "error": None, "body": json.dumps(
        {"internal_states": [{"avg_spec_accept_length": 2.7}]})}}
    instant = parse_instant({"at": 1.0, "reads": {u: entry for u in URLS}}, URLS, "r")
    reading = instant.readings[URLS[0]]
    assert reading.source == "server_info" and reading.accept == 2.7 and reading.requests is None
    assert side(reading, reading).requests == 0.0


@pytest.mark.parametrize("line,fragment", [
    ({"at": 1.0}, "unexpected line"),
    ({"at": "now", "reads": {}}, "expected a time"),
    ({"at": 1.0, "reads": {}}, "no read of"),
    ({"at": 1.0, "reads": {u: {"status": 200, "lines": "x"} for u in URLS}}, "not a list"),
    ({"at": 1.0, "reads": {u: {"status": 200, "lines": ["sglang:num_requests_total -1"]} for u in URLS}}, ">= 0"),
    ({"at": 1.0, "reads": {u: {"status": 200, "lines": ["not prometheus"]} for u in URLS}}, "expected a finite number"),
    ({"at": 1.0, "reads": {u: {"status": 404, "server_info": {"status": 200, "body": "{"}} for u in URLS}},
     "not JSON"),
    ({"at": 1.0, "reads": {u: {"status": 404, "server_info": {"status": 200, "body": json.dumps(
        {"internal_states": [{"avg_spec_accept_length": 0.5}]})}} for u in URLS}}, "expected a number >= 1"),
    ({"at": 1.0, "reads": {u: "x" for u in URLS}}, "unexpected read"),
])
def test_a_read_of_another_shape_is_refused_naming_the_host(line, fragment):
    with pytest.raises(RemoteOutputError) as exc:
        parse_instant(line, URLS, "router-host")
    assert "router-host: canary read" in str(exc.value) and fragment in str(exc.value)


def test_the_host_side_read_asks_every_worker_at_once_and_keeps_only_the_canary_series(monkeypatch):
    from deploy.remote import fleet_ops

    body = "\n".join(["# HELP x", 'sglang:spec_accept_length{a="1"} 2.5', "sglang:other 1",
                      'sglang:num_requests_total{a="1"} 7', 'sglang:inter_token_latency_seconds_bucket{le="0.1"} 3'])
    asked = []

    def request(method, url, body_, timeout):
        asked.append(url)
        if url.endswith("/metrics") and "nometrics" not in url:
            return {"status": 200, "body": body, "error": None}
        if url.endswith("/metrics"):
            return {"status": 404, "body": "", "error": None}
        return {"status": 200, "body": '{"internal_states": []}', "error": None}

    monkeypatch.setattr(fleet_ops, "request", request)
    got = fleet_ops.worker_metrics(["http://a:1", "http://nometrics:1"], 1.0)
    assert got["reads"]["http://a:1"]["lines"] == ['sglang:spec_accept_length{a="1"} 2.5',
                                                   'sglang:num_requests_total{a="1"} 7']
    assert got["reads"]["http://nometrics:1"]["server_info"]["status"] == 200
    assert sorted(asked) == ["http://a:1/metrics", "http://nometrics:1/metrics", "http://nometrics:1/server_info"]
    assert fleet_ops._metrics_interval("0.4") is None and fleet_ops._metrics_interval("300") == 300.0


def test_a_canary_hosts_history_row_and_plain_report_line_carry_the_decision():
    from deploy.engine.records import HostReport
    from deploy.local.history import records_for
    from deploy.render.report import plain_report_lines

    report = HostReport(Host(name="a", address="10.0.0.1", gpus=8, state_dir="~/s"))
    report.facts["canary"] = {"outcome": "roll-back", "cause": "canary: live acceptance", "acceptance_ratio": 0.81,
                              "speed_ratio": 0.9, "intervals": 24, "seconds": 25.1, "canary_requests": 212.0,
                              "others": ["b", "c"], "why": "a drop beyond the traffic's noise"}
    [row] = records_for("restart", "r", [report])
    assert row["canary"]["cause"] == "canary: live acceptance"
    line = next(ln for ln in plain_report_lines("restart", [report], "T") if "canary:" in ln)
    assert line == ("T [a] canary: roll-back after 24 interval(s) (212 requests): acceptance 81.0%, speed 90.0% of "
                    "b, c; canary: live acceptance; a drop beyond the traffic's noise")


@pytest.mark.parametrize("change,marked", [({}, True), ({"pid": 1}, False), ({"until": 50.0}, False),
                                           ({"others": "b"}, False), ({"since": "now"}, False)])
def test_status_marks_a_replica_while_its_server_is_in_its_canary_window(change, marked):
    from tests.unit.test_status import _document
    from deploy.facts import status as facts
    from deploy.render.status import cells
    from deploy.verbs import status

    document = _document("metrics_with_traffic")
    mark = {"run": "r", "since": 10.0, "until": 1000.0, "pid": document["pid"], "others": ["b", "c"]} | change
    fact = facts.parse_status(0, json.dumps(document | {"canary": mark, "now": 100.0}) + "\n", "", "gpu-a")
    assert (fact.canary is not None) is marked
    reading = status.HostReading(Host(name="a", address="10.0.0.1", gpus=8, state_dir="~/s"), fact, configured=True,
                                 verdict=status.Verdict("healthy"))
    assert cells(reading)["detail"].startswith("CANARY in its live window, against b, c") is marked
    values = status._prom_values(reading, 1.0)
    assert values["deployctl_status_canary"] == float(marked)
    assert values["deployctl_status_canary_acceptance_ratio"] is None


def test_status_shows_the_windows_figures_so_far():
    from tests.unit.test_status import _document
    from deploy.facts import status as facts
    from deploy.render.status import cells
    from deploy.verbs import status

    document = _document("metrics_with_traffic")
    mark = {"run": "r", "since": 10.0, "until": 1000.0, "pid": document["pid"], "others": ["b"],
            "acceptance_ratio": 0.912, "speed_ratio": 1.004, "intervals": 20, "canary_requests": 140.0,
            "outcome": "watching"}
    fact = facts.parse_status(0, json.dumps(document | {"canary": mark, "now": 100.0}) + "\n", "", "gpu-a")
    assert fact.canary is not None and fact.canary.acceptance_ratio == 0.912
    # status --json keeps the figures, never the PID or the outcome
    assert fact.model_dump(mode="json")["canary"] == {"run": "r", "since": 10.0, "until": 1000.0, "others": ["b"],
                                                      "acceptance_ratio": 0.912, "speed_ratio": 1.004,
                                                      "intervals": 20, "canary_requests": 140.0}
    reading = status.HostReading(Host(name="a", address="10.0.0.1", gpus=8, state_dir="~/s"), fact, configured=True,
                                 verdict=status.Verdict("healthy"))
    assert cells(reading)["detail"].startswith("CANARY in its live window, against b: acceptance 91.2%, speed 100.4% "
                                               "of theirs")
    values = status._prom_values(reading, 1.0)
    assert values["deployctl_status_canary_acceptance_ratio"] == 0.912
    assert values["deployctl_status_canary_speed_ratio"] == 1.004



@pytest.mark.parametrize("change,field", [({"speed": -1}, "speed"), ({"intervals": "20"}, "intervals"),
                                          ({"acceptance_ratio": True}, "acceptance_ratio"), ({"run": None}, "run"),
                                          ({"schema_version": 2}, "schema_version")])
def test_a_canary_mark_of_another_shape_is_a_note_naming_the_field_and_status_reads_on(change, field):
    from tests.unit.test_status import _document
    from deploy.facts import status as facts

    document = _document("metrics_with_traffic")
    mark = {"run": "r", "since": 10.0, "until": 1000.0, "pid": document["pid"], "others": ["b"]} | change
    fact = facts.parse_status(0, json.dumps(document | {"canary": mark, "now": 100.0}) + "\n", "", "gpu-a")
    assert fact.canary is None and fact.alive
    assert any(n.startswith("canary.json is not a canary mark of this deployctl's (") and field in n
               for n in fact.notes), fact.notes


def test_a_canary_marks_figure_that_is_not_finite_or_is_negative_is_not_shown():
    from tests.unit.test_status import _document
    from deploy.facts import status as facts

    document = _document("metrics_with_traffic")
    mark = {"run": "r", "since": 10.0, "until": 1000.0, "pid": document["pid"], "others": ["b"],
            "acceptance_ratio": -0.5, "speed_ratio": 1.0}
    fact = facts.parse_status(0, json.dumps(document | {"canary": mark, "now": 100.0}) + "\n", "", "gpu-a")
    assert fact.canary is not None and fact.canary.acceptance_ratio is None and fact.canary.speed_ratio == 1.0


def test_the_canary_page_charts_the_canary_against_the_others(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from deploy.cli.common import write_canary_report
    from deploy.local.canary_gate import Settings, decide
    from tests.unit.test_canary_gate import window

    intervals = window(40, 0.8, 1, speed_ratio=1.0)
    decision = decide(intervals, Settings(min_requests=100, looks=40))
    canary = CanaryWindow.model_validate({
              "hosts": ["a"], "others": ["b", "c"], "outcome": decision.outcome, "action": "rolled back, quarantined",
              "seconds": 41.0, "decision": decision.to_dict(),
              "intervals": [{"at": i.at, "canary": {"accept": i.canary.accept, "requests": i.canary.requests,
                                                    "token_s": i.canary.token_s},
                             "others": {"accept": i.others.accept, "requests": i.others.requests,
                                        "token_s": i.others.token_s}} for i in intervals]})
    from deploy.render.canary_report import render_html, write

    page = render_html(canary, "r<x>", "2026-12-04T15:00:00+00:00")
    assert page.count("<svg") == 2 and page.count('class="series"') == 4
    assert "ROLL-BACK" in page and "r&lt;x&gt;" in page and "canary a" in page and "others b, c" in page
    assert "Hodges-Lehmann" in page
    path = write(canary, "r", tmp_path)
    assert path.parent == tmp_path and path.name.startswith("report-") and path.read_text().count("<svg") == 2
    result = SimpleNamespace(canary=CanaryWindow(hosts=["a"], outcome="not-run", intervals=[]))
    assert write_canary_report(result, "r") is None
    ran = SimpleNamespace(canary=canary)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    written = write_canary_report(ran, "r")
    assert written is not None and ran.canary.report_html == written and canary.report_html is None


class FakeRouter:
    """The router host as the window uses it: its workers, and the metrics loop fed from ``lines``."""

    def __init__(self, lines, interrupt_after: int | None = None):
        self.lines, self.interrupt_after = lines, interrupt_after
        self.host = SimpleNamespace(name="a")
        self.asked: list = []

    def workers(self):
        return [Worker(id=n, url=f"http://{n}:1", is_healthy=True) for n in ("a", "b", "c")]

    def watch_metrics(self, urls, interval, window, observe):
        self.asked.append((urls, interval, window))
        for i, line in enumerate(self.lines):
            if self.interrupt_after is not None and i == self.interrupt_after:
                raise KeyboardInterrupt
            if observe(line, 0.0):
                return


def feed(n: int, canary_accept: float, requests: int = 10) -> list[dict]:
    out = []
    for i in range(n + 1):
        wave = 3.0 * (1 + 0.1 * ((i * 7919) % 13) / 13)
        reads = {f"http://{h}:1": metrics(wave * (canary_accept if h == "a" else 1.0), i * requests, i * 0.1, i * 10)
                 for h in ("a", "b", "c")}
        out.append({"at": float(i), "reads": reads})
    return out


def run_window(monkeypatch, lines, inconclusive="keep", interrupt_after=None, outcome="ok"):
    from deploy.fleet import canary as module
    from deploy.fleet.phases import FleetMemory, RunContext

    class Ctx(RunContext):
        def url(self, host):
            return f"http://{host.name}:1"

    went_back, marks = [], []
    router = FakeRouter(lines, interrupt_after)
    monkeypatch.setattr(module, "_go_back", lambda ctx, batch, playbook, why, cause: went_back.append((why, cause)))
    monkeypatch.setattr(module, "_mark", lambda ctx, batch, others, spec: marks.append("mark"))
    monkeypatch.setattr(module, "_unmark", lambda ctx, batch: marks.append("unmark"))
    hosts = [Host(name=n, address=f"10.0.0.{i}", gpus=8, state_dir="~/s") for i, n in enumerate("abc", 1)]
    state = SimpleNamespace(reports={"a": SimpleNamespace(outcome=outcome, facts={})}, memory=FleetMemory(),
                            config=SimpleNamespace(hosts_of=lambda run: hosts), run=None, stamp="s", rotation={},
                            router=router, progress=lambda *a: None)
    spec = CanarySpec(window=30, interval=1, min_requests=50, inconclusive=inconclusive)
    body = module._window(spec, (hosts[0],), None)
    return (lambda st: body(Ctx(st))), state, went_back, marks, router


def test_the_window_promotes_a_canary_that_keeps_up(monkeypatch):
    from deploy.fleet import canary as module

    updates = []
    monkeypatch.setattr(module, "_update_marks", lambda ctx, batch, decision: updates.append(decision.intervals))
    action, state, went_back, marks, router = run_window(monkeypatch, feed(30, 1.0))
    assert action(state).startswith("PROMOTED: acceptance")
    assert went_back == [] and marks == ["mark", "unmark"]
    assert router.asked == [(["http://a:1", "http://b:1", "http://c:1"], 1.0, 30.0)]
    assert state.memory.canary.outcome == "promote" and state.memory.canary.action == "promoted"
    assert state.reports["a"].facts["canary"]["outcome"] == "promote"
    assert updates and all(n % 10 == 0 for n in updates)  # the mark's figures, every 10 intervals while watching


def test_the_window_rolls_back_a_canary_that_accepts_less(monkeypatch):
    from deploy.fleet.canary import CanaryRolledBack

    action, state, went_back, marks, _ = run_window(monkeypatch, feed(30, 0.8))
    with pytest.raises(CanaryRolledBack) as exc:
        action(state)
    assert exc.value.exit_code == 12 and "canary: live acceptance" in str(exc.value)
    assert [cause for _, cause in went_back] == ["canary: live acceptance"]
    assert state.memory.canary.action == "rolled back, quarantined"


@pytest.mark.parametrize("inconclusive", ["keep", "promote"])
def test_too_little_traffic_is_inconclusive_and_the_setting_says_which_way(monkeypatch, inconclusive):
    from deploy.fleet.canary import CanaryKept

    action, state, went_back, _, _ = run_window(monkeypatch, feed(30, 0.8, requests=1), inconclusive)
    if inconclusive == "promote":
        assert action(state).startswith("PROMOTED (rollout.canary.inconclusive: promote)")
        assert went_back == []
        return
    with pytest.raises(CanaryKept) as exc:
        action(state)
    assert exc.value.exit_code == 11 and "nothing quarantined" in str(exc.value)
    assert [cause for _, cause in went_back] == [None]


def test_a_signal_in_the_window_goes_back_to_the_last_good_and_is_raised_again(monkeypatch):
    action, state, went_back, marks, _ = run_window(monkeypatch, feed(30, 1.0), interrupt_after=5)
    with pytest.raises(KeyboardInterrupt):
        action(state)
    assert went_back == [("a signal came during the canary window", None)] and marks == ["mark", "unmark"]
    assert state.memory.canary.outcome == "interrupted"


def test_no_window_when_the_canary_batch_deployed_nothing_new(monkeypatch):
    monkeypatch.setattr("deploy.fleet.canary._update_marks", lambda *a: None)
    action, state, went_back, marks, router = run_window(monkeypatch, feed(30, 1.0), outcome="converged")
    assert action(state).startswith("no window: the canary batch did not deploy a new drafter")
    assert router.asked == [] and marks == [] and went_back == []


def test_a_window_of_more_than_720_intervals_is_refused():
    assert CanarySpec(window="1h", interval=5).window == 3600
    with pytest.raises(ValidationError, match="at most 720 intervals"):
        CanarySpec(window="1h", interval=1)


def test_a_read_of_another_shape_ends_the_window_on_the_last_good_drafter(monkeypatch):
    lines = feed(30, 1.0)
    lines[6] = {"at": 6.0, "reads": {}}
    action, state, went_back, marks, _ = run_window(monkeypatch, lines)
    with pytest.raises(RemoteOutputError, match="no read of"):
        action(state)
    assert went_back and went_back[0][0].startswith("the window's reads failed: a: canary read: no read of")
    assert went_back[0][1] is None and marks == ["mark", "unmark"]
    assert state.memory.canary.outcome == "failed"


def test_the_plain_fleet_report_says_the_canary_decision(capsys):
    from deploy.fleet.phases import PhaseRecord, RunResult
    from deploy.fleet.plan import fleet_report, print_fleet_report

    canary = CanaryWindow(hosts=["a"], others=["b", "c"], outcome="roll-back", action="rolled back, quarantined",
                          line="acceptance 80.0% [75.0%, 85.0%] over 24 interval(s), 212 canary requests: ROLL-BACK: ...")
    result = RunResult([], [PhaseRecord("canary window a", "failed", "x", 1.0, 12)], canary=canary)
    print_fleet_report(result)
    out = capsys.readouterr().out
    assert "canary a against b, c: acceptance 80.0% [75.0%, 85.0%]" in out and "-> rolled back, quarantined" in out
    # --json prints the keys in the order the window has always had them
    assert json.dumps(fleet_report(result)["canary"]) == (
        '{"hosts": ["a"], "others": ["b", "c"], "outcome": "roll-back", "line": "acceptance 80.0% [75.0%, 85.0%] '
        'over 24 interval(s), 212 canary requests: ROLL-BACK: ...", "action": "rolled back, quarantined"}')
