"""Issue 27, pure parts: fleets on real networks. Worker URLs for wildcard binds, every port the
router binds, the router watched during a roll, log tails without escapes."""

from __future__ import annotations

import json

import pytest

from deploy.cli.main import main
from deploy.config.models import Host, Run
from deploy.fleet.router import loopback_problem, worker_url
from deploy.facts.router import HttpAnswer, MembersLine, RouterState, Worker
from deploy.host.sglang_argv import probe_address

from tests.fixtures import fleet_config  # noqa: E402

BASE = fleet_config("    group: g\n", c_address="gpu-c")
SSH_CONFIG = "Host gpu-c\n  HostName 10.0.0.3\n"


def run_with(**fields) -> Run:
    return Run.model_validate({"name": "r", "hosts": ["a"], "base_model": "/m", "drafter": "/d", **fields})


@pytest.mark.parametrize("serve_host,address,url", [
    ("0.0.0.0", "10.0.0.1", "http://10.0.0.1:30000"),      # the README's real-host example
    ("::", "10.0.0.1", "http://10.0.0.1:30000"),
    ("::", "fd00::7", "http://[fd00::7]:30000"),
    ("0.0.0.0", "gpu-a.example", "http://gpu-a.example:30000"),
    (None, "10.0.0.1", "http://10.0.0.1:30000"),
    ("10.9.9.9", "10.0.0.1", "http://10.9.9.9:30000"),      # a bind address the user chose
])
def test_a_wildcard_bind_is_reached_at_the_hosts_network_address_never_loopback(serve_host, address, url):
    run, host = run_with(serve_host=serve_host), Host(name="a", address=address)
    assert worker_url(run, host) == url
    if serve_host in ("0.0.0.0", "::"):  # a probe ON the host still uses its loopback
        assert probe_address(run, host) == "127.0.0.1"


def test_a_loopback_serve_host_is_refused_unless_the_router_runs_on_that_host():
    run = run_with(serve_host="127.0.0.1")
    host = Host(name="b", address="10.0.0.2")
    problem = loopback_problem(run, host, "a")
    assert problem and "loopback" in problem and "b" in problem and "0.0.0.0" in problem
    assert loopback_problem(run, host, "b") is None                      # the router is on b: it reaches it
    assert loopback_problem(run_with(serve_host="0.0.0.0"), host, "a") is None
    # a host whose own address is loopback (one machine, several addresses) is what the user gave
    assert loopback_problem(run_with(serve_host="0.0.0.0"), Host(name="b", address="127.0.0.11"), "a") is None
    # ... but 127.0.0.1 is the router host's own machine: the router would reach itself
    problem = loopback_problem(run_with(serve_host="0.0.0.0"), Host(name="b", address="127.0.0.1"), "a")
    assert problem and "reach itself" in problem
    assert loopback_problem(run_with(serve_host="0.0.0.0"), Host(name="a", address="127.0.0.1"), "a") is None


def plan_doc(tmp_path, capsys, router: str, *argv: str, text: bool = False):
    (tmp_path / "ssh_config").write_text(SSH_CONFIG)
    path = tmp_path / "deployctl.yaml"
    path.write_text(f"ssh: {{config_file: {tmp_path / 'ssh_config'}}}\n" + BASE +
                    f"    serve_host: 0.0.0.0\n    router: {router}\n")
    code = main(["-c", str(path), "plan", *argv] + ([] if text else ["--json"]))
    out = capsys.readouterr().out
    assert code == 0, out
    return out if text else json.loads(out)


def test_plan_shows_each_worker_url_from_the_resolved_hostname(tmp_path, capsys):
    doc = plan_doc(tmp_path, capsys, "{host: a}")
    urls = {"a": "http://10.0.0.1:30000", "b": "http://10.0.0.2:30000", "c": "http://10.0.0.3:30000"}
    assert doc["fleet"]["router"]["workers"] == urls
    assert doc["fleet"]["router"]["argv"][-3:] == list(urls.values())
    reach = next(c for c in doc["fleet"]["phases"][0]["commands"] if " reach " in c["command"])
    assert all(u in reach["command"] for u in urls.values())
    router_calls = [c["command"] for p in doc["fleet"]["phases"] for c in p["commands"] if "fleet_ops" in c["command"]]
    assert router_calls and not [c for c in router_calls if "127.0.0.1:30000" in c]
    text = plan_doc(tmp_path, capsys, "{host: a}", text=True)
    assert "worker c: http://10.0.0.3:30000" in text


