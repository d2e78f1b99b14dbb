"""Issue: up / restart / down / plan over the real-sshd sandbox with the stand-in SGLang."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from deploy.base.errors import ExitCode
from tests.integration.helpers import cli_json, cli_json_err, default_signals, gpu_used, hold_gpu_program, start_stray, wait_until, write_config

pytestmark = pytest.mark.sandbox


def steps_of(doc: dict, host: str) -> dict:
    [entry] = [h for h in doc["hosts"] if h["host"] == host]
    return {s["step"]: s for s in entry["steps"]}


def one_host_config(sandbox, tmp_path, name="sb1", **run):
    return write_config(sandbox, tmp_path, run={"group": None, "hosts": [name], **run})


def playbook(tmp_path: Path, text: str) -> str:
    path = tmp_path / "playbook.yaml"
    path.write_text(text)
    return str(path)


def test_up_converts_launches_and_verifies_acceptance(clean_sandbox, tmp_path, capsys):
    path = one_host_config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--draft-tokens", "16")
    assert code == 0, json.dumps(doc, indent=1)
    steps = steps_of(doc, "sb1")
    assert [s for s in steps] == ["doctor", "ensure-helper", "fix-keys", "converge", "stop-stale", "free-gpus",
                                  "wait-gpus-free", "launch", "wait-ready", "verify-acceptance", "record-good"]
    assert all(s["status"] == "ok" for s in steps.values())
    assert steps["fix-keys"]["data"]["status"] == "converted" and steps["fix-keys"]["data"]["renamed"] >= 10
    assert steps["launch"]["data"]["num_steps"] == 15 and steps["launch"]["data"]["draft_tokens"] == 16
    assert steps["verify-acceptance"]["data"]["accept_length"] > 1.5
    # helpers and logs live in the persistent state dir, never /tmp
    state = clean_sandbox.host("sb1").state_dir
    listing = clean_sandbox.run("sb1", f"ls {state}/helpers {state}/logs; readlink {state}/logs/latest.log").stdout
    assert "fixer.pyz" in listing and "host_ops.py" in listing and "sglang-" in listing
    assert all(used > 0 for used in gpu_used(clean_sandbox, "sb1"))
    # the user's checkpoint is untouched: converted in the drafter store, launched from there
    store = steps["fix-keys"]["data"]["store"]
    assert steps["launch"]["data"]["drafter"] == store and store.startswith("~/.deployctl/drafters/")
    user_header = clean_sandbox.run("sb1", f"head -c 4096 {clean_sandbox.host('sb1').drafter_dir}/model.safetensors | tail -c +9 | tr -cd '[:print:]'").stdout
    assert "layers.0." in user_header and "midlayer." not in user_header
    # a second up finds the drafter already converted and the server running as desired: nothing touched
    pid = steps["launch"]["data"]["pid"]
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0
    steps = steps_of(doc, "sb1")
    assert steps["fix-keys"]["data"]["status"] == "already_converted"
    assert steps["converge"]["data"]["converged"] is True and steps["converge"]["data"]["pid"] == pid
    assert all(steps[s]["status"] == "skipped" for s in ("stop-stale", "free-gpus", "wait-gpus-free", "launch", "wait-ready"))
    assert doc["hosts"][0]["outcome"] == "converged"
    # --force redeploys anyway
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--force")
    assert code == 0
    assert steps_of(doc, "sb1")["stop-stale"]["data"]["processes"], "the previous server must be stopped"
    assert steps_of(doc, "sb1")["launch"]["data"]["pid"] != pid


def test_unconverted_drafter_on_legacy_sglang_is_caught_by_verify(clean_sandbox, tmp_path, capsys):
    """A speculators drafter on SGLang 0.5.6-0.5.11: skip the key fix and the healthy server accepts nothing (accept len 1.00)."""
    path = one_host_config(clean_sandbox, tmp_path)
    book = playbook(tmp_path, "name: nofix\nsteps:\n  - step: ensure-helper\n  - step: stop-stale\n    scope: user\n"
                    "  - step: free-gpus\n  - step: wait-gpus-free\n  - step: launch\n  - step: wait-ready\n"
                    "  - step: verify-acceptance\n")
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", book)
    assert code == ExitCode.VERIFY
    detail = steps_of(doc, "sb1")["verify-acceptance"]["detail"]
    assert "accept length 1.00" in detail and "no draft token was accepted" in detail


def test_stale_python_holding_gpus_is_stopped_and_sigterm_ignorer_gets_sigkill(clean_sandbox, tmp_path, capsys):
    home = str(clean_sandbox.host("sb1").home)
    polite = start_stray(clean_sandbox, "sb1", hold_gpu_program(home, 2))
    stubborn = start_stray(clean_sandbox, "sb1", hold_gpu_program(home, 6, ignore_term=True))
    wait_until(lambda: (lambda u: u[2] > 0 and u[6] > 0)(gpu_used(clean_sandbox, "sb1")), what="GPUs 2 and 6 held")
    path = one_host_config(clean_sandbox, tmp_path)
    book = playbook(tmp_path, "name: clear\nsteps:\n  - step: ensure-helper\n  - step: stop-stale\n    scope: user\n"
                    "    grace_s: 1\n  - step: wait-gpus-free\n    timeout_s: 20\n")
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", book)
    assert code == 0, json.dumps(doc, indent=1)
    stopped = {p["pid"]: p for p in steps_of(doc, "sb1")["stop-stale"]["data"]["processes"]}
    assert stopped[polite]["signal"] == "TERM" and stopped[stubborn]["signal"] == "KILL"
    assert all(p["exited"] for p in stopped.values())
    assert gpu_used(clean_sandbox, "sb1") == [0] * 8


def test_gpu_that_never_frees_times_out_naming_its_holder(clean_sandbox, tmp_path, capsys):
    home = str(clean_sandbox.host("sb1").home)
    holder = start_stray(clean_sandbox, "sb1", hold_gpu_program(home, 4))
    wait_until(lambda: gpu_used(clean_sandbox, "sb1")[4] > 0, what="GPU 4 held")
    path = one_host_config(clean_sandbox, tmp_path)
    book = playbook(tmp_path, "name: wait\nsteps:\n  - step: ensure-helper\n  - step: wait-gpus-free\n    timeout_s: 1.5\n"
                    "    interval_s: 0.2\n")
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", book)
    assert code == ExitCode.TIMEOUT
    detail = steps_of(doc, "sb1")["wait-gpus-free"]["detail"]
    assert f"GPU 4:" in detail and f"pid {holder}" in detail


def test_free_gpus_kills_holders_that_are_not_python(clean_sandbox, tmp_path, capsys):
    home = str(clean_sandbox.host("sb1").home)
    result = clean_sandbox.run("sb1", f"setsid nohup sleep 600 < {home}/dev/nvidia1 > /dev/null 2>&1 & echo $!")
    sleeper = int(result.stdout)
    wait_until(lambda: gpu_used(clean_sandbox, "sb1")[1] > 0, what="GPU 1 held by sleep")
    path = one_host_config(clean_sandbox, tmp_path)
    book = playbook(tmp_path, "name: free\nsteps:\n  - step: ensure-helper\n  - step: free-gpus\n  - step: wait-gpus-free\n"
                    "    timeout_s: 20\n")
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", book)
    assert code == 0, json.dumps(doc, indent=1)
    assert sleeper in steps_of(doc, "sb1")["free-gpus"]["data"]["killed"]


def test_server_crash_during_load_shows_the_log_tail(clean_sandbox, tmp_path, capsys):
    path = one_host_config(clean_sandbox, tmp_path, env={"SGLANG_SIM_CRASH_DURING_LOAD": "1"})
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == ExitCode.FAILED
    detail = steps_of(doc, "sb1")["wait-ready"]["detail"]
    assert "exited during startup" in detail and "CUDA out of memory" in detail
    assert steps_of(doc, "sb1")["verify-acceptance"]["status"] == "not-run"
    # the run's environment reached the server through a private file, not the command line
    state = clean_sandbox.host("sb1").state_dir
    assert clean_sandbox.run("sb1", f"stat -c %a {state}/launch.env").stdout.strip() == "600"
    assert "SGLANG_SIM_CRASH_DURING_LOAD" not in json.dumps(steps_of(doc, "sb1")["launch"])


def test_user_scope_leaves_excluded_daemons_alone(clean_sandbox, tmp_path, capsys):
    victim = start_stray(clean_sandbox, "sb1", "import time; time.sleep(600)")
    wrapped = f"setsid nohup python3 -c 'import time; time.sleep(600)' /usr/bin/unattended-upgrade > /dev/null 2>&1 < /dev/null & echo $!"
    named = int(clean_sandbox.run("sb1", wrapped).stdout)
    path = one_host_config(clean_sandbox, tmp_path)
    book = playbook(tmp_path, "name: s\nsteps:\n  - step: ensure-helper\n  - step: stop-stale\n    scope: user\n")
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--playbook", book)
    assert code == 0
    stopped = {p["pid"] for p in steps_of(doc, "sb1")["stop-stale"]["data"]["processes"]}
    assert victim in stopped and named not in stopped
    assert clean_sandbox.run("sb1", f"kill -0 {named}").returncode == 0


def test_port_already_taken(clean_sandbox, tmp_path, capsys):
    host = clean_sandbox.host("sb1")
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind((host.address, 30000))
    blocker.listen(1)
    try:
        path = one_host_config(clean_sandbox, tmp_path)
        # the doctor sees the listener (another user's: no pid visible) before anything is stopped
        code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
        assert code == ExitCode.VERIFY
        assert "serve-port: port 30000 is held by another process" in steps_of(doc, "sb1")["doctor"]["detail"]
        code, doc = cli_json(capsys, "-c", str(path), "up", "--json", "--ignore-doctor")
    finally:
        blocker.close()
    assert code == ExitCode.FAILED
    detail = steps_of(doc, "sb1")["wait-ready"]["detail"]
    assert "port 30000 is already taken" in detail and "address already in use" in detail


def test_restart_reconverts_only_after_the_drafter_changed(clean_sandbox, tmp_path, capsys):
    path = one_host_config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0
    pid = steps_of(doc, "sb1")["launch"]["data"]["pid"]
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    assert steps_of(doc, "sb1")["fix-keys"]["status"] == "skipped"
    assert steps_of(doc, "sb1")["launch"]["status"] == "skipped"  # nothing changed: no restart
    assert clean_sandbox.run("sb1", "cat ~/.deployctl/server.pid").stdout.strip() == str(pid)
    # A new checkpoint lands (speculators format again): restart must convert it.
    drafter = clean_sandbox.host("sb1").drafter_dir
    result = clean_sandbox.run("sb1", f"cd {drafter} && python3 -c \""
                               "import json,struct;f=open('model.safetensors','r+b');n=struct.unpack('<Q',f.read(8))[0];"
                               "h=f.read(n).replace(b'midlayer.',b'layers.0.');f.seek(8);f.write(h)\"")
    assert result.returncode == 0, result.stderr
    code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    fix = steps_of(doc, "sb1")["fix-keys"]
    assert fix["status"] == "ok" and fix["data"]["status"] == "converted"
    assert steps_of(doc, "sb1")["launch"]["data"]["pid"] != pid  # a changed checkpoint converges
    assert steps_of(doc, "sb1")["verify-acceptance"]["data"]["accept_length"] > 1.5


def test_two_hosts_deploy_in_parallel(clean_sandbox, tmp_path, capsys):
    path = write_config(clean_sandbox, tmp_path, run={"group": None, "hosts": ["sb2", "sb3"],
                                                      "env": {"SGLANG_SIM_LOAD_SECONDS": "2"}})
    code, doc, progress = cli_json_err(capsys, "-c", str(path), "up", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    assert [h["host"] for h in doc["hosts"]] == ["sb2", "sb3"] and all(h["ok"] for h in doc["hosts"])
    # In parallel: each host starts waiting for its server before the other's is ready
    # (asserted on the order of progress events, not on seconds).
    lines = progress.splitlines()

    def first(event: str) -> int:
        return next(i for i, line in enumerate(lines) if event in line)

    for a, b in (("sb2", "sb3"), ("sb3", "sb2")):
        assert first(f"[{a}] wait-ready: start") < first(f"[{b}] wait-ready: ok"), progress
    for name in ("sb2", "sb3"):
        assert all(used > 0 for used in gpu_used(clean_sandbox, name))
    code, doc = cli_json(capsys, "-c", str(path), "down", "--json", "--free-gpus")
    assert code == 0, json.dumps(doc, indent=1)
    for name in ("sb2", "sb3"):
        assert steps_of(doc, name)["stop-stale"]["data"]["processes"]
        assert gpu_used(clean_sandbox, name) == [0] * 8


def _snapshot(home: Path) -> dict:
    snap = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            snap[str(p)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return snap


def test_plan_changes_nothing_on_the_host(clean_sandbox, tmp_path, capsys):
    home = clean_sandbox.host("sb1").home
    before = _snapshot(home)
    path = one_host_config(clean_sandbox, tmp_path)
    for argv in (["plan", "--json"], ["up", "--dry-run", "--json"], ["restart", "--dry-run", "--json"],
                 ["down", "--dry-run", "--json", "--free-gpus"]):
        code, doc = cli_json(capsys, "-c", str(path), *argv)
        assert code == 0 and doc["dry_run"] is True
    assert _snapshot(home) == before
    assert gpu_used(clean_sandbox, "sb1") == [0] * 8


def test_logs_shows_the_latest_server_log(clean_sandbox, tmp_path, capsys):
    """Also `logs --json` (issue 42) over the same deploy: the host's log path and its lines."""
    from deploy.cli.main import main

    path = one_host_config(clean_sandbox, tmp_path)
    code, _ = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0
    assert main(["-c", str(path), "logs", "-n", "200"]) == 0
    out = capsys.readouterr().out
    assert "==> sb1:" in out and "The server is fired up and ready to roll!" in out
    [header] = [line for line in out.splitlines() if line.startswith("==> sb1:")]
    code, doc = cli_json(capsys, "-c", str(path), "logs", "--json", "-n", "200")
    assert code == 0 and doc["ok"] is True and doc["exit_code"] == 0
    [host] = doc["hosts"]
    assert host["host"] == "sb1" and header == f"==> sb1: {host['path']} <=="
    assert any("The server is fired up and ready to roll!" in line for line in host["lines"]) and len(host["lines"]) <= 200


