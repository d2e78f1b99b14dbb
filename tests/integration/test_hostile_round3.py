"""Issue 31 over the real-sshd sandbox: a failure in a step that touched nothing leaves the server
alone (same PID, no rollback), and hostile host-side state is named, within its bound."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from deploy.base.errors import ExitCode
from tests.integration.helpers import cli_json, write_config

pytestmark = pytest.mark.sandbox


def _dataset(tmp_path):
    records = [{"conversations": [{"from": "human", "value": f"Question {i} about owls?"},
                                  {"from": "gpt", "value": "Owls."}]} for i in range(6)]
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(records))
    return prompts, hashlib.sha256(prompts.read_bytes()).hexdigest()


#: what each case plants in the state dir so that one step before any stop fails
PLANTS = {
    # the helper check (the state program) meets a FIFO at the dataset's name: exit 10 naming it
    "dataset-check-fifo": ("rm -rf {state}/datasets && mkdir -p {state}/datasets && mkfifo {state}/datasets/{digest}.json",
                           ExitCode.IO, "{digest}.json is not a regular file"),
    # the SFTP upload cannot make the datasets directory (a file has its name)
    "dataset-upload": ("rm -rf {state}/datasets && echo x > {state}/datasets", None, "datasets"),
    # bench_serving (the benchmark client) cannot write its results: exit != 0
    "benchmark-client": ("rm -rf {state}/bench && echo x > {state}/bench", None, "bench_serving failed"),
}


def test_a_failure_before_any_stop_leaves_the_running_server_alone(clean_sandbox, tmp_path, capsys):
    # one `up`, then each step that can fail before the stop, in turn (a server launch per case
    # would triple the test's time for nothing)
    path = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    state = clean_sandbox.host("sb1").state_dir
    pid = clean_sandbox.run("sb1", f"cat {state}/server.pid").stdout.strip()
    prompts, digest = _dataset(tmp_path)
    for case, (plant, expected_code, fragment) in sorted(PLANTS.items()):
        assert clean_sandbox.run("sb1", plant.format(state=state, digest=digest)).returncode == 0
        started = time.monotonic()
        code, doc = cli_json(capsys, "-c", str(path), "bench", "--json", "--dataset", str(prompts),
                             "--num-prompts", "4", "--output-len", "16")
        assert time.monotonic() - started < 60, case
        text = json.dumps(doc)
        assert code != 0 and code != ExitCode.ROLLED_BACK, (case, text)
        if expected_code is not None:
            assert code == expected_code, (case, text)
        assert fragment.format(digest=digest) in text, case
        host = doc["rounds"][0]["hosts"][0]
        assert not host.get("rollback"), f"{case}: nothing was stopped: nothing may be rolled back"
        steps = {s["step"]: s["status"] for s in host["steps"]}
        assert steps["stop-stale"] == "skipped" and steps["launch"] == "skipped", case
        # the very server `up` launched still runs, under the same PID
        assert clean_sandbox.run("sb1", f"cat {state}/server.pid").stdout.strip() == pid, case
        assert clean_sandbox.run("sb1", f"kill -0 {pid}").returncode == 0, case
        clean_sandbox.run("sb1", f"rm -rf {state}/datasets {state}/bench")