def test_plan_lists_every_port_the_router_binds(tmp_path, capsys):
    doc = plan_doc(tmp_path, capsys, "{host: a, extra_args: [--prometheus-port, '9100']}")
    assert doc["fleet"]["router"]["binds"] == ["10.0.0.1:30080 (router.port)",
                                               "0.0.0.0:9100 (--prometheus-port from extra_args)"]
    ports = next(c for c in doc["fleet"]["phases"][0]["commands"] if " ports " in c["command"])
    assert ports["command"].endswith(" 9100 30080") and "0.0.0.0:9100" in ports["description"]
    assert "binds: 10.0.0.1:30080 (router.port), 0.0.0.0:9100" in plan_doc(tmp_path, capsys, "{host: a, extra_args: [--prometheus-port, '9100']}", text=True)


# -- every port the router binds (priority 2) ---------------------------------------------------

from deploy.config.models import RouterSpec  # noqa: E402
from deploy.fleet.router_ports import option_value, parse_ports, port_problems, router_binds  # noqa: E402


def binds_of(extra_args=(), package=None, bind=None, address="10.0.0.1"):
    spec = RouterSpec(host="a", port=30080, bind=bind, extra_args=list(extra_args))
    return [(b.address, b.port) for b in router_binds(spec, Host(name="a", address=address), package)]


@pytest.mark.parametrize("extra,package,expected", [
    ((), "smg", [("10.0.0.1", 30080), ("0.0.0.0", 29000)]),               # both packages' default 29000
    ((), "sglang-router", [("10.0.0.1", 30080), ("0.0.0.0", 29000)]),
    (("--prometheus-port", "9100"), None, [("10.0.0.1", 30080), ("0.0.0.0", 9100)]),
    (("--prometheus-port=9101", "--prometheus-host", "127.0.0.1"), "smg", [("10.0.0.1", 30080), ("127.0.0.1", 9101)]),
    (("--prometheus-po", "9102"), "smg", [("10.0.0.1", 30080), ("0.0.0.0", 9102)]),   # argparse abbreviation
    (("--health-check-port", "8081"), "smg", [("10.0.0.1", 30080), ("0.0.0.0", 29000), ("10.0.0.1", 8081)]),
    (("--health-check-port", "8081"), "sglang-router", [("10.0.0.1", 30080), ("0.0.0.0", 29000)]),  # not its flag
    (("--enable-mesh",), "smg", [("10.0.0.1", 30080), ("0.0.0.0", 29000), ("0.0.0.0", 39527)]),
])
def test_router_binds_every_port_its_package_opens(extra, package, expected):
    assert binds_of(extra, package) == expected


def test_an_ipv6_router_gets_smgs_ipv6_metrics_default():
    assert binds_of((), "smg", address="fd00::1")[1] == ("::", 29000)
    assert binds_of((), "sglang-router", address="fd00::1")[1] == ("0.0.0.0", 29000)


def test_option_value_reads_argparse_forms_and_not_an_ambiguous_prefix():
    assert option_value(["--prometheus-port", "1", "--prometheus-port=2"], "--prometheus-port") == "2"
    assert option_value(["--prometheus-", "1"], "--prometheus-port") is None   # ambiguous: argparse refuses it
    assert option_value(["--log-level", "warn"], "--prometheus-port") is None


def test_a_bad_port_in_extra_args_is_a_config_error():
    from deploy.base.errors import ConfigError

    with pytest.raises(ConfigError, match="--prometheus-port 'x'"):
        binds_of(("--prometheus-port", "x"), "smg")