def test_logs_follow_streams_and_stops_on_ctrl_c(clean_sandbox, tmp_path, capsys):
    import signal
    import subprocess
    import sys

    path = one_host_config(clean_sandbox, tmp_path)
    code, _ = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0
    import queue
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "deploy", "-c", str(path), "logs", "-f", "-n", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()

    def readline(timeout: float = 20.0) -> str:
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("deployctl logs -f printed nothing new") from None

    try:
        first = readline()
        assert first.startswith("[20"), first
        # a new request appends to the log while we follow it
        clean_sandbox.run("sb1", "python3 -c \"import urllib.request as u; u.urlopen(u.Request("
                          f"'http://{clean_sandbox.host('sb1').address}:30000/generate', data=b'{{\\\"text\\\": \\\"hi\\\"}}',"
                          " headers={'Content-Type': 'application/json'}), timeout=30).read()\"")
        wait_until(lambda: "POST /generate" in readline(), timeout=20, interval=0, what="the new log line")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bench_sweep_redeploys_per_draft_token_count(clean_sandbox, tmp_path, capsys):
    """The original request: "Deploy and benchmark, first for 16 deep, then 10/5"."""
    path = one_host_config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "bench", "--json", "--draft-tokens", "16", "--draft-tokens", "5",
                         "--num-prompts", "4", "--output-len", "64", "--input-len", "32")
    assert code == 0, json.dumps(doc, indent=1)
    results = {r["draft_tokens"]: r for r in doc["results"]}
    assert sorted(results) == [5, 16] and all(r["ok"] for r in results.values())
    assert all(r["accept_length"] > 1.5 and r["output_tok_s"] > 0 for r in results.values())
    assert results[16]["accept_length"] != results[5]["accept_length"]
    # each round launched SGLang with its own draft-token count
    for round_ in doc["rounds"]:
        [host] = round_["hosts"]
        launch = next(s for s in host["steps"] if s["step"] == "launch")
        assert launch["data"]["draft_tokens"] == round_["draft_tokens"]
        assert launch["data"]["num_steps"] == round_["draft_tokens"] - 1
    state = clean_sandbox.host("sb1").state_dir
    files = clean_sandbox.run("sb1", f"ls {state}/bench").stdout.split()
    assert any(f.endswith("-t16.jsonl") for f in files) and any(f.endswith("-t5.jsonl") for f in files)
    # the built-in prompt set (not random ids), uploaded once and named in every row
    from deploy.local import datasets

    assert {r["dataset"] for r in doc["results"]} == {"builtin"}
    assert {r["dataset_sha256"] for r in doc["results"]} == {datasets.builtin().sha256}
    # the sweep ended on 5: bench put the configured 16 back, verified, and only 16 is the last good one
    assert doc["restore"] is not None and [h["ok"] for h in doc["restore"]] == [True]
    [serving] = doc["serving"]
    assert serving["configured"] is True and "draft tokens 16" in serving["serves"]
    restored = next(s for s in doc["restore"][0]["steps"] if s["step"] == "launch")
    assert restored["data"]["draft_tokens"] == 16
    good = json.loads(clean_sandbox.run("sb1", f"cat {state}/last-good.json").stdout)
    assert good["metrics"]["draft_tokens"] == 16 and "--speculative-num-draft-tokens" in good["argv"]
    assert good["argv"][good["argv"].index("--speculative-num-draft-tokens") + 1] == "16"
    round5 = next(r for r in doc["rounds"] if r["draft_tokens"] == 5)["hosts"][0]
    assert next(s for s in round5["steps"] if s["step"] == "record-good")["status"] == "disabled"
    # the report: JSON and one self-contained HTML page with its charts
    html = Path(doc["report_html"]).read_text()
    assert html.count("<svg") >= 4 and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    rows = json.loads(Path(doc["report_json"]).read_text())["rows"]
    assert sorted(r["draft_tokens"] for r in rows) == [5, 16] and sum(r["best"] for r in rows) == 1
    keep = os.environ.get("DEPLOYCTL_KEEP_REPORT")  # docs/benchmarks.md's excerpt comes from such a run
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for made in (doc["report_json"], doc["report_html"]):
            Path(keep, Path(made).name).write_bytes(Path(made).read_bytes())


