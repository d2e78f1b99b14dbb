"""Each run-level phase is one builder: the run sends only what its plan lists, phase by phase.

The phases of a fleet (fleet/rolling.py ``fleet_phases``, down's ``down_remove`` / ``down_stop``)
are walked twice here from the same values: by ``plan`` (fleet/plan.py ``phase_plan``, a
PlanContext) and by the run (``RunPhase.action``, a RunContext) against a real ``RouterHost`` whose
connection is a router simulated from a table of answers (smg or sglang-router older than 0.3,
running or not, dying mid-roll). Every command the run sends to the router host during a phase
must be one the plan lists for that phase (the plan's ``<placeholders>`` stand for run-time
values: a worker's id, the launch stamp, the router's launcher module). No SSH.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.base.errors import DeployError
from deploy.config import load_config
from deploy.host.records import LastGood
from deploy.engine.playbook import load_playbook
from deploy.engine.records import RunOptions
from deploy.fleet.phases import HostPhase, RunState
from deploy.fleet.plan import plan_fleet
from deploy.facts.router import DownRouter, EndToEnd, Worker
from deploy.fleet.rolling import down_remove, down_stop, fleet_phases
from deploy.fleet.rollout import Rollout
from deploy.fleet.router import RouterCalls, RouterHost

CONFIG = """\
hosts:
  - {name: a, address: 10.0.0.1, groups: [g]}
  - {name: b, address: 10.0.0.2, groups: [g]}
  - {name: c, address: 10.0.0.3, groups: [g]}
runs:
  - name: r
    base_model: /m
    drafter: /d
    group: g
    router: {host: a}