def test_a_taken_metrics_port_names_its_holder_and_the_router_own_is_fine():
    spec = RouterSpec(host="a", port=30080)
    binds = router_binds(spec, Host(name="a", address="10.0.0.1"), "smg")
    got = {"ports": [{"port": 30080, "listeners": [{"address": "10.0.0.1", "holders": [
                          {"pid": 7, "cmdline": "smg::router", "router": True}]}], "errors": []},
                     {"port": 29000, "listeners": [{"address": "127.0.0.1", "holders": [
                          {"pid": 4242, "cmdline": "node_exporter --web.listen-address=:29000", "router": False}]}],
                      "errors": []}]}
    fine, taken = port_problems(binds, parse_ports(got, binds, "a"))
    assert fine == ["10.0.0.1:30080 (router.port): the router deployctl started listens there"]
    assert len(taken) == 1 and "0.0.0.0:29000" in taken[0] and "pid 4242 (node_exporter" in taken[0]
    got["ports"][1]["listeners"][0]["holders"] = []  # no holder visible here: still taken
    assert "cannot see" in port_problems(binds, parse_ports(got, binds, "a"))[1][0]
    # issue 37: the socket's owner says whose it is: another user's, or the deploy user's own in a container
    got["ports"][1]["listeners"][0]["uid"] = 1000
    assert "uid 1000, another user's" in port_problems(binds, parse_ports(got, binds, "a"), uid=0)[1][0]
    mine = port_problems(binds, parse_ports(got, binds, "a"), uid=1000)[1][0]
    assert "of the deploy user (uid 1000)" in mine and "another PID namespace" in mine and "another user" not in mine
    with pytest.raises(Exception, match="unexpected output"):
        parse_ports({"ports": [got["ports"][0]]}, binds, "a")


def test_fleet_ops_ports_finds_a_listener_and_its_holder(tmp_path):
    import socket
    import subprocess
    import sys

    from deploy.fleet.router import FLEET_OPS, fleet_ops_program

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        for argv in ([sys.executable, str(FLEET_OPS)], [sys.executable, "-c", fleet_ops_program()]):
            # run from a file, and sent inline with listeners.py as the router host gets it
            out = subprocess.run(argv + ["ports", str(tmp_path / "none.pid"), str(port)], capture_output=True,
                                 text=True, timeout=60, check=True).stdout
            [entry] = json.loads(out)["ports"]
            [li] = entry["listeners"]
            assert li["address"] == "127.0.0.1"
            import os

            assert [h["pid"] for h in li["holders"]] == [os.getpid()] and li["holders"][0]["router"] is False
    finally:
        listener.close()


# -- the router watched during a roll (priority 3) ----------------------------------------------

from types import SimpleNamespace  # noqa: E402

from deploy.base.errors import ExitCode, RemoteOutputError, StepTimeout  # noqa: E402
from deploy.fleet.router_watch import RouterLost, restart_with_healthy, watch  # noqa: E402
from deploy.fleet.phases import Rotation  # noqa: E402


class FakeRouter:
    def __init__(self, states, healthy=()):
        self.states, self.healthy_urls, self.started = list(states), set(healthy), []
        self.host, self.url = SimpleNamespace(name="a"), "http://10.0.0.1:30080"

    def state(self):
        return RouterState.model_validate(self.states.pop(0) if len(self.states) > 1 else self.states[0])

    def log_tail(self):
        return "\x1b[31mERROR\x1b[0m panicked"

    def healthy(self, url):
        return url in self.healthy_urls

    def start(self, urls, stamp):
        self.started.append(list(urls))
        return 999


def fake_state():
    from deploy.fleet.phases import FleetMemory

    return SimpleNamespace(memory=FleetMemory(), reports={}, rotation={}, stamp="s")


ALIVE = {"pid": 10, "alive": True, "status": 200}


def test_a_router_never_seen_is_not_running_yet_and_one_seen_then_gone_stops_the_roll():
    state = fake_state()
    assert watch(state, FakeRouter([{"pid": None, "alive": False}]), "x") is None
    assert watch(state, FakeRouter([ALIVE]), "x") == RouterState(**ALIVE) and state.memory.router_pid == 10
    for gone, fragment in (({"pid": 10, "alive": False}, "died"), ({"pid": 11, "alive": True, "status": 200}, "replaced"),
                           ({"pid": 10, "alive": True, "status": None}, "stopped answering")):
        with pytest.raises(RouterLost) as lost:
            watch(state, FakeRouter([gone]), "before taking b out")
        assert fragment in str(lost.value) and "before taking b out" in str(lost.value)
        assert lost.value.exit_code == ExitCode.ROUTER_LOST == 14
        assert "keeps serving" in str(lost.value)
    # a live router that never answered when the run began: refused before anything is taken out
    with pytest.raises(RouterLost, match="nothing was taken out"):
        watch(fake_state(), FakeRouter([{"pid": 3, "alive": True, "status": 503}]), "x")


