"""`plan` prints exactly what `run` executes: for every built-in playbook, against a sandbox host.

Every action a step performs goes through ``ctx.execute*`` (a unit test checks steps call nothing
else). Here those calls are recorded while the real verbs run over real sshd, and each one must be
the next matching action of the same step in ``deployctl plan``'s list: same kind and description,
the same command word for word, where a plan word may hold ``<placeholders>`` for values known only
at run time (the PID, the drafter's fingerprint, the log's timestamp). A planned action the run
skipped must say when it runs (``when``), unless its whole step was skipped.
"""

from __future__ import annotations

import functools
import json
import re
import shlex

import pytest

from deploy.config.loader import load_config
from deploy.engine.plan import plan_with_endpoints
from deploy.engine.playbook import load_playbook
from deploy.steps import base
from deploy.ssh import transport
from deploy.steps.base import Action, Command, Upload
from tests.integration.helpers import cli_json, write_config

pytestmark = pytest.mark.sandbox

PLACEHOLDER = re.compile(r"<[^<>]+>")
#: a run's timestamp (records.launch_stamp) in a file name: the plan's is taken when it is built, the
#: run's when it starts, and the two fall in different seconds often enough on a loaded machine
STAMP = re.compile(r"\d{8}T\d{6}Z")
HOST_LOCK = "hold the host lock (flock) for the whole run, on its own SSH channel; held elsewhere: exit 9"


@functools.lru_cache(maxsize=4096)
def _words(command: str) -> tuple[str, ...]:
    """A command's shell words, once per distinct command: a fleet run sends ~1,800 commands, many of
    them the 20 kB inline fleet_ops.py program, each compared with every planned command of its host;
    splitting them again for every pair took 72 s of this file's 120 (issue 26)."""
    return tuple(shlex.split(STAMP.sub("<stamp>", command.replace("~/", "/HOME/"))))


@functools.lru_cache(maxsize=4096)
def _word_pattern(planned: str) -> re.Pattern[str]:
    return re.compile("".join(".+?" if PLACEHOLDER.fullmatch(part) else re.escape(part)
                              for part in re.split(r"(<[^<>]+>)", planned)), re.DOTALL)


def _word_matches(planned: str, done: str) -> bool:
    if not PLACEHOLDER.search(planned):
        return planned == done
    return _word_pattern(planned).fullmatch(done) is not None


def same_action(planned: Action, done: Action) -> bool:
    if planned.kind != done.kind or planned.description != done.description or planned.to_dict().get("when") != \
            done.to_dict().get("when"):
        return False
    if isinstance(planned, Upload):
        assert isinstance(done, Upload)
        return planned.directory == done.directory and {f.remote for f in done.files} <= {f.remote for f in planned.files}
    want, got = _words(planned.shown), _words(done.shown)
    return len(want) == len(got) and all(_word_matches(w, g) for w, g in zip(want, got))


def check_run_follows_plan(plan: list[tuple[str, list[Action]]], journal: list[tuple[str, Action]],
                           ran_steps: dict[str, str]) -> None:
    planned = {name: actions for name, actions in plan}
    done: dict[str, list[Action]] = {}
    for step, action in journal:
        assert step in planned, f"step {step!r} ran an action but is not in the plan"
        done.setdefault(step, []).append(action)
    for step, actions in planned.items():
        performed = list(done.get(step, []))
        remaining = list(actions)
        for action in performed:
            while remaining and not same_action(remaining[0], action):
                skipped = remaining.pop(0)
                assert skipped.when is not None, f"{step}: planned {skipped.description!r} unconditionally, not run"
            assert remaining, f"{step}: ran {action.to_dict()} which the plan does not list (in this order)"
            remaining.pop(0)
        if ran_steps.get(step) == "ok":
            for skipped in remaining:
                assert skipped.when is not None, f"{step}: planned {skipped.description!r} unconditionally, not run"


@pytest.fixture
def recorder(monkeypatch):
    journal: list[tuple[str, Action]] = []

    def wrap(name):
        original = getattr(base.StepContext, name)

        def recorded(self, action, *args, **kwargs):
            journal.append((self.step, action))
            return original(self, action, *args, **kwargs)

        monkeypatch.setattr(base.StepContext, name, recorded)

    for name in ("execute", "execute_watch", "execute_upload"):
        wrap(name)
    original_hold = transport.HostConnection.hold

    def hold(self, command, **kwargs):
        journal.append(("host-lock", Command(description=HOST_LOCK, command=command)))
        return original_hold(self, command, **kwargs)

    monkeypatch.setattr(transport.HostConnection, "hold", hold)
    return journal


# (verb argv, playbook): a fresh deploy, a repeat (converged), a forced restart, bench, nightly, down
SEQUENCE = [
    (["up"], "up"),
    (["up"], "up"),
    (["restart", "--force"], "restart"),
    (["bench"], "bench"),
    (["nightly"], "nightly"),
    (["down"], "down"),
]


def test_every_builtin_playbook_runs_exactly_what_plan_lists(clean_sandbox, tmp_path, capsys, recorder):
    path = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    config = load_config(path)
    run = config.runs[0]
    hosts = [h for h in config.hosts if h.name == "sb1"]
    for argv, playbook_name in SEQUENCE:
        plans, _ = plan_with_endpoints(load_playbook(playbook_name), run, hosts, config)
        recorder.clear()
        code, doc = cli_json(capsys, "-c", str(path), *argv, "--json")
        assert code == 0, (argv, doc)
        report = doc["rounds"][0]["hosts"][0] if "rounds" in doc else doc["hosts"][0]
        ran = {s["step"]: s["status"] for s in report["steps"]}
        assert recorder, argv
        check_run_follows_plan(plans["sb1"], [(s.removeprefix("rollback/"), a) for s, a in recorder], ran)