"""
URLS = {"a": "http://10.0.0.1:30000", "b": "http://10.0.0.2:30000", "c": "http://10.0.0.3:30000"}
STAMP = "20261204-170000"


def as_planned(command: str) -> str:
    """The 20 kB inline fleet_ops.py program shown by name, as ``plan`` shows it."""
    from deploy.base.shell import quote
    from deploy.fleet.router import fleet_ops_program

    return command.replace(quote(fleet_ops_program()), "<deploy/remote/fleet_ops.py>")


class SimulatedRouter:
    """The router host as fleet_ops.py and the start command answer it, from a small table: which
    package (smg: /workers; sglang-router 0.2: /list_workers), running or not, its workers; ``die_after``:
    the router process is gone from the n-th router-state read on."""

    def __init__(self, package: str = "smg", running: bool = True, die_after: int | None = None):
        self.modern = package == "smg"
        self.packages = {"smg": "1.13.0", "sglang-router": None} if self.modern else \
            {"smg": None, "sglang-router": "0.2.4"}
        self.alive, self.pid = running, 4242 if running else None
        self.workers = {u: str(i) for i, u in enumerate(URLS.values())} if running else {}
        self.die_after, self.states = die_after, 0
        self.sent: list[str] = []
        self.cancelled = None
        self.metrics = [{"at": float(i), "reads": {u: {"status": 200, "error": None, "lines": [
            f'sglang:spec_accept_length{{model_name="k"}} {3.0 * (1 + 0.1 * ((i * 7919) % 13) / 13)}',
            f'sglang:num_requests_total{{model_name="k"}} {i * 10}',
            f'sglang:inter_token_latency_seconds_sum{{model_name="k"}} {i * 0.1}',
            f'sglang:inter_token_latency_seconds_count{{model_name="k"}} {i * 10}']} for u in URLS.values()}}
            for i in range(31)]

    # -- what fleet_ops.py answers ------------------------------------------------------------

    def _listing(self) -> str:
        if self.modern:
            return json.dumps({"workers": [{"id": i, "url": u, "is_healthy": True} for u, i in self.workers.items()]})
        return json.dumps({"urls": list(self.workers)})

    def _request(self, method: str, url: str, body: str | None) -> dict:
        path = url.split(":30080", 1)[-1] if ":30080" in url else None
        if path in ("/workers", "/list_workers") and method == "GET":
            return {"status": 200, "body": self._listing()}
        if path is not None and path.startswith("/workers/") and method == "DELETE":
            self.workers = {u: i for u, i in self.workers.items() if i != path.rsplit("/", 1)[1]}
            return {"status": 202, "body": ""}
        if path == "/workers" and method == "POST":
            self.workers[json.loads(body or "{}")["url"]] = str(len(self.workers) + 10)
            return {"status": 202, "body": ""}
        if path is not None and path.startswith(("/add_worker?url=", "/remove_worker?url=")):
            worker = path.split("url=", 1)[1]
            if path.startswith("/add_worker"):
                self.workers[worker] = worker
            else:
                self.workers.pop(worker, None)
            return {"status": 200, "body": ""}
        if path == "/generate":
            return {"status": 200, "body": json.dumps({"text": "ok"})}
        if url.endswith("/health"):
            return {"status": 200, "body": ""}
        raise AssertionError(f"the simulated router has no answer for {method} {url}")

    def _state(self) -> dict:
        self.states += 1
        if self.die_after is not None and self.states >= self.die_after:
            self.alive = False
        if not self.alive:
            return {"alive": False, "pid": None, "status": None}
        return {"alive": True, "pid": self.pid, "status": 200, "body": self._listing(), "cmdline": "smg::router"}

    def _answer(self, command: str) -> str:
        command = as_planned(command)
        self.sent.append(command)
        if command.startswith("tail -n"):
            return "the router's last words"
        if command.startswith("mkdir -p"):  # the router's start command
            words = shlex.split(command.split("setsid nohup", 1)[1])
            urls = words[words.index("--worker-urls") + 1:]
            urls = urls[:next((i for i, w in enumerate(urls) if not w.startswith("http")), len(urls))]
            self.alive, self.pid, self.die_after = True, 5151, None
            self.workers = {u: str(i) for i, u in enumerate(urls)}
            return str(self.pid)
        words = shlex.split(command)
        op, args = words[words.index("<deploy/remote/fleet_ops.py>") + 1], words[words.index(
            "<deploy/remote/fleet_ops.py>") + 2:]
        if op == "router-packages":
            return json.dumps({"packages": self.packages})
        if op == "router-state":
            return json.dumps(self._state())
        if op == "ports":
            return json.dumps({"ports": [{"port": int(p), "listeners": []} for p in args[1:]], "uid": 1000})
        if op == "reach":
            return json.dumps({"reach": [{"url": u, "reachable": True} for u in args[:args.index("--timeout")]]})
        if op == "stop-router":
            self.alive = False
            return json.dumps({"pid": self.pid, "stopped": True, "signal": "TERM", "note": ""})
        if op == "request":
            return json.dumps(self._request(args[0], args[1], args[2] if len(args) > 2 and args[2] != "--timeout"
                                            else None))
        raise AssertionError(f"the simulated router host has no answer for {command[:200]}")

    # -- the connection RouterHost talks through ---------------------------------------------------

    def check(self, command: str, timeout=None, what=None, stdin=None):
        return SimpleNamespace(stdout=self._answer(command), stderr="", exit_code=0)

    run = check

    def watch(self, command: str, on_line, timeout=None, cancelled=None):
        command = as_planned(command)
        self.sent.append(command)
        words = shlex.split(command)
        if " metrics " in command:  # the canary's window: every replica's figures, the canary keeping up
            for line in self.metrics:
                if on_line(json.dumps(line)):
                    break
        elif " members " in command:
            while not on_line(json.dumps({"state": self._state_quiet(), "workers": {
                    "status": 200 if self.alive else None, "body": self._listing()}})):
                pass
        else:  # a drain: the worker answers no load
            on_line(json.dumps({"status": 503, "body": ""}))
        assert words
        return SimpleNamespace(exit_code=None, stderr="")

    def _state_quiet(self) -> dict:
        return {"alive": self.alive, "pid": self.pid}


def setting(tmp_path: Path, verb: str, router: SimulatedRouter, hosts: tuple[str, ...] = (), extra: str = ""):
    path = tmp_path / "deployctl.yaml"
    path.write_text(CONFIG + extra)
    config = load_config(path)
    run = config.runs[0]
    rollout = Rollout.of(run, config.hosts_of(run), verb, host_names=hosts)
    endpoints = {h.name: {"hostname": {"value": h.address}} for h in config.hosts}
    state = RunState(config, run, None, RunOptions(command=verb), lambda *a: None, None,  # type: ignore[arg-type]
                     threading.Event(), STAMP)
    state.memory.addresses = {h.name: h.address for h in config.hosts}
    state.router = RouterHost(router, config.host("a"), run)
    return config, rollout, endpoints, state


def _words(command: str) -> tuple[str, ...]:
    return tuple(shlex.split(command.replace("~/", "/HOME/")))


def _word_matches(planned: str, done: str) -> bool:
    """A planned shell word against a sent one; a ``<placeholder>`` stands for a run-time value."""
    if planned == done:
        return True
    parts = re.split(r"(<[^<>]+>)", planned)
    if len(parts) == 1:
        return False
    return re.fullmatch("".join(".+?" if re.fullmatch(r"<[^<>]+>", p) else re.escape(p) for p in parts), done,
                        re.DOTALL) is not None


def unplanned(planned: list[str], sent: list[str]) -> list[str]:
    wanted = [_words(p) for p in planned]
    return [c for c in sent if not any(len(w) == len(_words(c)) and all(map(_word_matches, w, _words(c)))
                                       for w in wanted)]


def walk(state: RunState, router: SimulatedRouter, phases, planned: list[dict]) -> dict[str, list[str]]:
    """Run each phase as the run does; per phase, what it sent to the router host that its plan
    does not list. A HostPhase's hosts are taken to serve what they were given (``ok``)."""
    found: dict[str, list[str]] = {}
    by_name = {p["phase"]: p for p in planned}
    for phase in phases:
        if isinstance(phase, HostPhase):
            for host in phase.hosts:
                state.reports[host.name] = SimpleNamespace(outcome="ok", error=None, facts={})  # type: ignore
            continue
        before = len(router.sent)
        try:
            phase.action(state)
        except DeployError as exc:
            found.setdefault("raised", []).append(f"{phase.name}: {type(exc).__name__}")
        commands = [c["command"] for c in by_name[phase.name]["commands"] if c["host"] == "a"]
        found[phase.name] = unplanned(commands, router.sent[before:])
    return found