def test_a_restarted_router_gets_every_healthy_replica_not_only_the_batch():
    state = fake_state()
    hosts = [Host(name=n, address=f"10.0.0.{i}") for i, n in enumerate("abc", 1)]
    url = {h.name: f"http://{h.address}:30000" for h in hosts}
    state.reports = {"b": object()}          # b was the batch being redeployed and failed
    state.rotation = {"b": Rotation(out=1.0), "a": Rotation(out=0.5, back=0.7)}
    router = FakeRouter([ALIVE], healthy=set(url.values()))
    text = restart_with_healthy(state, router, hosts, lambda h: url[h.name], lambda h: h.name != "b")
    assert router.started == [[url["a"], url["c"]]] and state.memory.router_pid == 999
    assert "restarted (pid 999)" in text and url["c"] in text
    router = FakeRouter([ALIVE], healthy={url["c"]})       # a does not answer /health now
    restart_with_healthy(fake_state(), router, hosts, lambda h: url[h.name], lambda h: True)
    assert router.started == [[url["c"]]]
    assert "not restarted" in restart_with_healthy(fake_state(), FakeRouter([ALIVE]), hosts, lambda h: url[h.name],
                                                   lambda h: True)


def test_a_router_restart_ends_the_rotation_clock_only_of_replicas_still_out():
    # issue 37: after a router killed mid-roll was started again, the report said host1 was out of
    # rotation 43-44 s; a poller outside saw 19-22 s: host1's clock, back in since batch 1, restarted
    state = fake_state()
    hosts = [Host(name=n, address=f"10.0.0.{i}") for i, n in enumerate("abc", 1)]
    url = {h.name: f"http://{h.address}:30000" for h in hosts}
    state.rotation = {"a": Rotation(out=1.0, back=20.0), "b": Rotation(out=30.0), "c": Rotation(kept=2.0)}
    restart_with_healthy(state, FakeRouter([ALIVE], healthy=set(url.values())), hosts, lambda h: url[h.name],
                         lambda h: True)
    assert state.rotation["a"] == Rotation(out=1.0, back=20.0)
    assert state.rotation["b"].back > 30.0 and state.rotation["c"].back is None
    state.rotation = {"a": Rotation(out=40.0, back=20.0)}  # back in, then out again (a later batch): in again now
    restart_with_healthy(state, FakeRouter([ALIVE], healthy=set(url.values())), hosts, lambda h: url[h.name],
                         lambda h: True)
    assert state.rotation["a"].back > 40.0


# -- router log tails without escapes (priority 6) ------------------------------------------------

from deploy.base.terminal import strip_escapes  # noqa: E402

SMG_LOG = ("\x1b[2m2026-12-01T10:00:00.123Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2msmg::server\x1b[0m\x1b[2m:\x1b[0m "
           "Starting router on 127.0.0.10:30080\r\n"
           "\x1b[2m2026-12-01T10:00:01.000Z\x1b[0m \x1b[31mERROR\x1b[0m thread 'main' panicked\n")


@pytest.mark.parametrize("raw,words", [
    (SMG_LOG, "2026-12-01T10:00:00.123Z  INFO smg::server: Starting router on 127.0.0.10:30080\n"
              "2026-12-01T10:00:01.000Z ERROR thread 'main' panicked\n"),
    ("\x1b]0;owned\x07title\x1b]52;c;Zm9v\x1b\\clip", "titleclip"),        # OSC to BEL and to ST
    ("\x9b31mC1 CSI\x9b0m, CR\rover, lone \x1b", "C1 CSI, CRover, lone "),
    ("tab\tand\nnewline kept", "tab\tand\nnewline kept"),
])
def test_router_log_tails_lose_every_escape_sequence(raw, words):
    assert strip_escapes(raw) == words