# -- run-level plans: a fleet (router, rolling batches) and a node group ------------------------------


@pytest.fixture
def sent(monkeypatch):
    """Every command any connection sends, as (host name, command): steps, router calls, probes, reads."""
    log: list[tuple[str, str]] = []
    for name in ("run", "watch", "hold"):
        original = getattr(transport.Transport if name != "hold" else transport.HostConnection, name)

        def recorded(self, command, *args, _original=original, **kwargs):
            log.append((self.host.name, command))
            return _original(self, command, *args, **kwargs)

        monkeypatch.setattr(transport.Transport if name != "hold" else transport.HostConnection, name, recorded)
    return log


def _planned_commands(doc: dict) -> dict[str, list[str]]:
    """host -> every command ``deployctl plan --json`` lists for it: its playbook and the run's phases."""
    out: dict[str, list[str]] = {}
    for host in doc["hosts"]:
        out.setdefault(host["host"], []).extend(c["command"] for s in host["steps"] for c in s["commands"]
                                                if "command" in c)
    for phase in doc["fleet"]["phases"]:
        for c in phase["commands"]:
            if "command" in c:
                out.setdefault(c["host"], []).append(c["command"])
    return out


def _command_matches(planned: str, done: str) -> bool:
    want, got = _words(planned), _words(done)
    return len(want) == len(got) and all(_word_matches(w, g) for w, g in zip(want, got))


def check_every_command_planned(planned: dict[str, list[str]], log: list[tuple[str, str]]) -> None:
    unplanned = [(host, command[:300]) for host, command in log
                 if not any(_command_matches(p, command) for p in planned.get(host, []))]
    assert unplanned == [], f"sent but not in the plan: {unplanned}"


def test_a_fleet_sends_only_what_its_plan_lists(clean_sandbox, tmp_path, capsys, sent):
    """Router up (started with the first batch), a repeat (the probe keeps unchanged replicas in the
    router), a forced restart (each batch taken out, drained, redeployed, put back): every command
    sent to any host, router calls included, is one ``plan`` listed for that host."""
    from tests.integration.test_fleet import ROUTER_PYTHON, fleet_config

    if not ROUTER_PYTHON.is_file():
        pytest.skip(f"{ROUTER_PYTHON} missing: run tests/bootstrap.sh (installs sglang-router 0.3.2 there)")
    path = fleet_config(clean_sandbox, tmp_path)
    try:
        for argv in (["up"], ["up"], ["restart", "--force"]):
            # the plan of the same verb (its playbook: restart's fix-keys runs --when changed)
            code, doc = cli_json(capsys, "-c", str(path), *argv, "--dry-run", "--json")
            assert code == 0
            planned = _planned_commands(doc)
            kinds = " ".join(c["description"] for p in doc["fleet"]["phases"] for c in p["commands"])
            for needed in ("remove worker", "add worker", "start the router", "requests in flight",
                           "probe (read-only)", "one request through the router", "read the last good deployment"):
                assert needed in kinds, needed
            sent.clear()
            code, report = cli_json(capsys, "-c", str(path), *argv, "--json")
            assert code == 0, (argv, report.get("fleet"))
            # the router was talked to (fleet_ops.py, sent inline with listeners.py: its arguments show)
            assert any(" request GET " in c or " request POST " in c for _, c in sent), argv
            check_every_command_planned(planned, sent)
    finally:
        cli_json(capsys, "-c", str(path), "down", "--json")


def test_a_node_group_sends_only_what_its_plan_lists(clean_sandbox, tmp_path, capsys, sent):
    """Each node's launch carries its own --nnodes/--node-rank/--dist-init-addr in the plan, and the
    run sends exactly those argvs and nothing the plan does not list."""
    from tests.integration.test_fleet import nodes_config

    path = nodes_config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "plan", "--json")
    assert code == 0
    launches = {h["host"]: c["argv"] for h in doc["hosts"] for s in h["steps"] if s["step"] == "launch"
                for c in s["commands"] if c.get("argv")}
    addr = doc["fleet"]["dist_init_addr"]
    for rank, host in enumerate(("sb1", "sb2")):
        assert launches[host][-6:] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", addr]
    steps_of = {h["host"]: [s["step"] for s in h["steps"]] for h in doc["hosts"]}
    assert "wait-ready" in steps_of["sb1"] and "wait-ready" not in steps_of["sb2"]  # rank 1 serves no HTTP
    planned = _planned_commands(doc)
    try:
        sent.clear()
        code, report = cli_json(capsys, "-c", str(path), "up", "--json")
        assert code == 0, report.get("fleet")
        check_every_command_planned(planned, sent)
        for host in ("sb1", "sb2"):
            argv = json.loads(clean_sandbox.run(host, "cat ~/.deployctl/deployment.json").stdout)["argv"]
            want = launches[host]
            assert len(argv) == len(want) and all(_word_matches(p, a) for p, a in zip(want, argv)), (want, argv)
    finally:
        cli_json(capsys, "-c", str(path), "down", "--json")