@pytest.fixture(autouse=True)
def no_replica_is_reached(monkeypatch):
    """The probe's and the doctor's reads go to the replicas on connections of their own: here each
    replica is found to redeploy and its doctor passes (their commands are planned per host)."""
    class Quiet:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def run(self, command, timeout=None, **kwargs):  # the canary mark's PID read, its removal
            return SimpleNamespace(stdout="4242" if command.startswith("head -c 64") else "", stderr="", exit_code=0)

        check = run  # the canary mark's write

    monkeypatch.setattr("deploy.fleet.rolling._unchanged", lambda state, host: ("redeploy", "changed"))
    monkeypatch.setattr("deploy.ssh.transport.HostConnection", Quiet)
    monkeypatch.setattr("deploy.steps.doctor.diagnose", lambda *a, **k: ([], None))
    monkeypatch.setattr("deploy.facts.server.parse_record",
                        lambda *a, **k: LastGood(argv=["python3"], drafter_path="/d-last-good"))


CASES = [  # (verb, the simulated router, what the run must end with)
    ("up", dict(running=False), None),                       # a first up: the router starts with batch 1
    ("restart", dict(), None),                               # smg: /workers, DELETE /workers/{id}
    ("restart", dict(package="sglang-router"), None),        # older than 0.3: /list_workers, /remove_worker
    ("restart", dict(die_after=4), "RouterLost"),            # dies mid-roll: restarted with every healthy one
]


@pytest.mark.parametrize("verb,answers,raised", CASES, ids=["first-up", "smg", "sglang-router-0.2", "router-dies"])
def test_every_router_command_a_fleet_run_sends_is_one_its_plan_lists_for_that_phase(tmp_path, verb, answers,
                                                                                        raised):
    router = SimulatedRouter(**answers)
    config, rollout, endpoints, state = setting(tmp_path, verb, router)
    playbook = rollout.playbook(load_playbook(verb))
    planned = plan_fleet(config, rollout, load_playbook(verb), endpoints)["phases"]
    found = walk(state, router, fleet_phases(rollout, playbook), planned)
    raised_names = found.pop("raised", [])
    assert {p: c for p, c in found.items() if c} == {}
    assert len(router.sent) > 10
    if raised is None:
        assert raised_names == [] and state.memory.end_to_end == EndToEnd(text="ok")
    else:
        assert any(raised in r for r in raised_names), raised_names
        assert router.alive  # the router that died was started again (router-add, after the failure too)


def test_a_canary_rolls_window_sends_only_what_its_plan_lists(tmp_path):
    # the canary's last good read and its window (marks, every replica's metrics, the decision: promoted)
    router = SimulatedRouter()
    extra = "    rollout: {canary: {window: 30, interval: 1, min_requests: 50}}\n"
    config, rollout, endpoints, state = setting(tmp_path, "restart", router, extra=extra)
    assert rollout.canary is not None
    playbook = rollout.playbook(load_playbook("restart"))
    planned = plan_fleet(config, rollout, load_playbook("restart"), endpoints)["phases"]
    found = walk(state, router, fleet_phases(rollout, playbook), planned)
    assert found.pop("raised", []) == [] and {p: c for p, c in found.items() if c} == {}
    window = next(p for p in found if p.startswith("canary window"))
    assert state.memory.canary.action == "promoted" and window
    assert any(" metrics " in c for c in router.sent) and state.memory.end_to_end == EndToEnd(text="ok")