def test_a_failed_phase_keeps_the_log_tail_on_its_progress_line_and_in_the_record():
    from deploy.base.errors import DeployError
    from deploy.fleet.phases import Barrier

    said: list[str] = []
    records: list = []
    barrier = Barrier(records, lambda host, step, message: said.append(message), 1)
    error = RouterLost("a: the router (pid 7) died; its log ends:\n" + strip_escapes(SMG_LOG))
    barrier.failed("batch 2/3 router-add b", error, 0.0, detail=str(error))
    assert "thread 'main' panicked" in said[0] and "its log ends: | 2026-12-01" in said[0]
    assert records[0].detail == str(error) and records[0].exit_code == 14
    assert isinstance(error, DeployError)


# -- out of rotation from when the router stops routing (priority 4) --------------------------------

def _members_line(workers: list[dict], alive: bool = True) -> dict:
    """One line of the host-side loop ``fleet_ops.py poll ... members``."""
    return {"state": {"alive": alive, "pid": 10}, "workers": {"status": 200, "body": json.dumps({"workers": workers})}}


def _seen(line: dict) -> dict:
    """A membership line as ``MembershipWait.observe`` gets it (parsed strictly, facts/router.py)."""
    got = MembersLine.model_validate(line)
    return {"state": got.state, "workers": got.workers}


def test_out_of_rotation_starts_when_smg_lists_the_removed_worker_unhealthy_not_when_it_leaves():
    from deploy.fleet.router import MembershipWait

    url = "http://10.0.0.2:30000"
    # smg after DELETE: listed healthy once (the removal is queued), then unhealthy through its 5 s
    # drain settle (sent nothing new), then gone; one observation every 0.2 s from 100.0
    lists = [[{"url": url, "is_healthy": True}]] + [[{"url": url, "is_healthy": False}]] * 26 + [[]]
    wait = MembershipWait("a", "/workers", set(), frozenset({url}), False, None, 160.0, 60)
    decided = [wait.observe(**_seen(_members_line([{"id": "1", **w} for w in workers])), polled=100.0 + 0.2 * i)
               for i, workers in enumerate(lists)]
    assert decided == [False] * 27 + [True]
    assert wait.done_at == pytest.approx(100.2)                       # 5.2 s earlier than "gone" (105.4)
    out_only = MembershipWait("a", "/workers", set(), frozenset({url}), True, None, 160.0, 60)
    assert [out_only.observe(**_seen(_members_line([{"id": "1", **w} for w in workers])), polled=100.0 + 0.2 * i)
            for i, workers in enumerate(lists[:2])] == [False, True] and out_only.done_at == pytest.approx(100.2)


def test_a_membership_wait_names_a_dead_router_and_times_out_naming_what_it_waited_for():
    from deploy.fleet.router import MembershipWait

    url = "http://10.0.0.2:30000"
    started = MembershipWait("a", "/workers", {url}, frozenset(), False, 10, 160.0, 60)
    assert started.observe(**_seen(_members_line([], alive=False)), polled=100.0) and started.died == "launched"
    gone = MembershipWait("a", "/workers", {url}, frozenset(), False, None, 160.0, 60)
    refused = {"state": {"alive": False, "pid": None}, "workers": {"status": None, "error": "refused", "body": ""}}
    assert gone.observe(**_seen(refused), polled=100.0) and gone.died == "membership"
    late = MembershipWait("a", "/workers", {url}, frozenset(), False, None, 160.0, 60)
    assert not late.observe(**_seen(_members_line([{"id": "1", "url": url, "is_healthy": False}])), polled=159.9)
    with pytest.raises(StepTimeout, match=r"after 60 s: waiting for \['http://10.0.0.2:30000'\]"):
        late.observe(**_seen(_members_line([{"id": "1", "url": url, "is_healthy": False}])), polled=160.1)