def test_bench_with_a_dataset_runs_bench_serving_on_that_file(clean_sandbox, tmp_path, capsys):
    """`bench --dataset prompts.json`: the same bytes on the host (sha256), read by bench_serving."""
    import hashlib

    records = [{"conversations": [{"from": "human", "value": f"Tell me fact number {i} about owls."},
                                  {"from": "gpt", "value": "Owls are birds."}]} for i in range(12)]
    records.append({"conversations": [{"from": "human", "value": "one turn only"}]})  # skipped, like SGLang
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(records))
    digest = hashlib.sha256(prompts.read_bytes()).hexdigest()
    path = one_host_config(clean_sandbox, tmp_path)
    code, doc = cli_json(capsys, "-c", str(path), "bench", "--json", "--dataset", str(prompts),
                         "--num-prompts", "8", "--output-len", "32")
    assert code == 0, json.dumps(doc, indent=1)
    [row] = doc["results"]
    assert row["ok"] and row["dataset"] == "prompts.json" and row["dataset_sha256"] == digest
    state = clean_sandbox.host("sb1").state_dir
    on_host = clean_sandbox.run("sb1", f"sha256sum {state}/datasets/{digest}.json").stdout.split()[0]
    assert on_host == digest
    bench = next(s for s in doc["rounds"][0]["hosts"][0]["steps"] if s["step"] == "benchmark")
    assert bench["data"]["dataset_uploaded"] is True and bench["data"]["successful_requests"] == 8
    # the stand-in bench_serving read that very file (its output line names it and its sha256)
    line = json.loads(clean_sandbox.run("sb1", f"tail -n 1 {bench['data']['results_file']}").stdout)
    assert line["dataset_name"] == "sharegpt" and line["simulated_dataset_sha256"] == digest
    # again: not uploaded a second time (once per sha256); the configured value was benchmarked: no restore
    code, doc = cli_json(capsys, "-c", str(path), "bench", "--json", "--dataset", str(prompts),
                         "--num-prompts", "8", "--output-len", "32")
    bench = next(s for s in doc["rounds"][0]["hosts"][0]["steps"] if s["step"] == "benchmark")
    assert code == 0 and bench["data"]["dataset_uploaded"] is False and doc["restore"] is None
    history = [json.loads(line) for line in (Path(os.environ["XDG_STATE_HOME"]) / "deployctl" /
                                             "history.jsonl").read_text().splitlines()]
    assert {(h["dataset"], h["dataset_sha256"]) for h in history if h["verb"] == "bench"} == {("prompts.json", digest)}