@pytest.mark.parametrize("hosts", [("b",), ()], ids=["down --host b", "down"])
def test_downs_router_phases_send_only_what_the_plan_of_down_lists(tmp_path, hosts):
    router = SimulatedRouter()
    config, rollout, endpoints, state = setting(tmp_path, "down", router, hosts)
    planned = plan_fleet(config, rollout, None, endpoints)["phases"]
    result = [DownRouter(host="a")]
    phase = down_remove(list(rollout.hosts), result) if hosts else down_stop(result)
    found = walk(state, router, [phase], planned)
    assert found == {phase.name: []} and router.sent
    assert (result[0].removed == [URLS["b"]] and URLS["b"] not in router.workers) if hosts else \
        (result[0].stopped and not router.alive)


def test_a_command_the_plan_does_not_list_is_found():
    # the check itself can fail: a removal of another worker, or a start with other workers, is unplanned
    calls = RouterCalls(load_config_text().runs[0].router, load_config_text().host("a"), planned=True)
    planned = [calls.remove(URLS["b"], "<worker id>", True).command, calls.remove(URLS["b"], "", False).command,
               calls.start([URLS["b"]], "router-<launch stamp>.log").command]
    sent = [calls.remove(URLS["b"], "7", True).command, calls.remove(URLS["c"], "", False).command,
            calls.start([URLS["c"]], "router-S.log").command]
    assert unplanned(planned, sent) == sent[1:]


def load_config_text():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deployctl.yaml"
        path.write_text(CONFIG)
        return load_config(path)


def test_the_last_healthy_worker_rule_is_one_function_both_refusals_ask():
    from deploy.base.errors import UsageError
    from deploy.fleet.rolling import LastHealthyWorker, last_healthy_worker
    from deploy.fleet.rollout import check_serial
    from deploy.fleet.router import empties_the_router

    assert empties_the_router(1, 0, False) and not empties_the_router(1, 0, True)
    assert not empties_the_router(1, 1, False) and not empties_the_router(0, 0, False)
    config = load_config_text()
    run, hosts = config.runs[0], config.hosts_of(config.runs[0])
    members = [Worker(id="1", url=URLS["a"], is_healthy=True), Worker(id="2", url=URLS["b"], is_healthy=False)]
    refused = last_healthy_worker(hosts[:1], members, [URLS["a"]], False)
    assert isinstance(refused, LastHealthyWorker) and "b" not in refused.args[0].split("members")[0]
    assert last_healthy_worker(hosts[:1], members, [URLS["a"]], True) is None
    assert last_healthy_worker(hosts[:1], members + [Worker(id="3", url=URLS["c"], is_healthy=True)], [URLS["a"]],
                               False) is None
    with pytest.raises(UsageError, match="nothing would serve"):
        check_serial(3, hosts, run, False)
    check_serial(2, hosts, run, False)
    check_serial(1, hosts[:1], run, False)  # a first up of one replica: decided when the batch starts


@pytest.mark.parametrize("nodes", [["a", "b"], ["c", "a", "b"]])
def test_a_node_groups_plan_lists_the_phases_its_run_takes_in_its_order(tmp_path, nodes):
    # the group's phases are one list (nodes.node_phases) that run_nodes runs and plan_nodes lists
    from deploy.fleet.nodes import _slices, node_phases, plan_nodes

    path = tmp_path / "deployctl.yaml"
    path.write_text(CONFIG.replace("    group: g\n    router: {host: a}\n", f"    nodes: {json.dumps(nodes)}\n"))
    config = load_config(path)
    run, playbook = config.runs[0], load_playbook("up")
    _, doc = plan_nodes(config, playbook, run, [config.host(n) for n in nodes], None)
    phases = doc["phases"]
    assert [p["phase"] for p in phases[:-1]] == [p.name for p in node_phases(_slices(playbook), nodes)]
    by_name = {p["phase"]: p for p in phases}
    assert {c["host"] for c in by_name[f"rank 0 dist-init port {nodes[0]}"]["commands"]} == {nodes[0]}
    assert {c["host"] for c in by_name["ranks 1+ alive"]["commands"]} == set(nodes[1:])
    assert by_name["ranks 1+ launch " + ",".join(nodes[1:])]["playbook_on"] == nodes[1:]
    assert phases[-1]["phase"].startswith("on failure after stop-stale")