def test_a_drain_ends_at_zero_twice_a_quarter_second_apart_or_when_the_worker_does_not_answer():
    from deploy.fleet.router import DrainWait

    def loads(n):
        return HttpAnswer(status=200, body=json.dumps({"loads": [{"num_running_reqs": n, "num_waiting_reqs": 0}]}))

    drain = DrainWait("http://w", 30, 100.0)
    answers = [loads(2), loads(0), loads(1), loads(0), loads(0), loads(0), loads(0)]
    decided = [drain.observe(got, 100.1 + 0.1 * i) for i, got in enumerate(answers)]
    assert decided == [False] * 6 + [True] and drain.seconds == pytest.approx(0.7)  # zero at 100.4, again 100.7
    silent = DrainWait("http://w", 30, 100.0)
    assert silent.observe(HttpAnswer(status=None, error="refused", body=""), 100.1) and silent.seconds == pytest.approx(0.1)
    busy = DrainWait("http://w", 30, 100.0)
    with pytest.raises(StepTimeout, match="still 2 request"):
        busy.observe(loads(2), 130.1)
    with pytest.raises(RemoteOutputError, match="/v1/loads answered"):
        DrainWait("http://w", 30, 100.0).observe(HttpAnswer(status=200, body="{}"), 100.1)


def test_a_roll_removes_without_waiting_out_smgs_drain_settle_and_waits_for_it_before_the_add(monkeypatch):
    """remove(settle=False) returns at the first poll that lists the worker unhealthy; settled(), called
    by router-add, waits until it left the list (smg refuses to add a URL it still lists)."""
    from deploy.fleet import router as router_module
    from deploy.fleet.router import RouterHost

    clock = {"now": 100.0}
    monkeypatch.setattr(router_module.time, "monotonic", lambda: clock["now"])
    url = "http://10.0.0.2:30000"
    lists = [[{"url": url, "is_healthy": True}]] * 2 + [[{"url": url, "is_healthy": False}]] * 26 + [[]]
    sent, loops = [], []
    host = Host(name="a", address="10.0.0.1")
    router = RouterHost(SimpleNamespace(), host, Run(name="r", hosts=["a"], base_model="/m", drafter="/d",
                                                     router=RouterSpec(host="a")))
    router.package = lambda: SimpleNamespace(workers_api=True)
    router.workers = lambda: [Worker(id="1", **w) for w in lists.pop(0)]
    router._do = lambda call: sent.append(call) or {"status": 202, "body": ""}

    def poll(call, observe):  # the host-side loop: one line every 0.2 s
        loops.append(call.command)
        while True:
            clock["now"] += 0.2
            if observe(_members_line([{"id": "1", **w} for w in lists.pop(0)]), clock["now"]):
                return

    router._poll = poll
    out = router.remove(url, settle=False)
    assert out == pytest.approx(100.4) and clock["now"] == pytest.approx(100.4)  # out of rotation, still listed
    assert router.leaving == {url} and len(sent) == 1 and len(loops) == 1
    clock["now"] += 3.0                                                           # the drain and redeploy
    router.settled()
    assert not lists and router.leaving == set() and clock["now"] == pytest.approx(108.6)
    router.settled()                                                              # nothing left: no poll
    assert clock["now"] == pytest.approx(108.6) and len(loops) == 2


# -- the running router's package (priority 5) --------------------------------------------------

from deploy.fleet.router_package import RouterPackage, package_text, running_package  # noqa: E402


@pytest.mark.parametrize("cmdline,package", [
    ("smg::router", "smg"), ("/opt/smg/bin/python -m smg.launch_router --host 10.0.0.1", "smg"),
    ("sglang::router", "sglang-router"), ("python3 -m sglang_router.launch_router --port 30080", "sglang-router"),
    ("python3 -m http.server", None), ("", None),
])
def test_the_running_routers_package_is_read_from_its_command_line(cmdline, package):
    assert running_package(cmdline) == package


def test_doctor_and_gpu_status_name_the_running_package_and_the_installed_one_when_they_differ():
    smg = RouterPackage("smg", "1.13.0")
    assert package_text("smg", smg) == "smg 1.13.0"
    text = package_text("sglang-router", smg)
    assert text.startswith("sglang-router (the running router's") and "installed for router.python: smg 1.13.0" in text
    assert package_text(None, smg) == "smg 1.13.0" and package_text("smg", None) == "smg"


