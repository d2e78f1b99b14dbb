"""`plan` prints exactly what `run` executes: for every built-in playbook, against a sandbox host.

Every action a step performs goes through ``ctx.execute*`` (a unit test checks steps call nothing
else). Here those calls are recorded while the real verbs run over real sshd, and each one must be
the next matching action of the same step in ``deployctl plan``'s list: same kind and description,
the same command word for word, where a plan word may hold ``<placeholders>`` for values known only
at run time (the PID, the drafter's fingerprint, the log's timestamp). A planned action the run
skipped must say when it runs (``when``), unless its whole step was skipped.
"""

from __future__ import annotations

import re
import shlex

import pytest

from deploy.config.loader import load_config
from deploy.engine.plan import plan_with_endpoints
from deploy.playbook import load_playbook
from deploy.steps import base
from deploy import transport
from deploy.steps.base import Action, Command, Upload
from tests.integration.helpers import cli_json, write_config

pytestmark = pytest.mark.sandbox

PLACEHOLDER = re.compile(r"<[^<>]+>")
HOST_LOCK = "hold the host lock (flock) for the whole run, on its own SSH channel; held elsewhere: exit 9"


def _words(command: str) -> list[str]:
    return shlex.split(command.replace("~/", "/HOME/"))


def _word_matches(planned: str, done: str) -> bool:
    pattern = "".join(".+?" if PLACEHOLDER.fullmatch(part) else re.escape(part)
                      for part in re.split(r"(<[^<>]+>)", planned))
    return re.fullmatch(pattern, done, re.DOTALL) is not None


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