def test_the_batch_that_puts_back_restarts_a_dead_router_but_never_one_that_is_alive():
    from deploy.fleet.router_watch import lost_or_restarted

    hosts = [Host(name="a", address="10.0.0.1"), Host(name="b", address="10.0.0.2")]
    url = {"a": "http://10.0.0.1:30000", "b": "http://10.0.0.2:30000"}
    args = (hosts, lambda h: url[h.name], lambda h: True)
    state = fake_state()
    state.memory.router_pid = 10
    assert lost_or_restarted(state, FakeRouter([ALIVE]), "x", *args) is None          # as the run left it
    dead = FakeRouter([{"pid": 10, "alive": False}], healthy=set(url.values()))
    with pytest.raises(RouterLost) as lost:                                            # first to see it: stops
        lost_or_restarted(state, dead, "while b was redeployed", *args)
    assert "died while b was redeployed" in str(lost.value) and "restarted (pid 999)" in str(lost.value)
    assert dead.started == [list(url.values())]
    state = fake_state()
    state.memory.router_pid, state.memory.router_died = 10, True                                 # an earlier phase saw it
    again = FakeRouter([{"pid": None, "alive": False}], healthy={url["a"]})
    assert "restarted" in lost_or_restarted(state, again, "x", *args) and again.started == [[url["a"]]]
    hung = FakeRouter([{"pid": 10, "alive": True, "status": None}])
    state = fake_state()
    state.memory.router_pid = 10
    with pytest.raises(RouterLost, match="stopped answering"):
        lost_or_restarted(state, hung, "x", *args)
    assert hung.started == []


def test_the_router_hosts_log_tail_reaches_messages_as_words():
    from deploy.fleet.router import RouterHost

    class Conn:
        def run(self, command, timeout=None):
            assert command.startswith("tail -n 30 -- ")
            return SimpleNamespace(stdout=SMG_LOG, exit_code=0)

    router = RouterHost.__new__(RouterHost)
    router.conn, router.calls = Conn(), SimpleNamespace(log_tail=lambda n: SimpleNamespace(command=f"tail -n {n} -- x"))
    tail = router.log_tail()
    assert "\x1b" not in tail and "\r" not in tail and tail.endswith("ERROR thread 'main' panicked")


def test_a_preflight_refusal_says_its_cause_on_the_progress_line():
    # issue 37: with --json the one stderr line ended at "...each keeps serving what it served:"
    from deploy.fleet.phases import Barrier, PhaseRecord
    from deploy.fleet.rolling import PreflightFailed

    records: list[PhaseRecord] = []
    said: list[str] = []
    barrier = Barrier(records, lambda host, step, message: said.append(message), 1)
    error = PreflightFailed("fleet pre-flight failed; no replica was stopped, each keeps serving what it served:\n"
                            "sb1: router-port: 0.0.0.0:29000 is taken\nsb2: serve_host 127.0.0.1 is a loopback address")
    barrier.failed("pre-flight", error, 0.0, detail=str(error))
    assert "what it served: | sb1: router-port: 0.0.0.0:29000 is taken | sb2: serve_host" in said[0]
    assert records[0].exit_code == 8


@pytest.mark.parametrize("owner,deploy_uid,words", [
    (1000, 1000, "of the deploy user (uid 1000) that is not visible here"),
    (0, 1000, "uid 0, another user's"),
    (None, 1000, "another user's, or in another PID namespace"),
    (1000, None, "uid 1000, another user's")])
def test_a_listener_no_visible_process_holds_is_named_by_its_owner(owner, deploy_uid, words):
    """The doctor's serve-port and the router's port checks say the same (deploy/host/sglang_argv.py)."""
    from deploy.host.sglang_argv import unseen_holder

    assert words in unseen_holder(owner, deploy_uid)


def test_fleet_ops_ports_reports_each_listeners_owner_uid(tmp_path):
    import os
    import socket

    from deploy.remote import fleet_ops

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        got = fleet_ops.ports(str(tmp_path / "router.pid"), [port])
    assert got["uid"] == os.getuid()
    assert [li["uid"] for li in got["ports"][0]["listeners"]] == [os.getuid()]
