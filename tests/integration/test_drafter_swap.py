"""Issue 29 over the real-sshd sandbox: restart --swap-drafter into the running stand-in server.

The stand-in models SGLang 0.5.21+'s weight-update session (sandbox/sim_sglang/sglang/srt/managers/
weight_update.py); the sender is deploy/remote/drafter_swap.py under the host's python, on its one payload
path (sglang_payloads), with the sandbox's stand-ins of torch, safetensors.torch and sglang.srt.utils on
the host's ~/pylib (issue 41; CUDA IPC itself needs GPUs: tests/device/swap_drafter_gpu.py).
"""

from __future__ import annotations

import json
import shlex
import signal
import time

import pytest

from deploy.local import history
from deploy.config.loader import load_config
from deploy.engine.plan import plan_with_endpoints
from deploy.base.errors import ExitCode
from deploy.engine.playbook import load_playbook
from tests.integration.helpers import cli_json, nightly_with, write_config
from tests.integration.test_plan_is_run import check_run_follows_plan, recorder  # noqa: F401 (a fixture)

pytestmark = pytest.mark.sandbox
FAST = {"SGLANG_SIM_LOAD_SECONDS": "0.5", "SGLANG_SIM_WARMUP_SECONDS": "0.1", "SGLANG_SIM_SWAP_SECONDS": "0.2"}

#: rewrites the host's drafter: a new __metadata__ "step" (a new header, so the stand-in's acceptance
#: model draws another accept rate, as another training step would give) and, with SHRINK, one
#: tensor with half its rows (a changed shape); the bytes after the header are rewritten to match
REWRITE = r'''
import json, struct, sys
path, step, shrink = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
data = open(path, "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n]); body = data[8 + n:]
meta = header.pop("__metadata__", {}) or {}
meta["step"] = step
out, chunks, offset = {"__metadata__": meta}, [], 0
for name, entry in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    lo, hi = entry["data_offsets"]; raw = body[lo:hi]; shape = list(entry["shape"])
    if shrink and name.endswith("lm_head.weight"):
        shape[0] //= 2; raw = raw[:len(raw) // 2]
    out[name] = {"dtype": entry["dtype"], "shape": shape, "data_offsets": [offset, offset + len(raw)]}
    chunks.append(raw); offset += len(raw)
blob = json.dumps(out).encode(); blob += b" " * (-len(blob) % 8)
open(path, "wb").write(struct.pack("<Q", len(blob)) + blob + b"".join(chunks))
'''


def config(sandbox, tmp_path, version: str = "0.5.23", **run):
    sandbox.set_sglang_version("sb1", version)
    return write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"], "env": dict(FAST)} | run)


def steps_of(doc: dict) -> dict:
    [entry] = doc["hosts"]
    return {s["step"]: s for s in entry["steps"]}


def new_checkpoint(sandbox, step: str, *, shrink: bool = False, marker: str | None = None, host: str = "sb1") -> None:
    weights = f"{sandbox.host(host).drafter_dir}/model.safetensors"
    command = f"python3 -c {shlex.quote(REWRITE)} {weights} {step} {int(shrink)}"
    if marker:
        command += f" && printf x > {sandbox.host(host).drafter_dir}/SIMULATION-{marker}"
    result = sandbox.run(host, command)
    assert result.returncode == 0, result.stderr


def record(sandbox, name: str = "deployment.json") -> dict:
    return json.loads(sandbox.run("sb1", f"cat ~/.deployctl/{name}").stdout)


def model_info(sandbox) -> dict:
    host = sandbox.host("sb1")
    out = sandbox.run("sb1", f"curl -s --max-time 10 http://{host.address}:30000/model_info").stdout
    return json.loads(out)


def test_swap_keeps_the_pid_reports_the_fingerprint_and_serves_the_new_drafter(clean_sandbox, tmp_path, capsys,
                                                                              recorder):
    """The issue's done-when: PID unchanged, /model_info's weight_version, acceptance as a launch gives,
    the records say "swapped"; a server with --admin-api-key takes the key from its own record."""
    path = config(clean_sandbox, tmp_path, drafter_update="swap", extra_args=["--admin-api-key", "sandbox-admin"])
    code, doc = cli_json(capsys, "--config", str(path), "up", "--json")
    assert code == 0, doc
    pid = steps_of(doc)["launch"]["data"]["pid"]
    new_checkpoint(clean_sandbox, "2")
    loaded = load_config(path)
    plans, _ = plan_with_endpoints(load_playbook("restart"), loaded.runs[0],
                                   [h for h in loaded.hosts if h.name == "sb1"], loaded)

    recorder.clear()
    started = time.monotonic()
    code, doc = cli_json(capsys, "--config", str(path), "restart", "--json")
    swap_wall = time.monotonic() - started
    assert code == 0, doc
    steps = steps_of(doc)
    # what the swap sent is what `plan` lists for it
    check_run_follows_plan(plans["sb1"], list(recorder), {name: s["status"] for name, s in steps.items()})
    sent = [a.description for step, a in recorder if step == "swap-drafter"]
    assert any(d.startswith("swap check (read-only)") for d in sent)
    assert any(d.startswith("swap the drafter into the running server") for d in sent)
    swap = steps["swap-drafter"]
    assert swap["status"] == "ok" and swap["data"]["path"] == "swap", swap
    assert swap["data"]["pid"] == pid
    for name in ("stop-stale", "free-gpus", "wait-gpus-free", "launch", "wait-ready"):
        assert steps[name]["status"] == "skipped", (name, steps[name])
    deployment = record(clean_sandbox)
    fingerprint = deployment["drafter_fingerprint"]
    assert fingerprint == steps["fix-keys"]["data"]["fingerprint"]
    assert model_info(clean_sandbox)["weight_version"] == fingerprint
    assert deployment["pid"] == pid and deployment["drafter_update"]["how"] == "swapped"
    verified = deployment["drafter_update"]["verified"]
    assert verified["weight_version"] == fingerprint and verified["pid"] == pid
    # the stall: how long SGLang's model-update writer lock could hold new requests (begin + update + end)
    assert set(verified["held"]) == {"begin", "update", "end"} and verified["held"]["update"] >= 0.2
    assert verified["held_s"] <= verified["send_s"] and "new requests held up to" in swap["detail"]
    assert verified["accept_length"] >= 1.5
    assert record(clean_sandbox, "last-good.json")["drafter_update"]["how"] == "swapped"
    assert history.read()[-1]["drafter_update"]["how"] == "swapped"
    assert "sandbox-admin" not in json.dumps(doc)  # the key never reaches a report (issue 38: masked, ***)
    assert "--admin-api-key ***" in json.dumps(doc) or '"--admin-api-key", "***"' in json.dumps(doc)

    # the swapped server is what this run wants: a plain restart converges on it (same PID)
    code, doc = cli_json(capsys, "--config", str(path), "restart", "--json")
    assert code == 0 and steps_of(doc)["converge"]["data"]["converged"] is True, doc

    # a full launch of the same drafter measures the same acceptance the swap verified
    started = time.monotonic()
    code, doc = cli_json(capsys, "--config", str(path), "restart", "--reload", "--force", "--json")
    reload_wall = time.monotonic() - started
    assert code == 0, doc
    steps = steps_of(doc)
    assert steps["swap-drafter"]["status"] == "skipped" and "--reload" in steps["swap-drafter"]["detail"]
    assert steps["launch"]["data"]["pid"] != pid
    assert abs(steps["verify-acceptance"]["data"]["accept_length"] - verified["accept_length"]) < 0.15
    assert swap_wall < reload_wall + 5  # timings: tests/benchmarks/bench_drafter_swap.py


def test_changed_shapes_end_on_a_verified_full_reload(clean_sandbox, tmp_path, capsys):
    path = config(clean_sandbox, tmp_path)
    assert cli_json(capsys, "--config", str(path), "up", "--json")[0] == 0
    new_checkpoint(clean_sandbox, "2", shrink=True)
    code, doc = cli_json(capsys, "--config", str(path), "restart", "--swap-drafter", "--json")
    assert code == 0, doc
    steps = steps_of(doc)
    assert steps["swap-drafter"]["data"]["path"] == "reload"
    assert "shapes changed" in steps["swap-drafter"]["data"]["reason"] and "lm_head" in steps["swap-drafter"]["detail"]
    assert steps["launch"]["status"] == "ok" and steps["verify-acceptance"]["status"] == "ok"
    # issue 41: the record says the server was reloaded, and why
    update = record(clean_sandbox)["drafter_update"]
    assert update["how"] == "reloaded" and update["asked"] == "swap" and "shapes changed" in update["why"]


def test_sglang_0_5_20_has_no_session_and_reloads(clean_sandbox, tmp_path, capsys):
    path = config(clean_sandbox, tmp_path, version="0.5.20", drafter_update="swap")
    assert cli_json(capsys, "--config", str(path), "up", "--json")[0] == 0
    new_checkpoint(clean_sandbox, "2")
    code, doc = cli_json(capsys, "--config", str(path), "restart", "--json")
    assert code == 0, doc
    steps = steps_of(doc)
    assert steps["swap-drafter"]["status"] == "skipped"
    assert "0.5.20 has no weight-update session" in steps["swap-drafter"]["detail"]
    assert steps["launch"]["status"] == "ok" and steps["verify-acceptance"]["status"] == "ok"
    # and the stand-in 0.5.20 really has no session route (404), as the wheel
    host = clean_sandbox.host("sb1")
    out = clean_sandbox.run("sb1", f"curl -s -o /dev/null -w '%{{http_code}}' -X POST -d '{{}}' "
                                   f"http://{host.address}:30000/begin_weight_update").stdout
    assert out == "404"


def test_a_swap_that_fails_verification_reloads_then_rolls_back(clean_sandbox, tmp_path, capsys):
    """A drafter that accepts nothing: swapped, verified at 1.00 (as a launch with it gives), reloaded
    in full, verified at 1.00 again, rolled back to the last good deployment: never left on it."""
    path = config(clean_sandbox, tmp_path, drafter_update="swap")
    code, doc = cli_json(capsys, "--config", str(path), "up", "--json")
    assert code == 0, doc
    good = record(clean_sandbox)
    new_checkpoint(clean_sandbox, "2", marker="accept-nothing")
    code, doc = cli_json(capsys, "--config", str(path), "restart", "--json")
    assert code == ExitCode.ROLLED_BACK, doc
    steps = steps_of(doc)
    swap = steps["swap-drafter"]
    assert swap["data"]["path"] == "reload" and swap["data"]["sent"] is True, swap
    assert "the swap failed verification" in swap["detail"] and "accept length 1.00" in swap["detail"]
    assert steps["launch"]["status"] == "ok" and steps["verify-acceptance"]["status"] == "failed"
    now = record(clean_sandbox)
    assert now["drafter_fingerprint"] == good["drafter_fingerprint"] and "drafter_update" not in now
    assert model_info(clean_sandbox)["weight_version"] == "default"  # a fresh launch of the last good one


def test_nightly_swaps_a_new_checkpoint_and_gates_it_like_a_launch(clean_sandbox, tmp_path, capsys):
    """The nightly benchmarks 4 rounds (helpers.nightly_with), not the shipped 12: the gate it must pass
    is a baseline (the last good record comes from `up`); what is under test is the swap.

    The server is launched with ``--api-key`` (the stand-in refuses /generate and /server_info without
    it, as SGLang's decide_request_auth does): verify-acceptance, the swap and every bench_serving round
    send it, and so do `status --probe`'s reads, read on the host from deployment.json; no command
    deployctl sends or prints carries it.
    Before, verify got 401 on such a server and swaps of it were refused."""
    key = "sk-nightly-7f3a"
    path = config(clean_sandbox, tmp_path, drafter_update="swap", extra_args=["--api-key", key])
    code, doc = cli_json(capsys, "--config", str(path), "up", "--json")
    assert code == 0, doc
    assert steps_of(doc)["verify-acceptance"]["status"] == "ok" and key not in json.dumps(doc)
    code, plan = cli_json(capsys, "--config", str(path), "plan", "nightly", "--json")
    assert code == 0 and key not in json.dumps(plan) and "--key-from" in json.dumps(plan)
    code, status = cli_json(capsys, "--config", str(path), "status", "--json", "--probe")  # /generate, /v1/loads
    live = status["hosts"][0]["live"]
    assert code == 0 and live["accept_source"].startswith("--probe") and live["accept_length"] > 2.0, status
    pid = steps_of(doc)["launch"]["data"]["pid"]
    new_checkpoint(clean_sandbox, "3")
    code, doc = cli_json(capsys, "--config", str(path), "nightly", "--json",
                         "--playbook", str(nightly_with(tmp_path, rounds=4)))
    assert code == 0, doc
    steps = steps_of(doc)
    assert steps["swap-drafter"]["data"]["path"] == "swap" and steps["swap-drafter"]["data"]["pid"] == pid
    assert steps["launch"]["status"] == "skipped"
    assert steps["benchmark"]["status"] == "ok" and steps["regression-gate"]["status"] == "ok"
    assert record(clean_sandbox, "last-good.json")["drafter_update"]["how"] == "swapped"
    assert key not in json.dumps(doc)


def test_behind_a_router_a_swap_is_drained_first_and_swapped_in_place(clean_sandbox, tmp_path, capsys):
    """Issue 41: SGLang's session holds new requests behind its model-update writer lock (each of begin,
    update and end waits for every in-flight one), so the probe drains a replica that would swap, like a
    redeployed one, and the swap then runs out of rotation: sb1 unchanged (kept), sb2 a new checkpoint of
    the same shapes (drained, swapped, same PID), sb3 one with a changed shape (drained, reloaded). No
    request through the router fails. Before, sb2 and sb3 were kept in the router."""
    from tests.integration.fleet_client import StreamingClient
    from tests.integration.test_fleet import FAST as FLEET_FAST, ROUTER_PORT, ROUTER_PYTHON, router_workers, \
        server_pid, summary, worker_url

    if not ROUTER_PYTHON.is_file():
        pytest.skip(f"{ROUTER_PYTHON} missing: run tests/bootstrap.sh")
    sb = clean_sandbox
    hosts = ("sb1", "sb2", "sb3")
    for host in hosts:
        sb.set_sglang_version(host, "0.5.23")
    router = {"host": "sb1", "port": ROUTER_PORT, "policy": "round_robin", "python": str(ROUTER_PYTHON),
              "startup_timeout_s": 60, "drain_timeout_s": 30}
    path = write_config(sb, tmp_path, run={"env": FLEET_FAST | FAST, "router": router, "drafter_update": "swap"})
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, summary(doc)
    pids = {h: server_pid(sb, h) for h in hosts}
    new_checkpoint(sb, "2", host="sb2")
    new_checkpoint(sb, "2", shrink=True, host="sb3")
    with StreamingClient(sb.host("sb1").address, ROUTER_PORT, concurrency=2) as client:
        code, doc = cli_json(capsys, "-c", str(path), "restart", "--json")
    assert code == 0, summary(doc)
    by_host = {h["host"]: {s["step"]: s for s in h["steps"]} for h in doc["hosts"]}
    assert by_host["sb2"]["swap-drafter"]["data"]["path"] == "swap", by_host["sb2"]["swap-drafter"]
    phases = {p["phase"]: p["detail"] for p in doc["fleet"]["phases"]}
    assert "kept in the router: sb1" in phases["batch 1/3 check unchanged sb1"]
    assert "sb2 (drafter swap, drained first:" in phases["batch 2/3 check unchanged sb2"]
    assert "removed 1 worker(s)" in phases["batch 2/3 router-remove sb2"]
    assert "sb3 (drafter swap, drained first:" in phases["batch 3/3 check unchanged sb3"]
    assert "removed 1 worker(s)" in phases["batch 3/3 router-remove sb3"]
    assert "shapes changed" in by_host["sb3"]["swap-drafter"]["data"]["reason"]
    assert by_host["sb3"]["launch"]["status"] == "ok" and by_host["sb2"]["launch"]["status"] == "skipped"
    rotation = doc["fleet"]["rotation"]
    assert rotation["sb2"]["out_of_rotation_s"] > 0 and rotation["sb3"]["out_of_rotation_s"] > 0
    assert server_pid(sb, "sb1") == pids["sb1"] and server_pid(sb, "sb2") == pids["sb2"]
    assert server_pid(sb, "sb3") != pids["sb3"]
    assert client.stats.failed == 0, client.stats.errors[:5]
    assert sorted(w["url"] for w in router_workers(sb)) == sorted(worker_url(sb, h) for h in hosts)


def answers(sandbox, overrides: dict | None) -> None:
    """The stand-in's hostile-answer knob (~/.sim/answers.json, launch_server.answer_override)."""
    command = (f"printf '%s' {shlex.quote(json.dumps(overrides))} > ~/.sim/answers.json" if overrides
               else "rm -f ~/.sim/answers.json")
    assert sandbox.run("sb1", command).returncode == 0


@pytest.mark.parametrize("path,answer", [("/model_info", {"body": "deep"}),
                                         ("/end_weight_update", {"body": "deep"}),
                                         ("/model_info", {"body": '{"weight_version": 12345}'})],
                         ids=["model-info-deep", "end-deep", "model-info-weight-version-int"])
def test_an_unreadable_answer_after_the_tensors_went_out_ends_on_a_verified_reload(clean_sandbox, tmp_path, capsys,
                                                                                  path, answer):
    """Issue 38: before, exit 1 ("drafter swap failed with exit code 1: ^^^^") or 5, deployment.json
    still naming the old drafter, "untouched by this run", and the next restart "already running as
    desired" on a server holding new, unverified weights."""
    config_path = config(clean_sandbox, tmp_path, drafter_update="swap")
    code, doc = cli_json(capsys, "--config", str(config_path), "up", "--json")
    assert code == 0, doc
    new_checkpoint(clean_sandbox, "2")
    answers(clean_sandbox, {path: answer})
    try:
        code, doc = cli_json(capsys, "--config", str(config_path), "restart", "--json")
    finally:
        answers(clean_sandbox, None)
    assert code == 0, doc
    steps = steps_of(doc)
    swap = steps["swap-drafter"]
    assert swap["data"]["path"] == "reload" and swap["data"]["sent"] is True, swap
    assert "the swap failed verification" in swap["detail"] and "^^^" not in swap["detail"]
    assert steps["launch"]["status"] == "ok" and steps["verify-acceptance"]["status"] == "ok"
    now = record(clean_sandbox)
    assert now["drafter_fingerprint"] == steps["fix-keys"]["data"]["fingerprint"]
    assert now["drafter_update"]["how"] == "reloaded" and now["drafter_update"]["sent"] is True
    assert now["drafter_update"]["why"].startswith("the swap failed verification")
    assert "untouched" not in json.dumps(doc["hosts"][0].get("serving"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_signal_during_the_update_leaves_a_server_nothing_converges_on(clean_sandbox, tmp_path, capsys, signum):
    """SIGTERM (or SIGKILL: no report at all) to deployctl while the tensors are in flight: exit 143,
    deployment.json says the drafter is unknown (``swapping``), the report does not say "untouched",
    and the next restart with the OLD drafter reloads instead of "already running as desired"."""
    from tests.integration.test_safe_redeploy import deployctl, read_until

    config_path = config(clean_sandbox, tmp_path, drafter_update="swap")
    code, doc = cli_json(capsys, "--config", str(config_path), "up", "--json")
    assert code == 0, doc
    old = record(clean_sandbox)
    weights = f"{clean_sandbox.host('sb1').drafter_dir}/model.safetensors"
    assert clean_sandbox.run("sb1", f"cp {weights} {weights}.old").returncode == 0
    new_checkpoint(clean_sandbox, "2")
    answers(clean_sandbox, {"/update_weights_from_tensor": {"body": '{"success": true, "message": "Success"}',
                                                            "sleep": 20}})
    proc = deployctl("--config", str(config_path), "restart")
    try:
        read_until(proc, "swapping the drafter into pid")
        time.sleep(2)  # the sender is inside /update_weights_from_tensor (the stand-in sleeps 20 s)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        answers(clean_sandbox, None)
    assert proc.returncode == (143 if signum == signal.SIGTERM else -signal.SIGKILL), err
    assert "untouched" not in err and "Traceback" not in err
    marked = record(clean_sandbox)
    assert marked["drafter_fingerprint"] is None and marked["drafter_update"]["how"] in ("swapping", "swap-failed")
    assert marked["pid"] == old["pid"]
    # the old drafter back: the server holds weights nobody verified, so it is reloaded, not "as desired"
    assert clean_sandbox.run("sb1", f"mv {weights}.old {weights}").returncode == 0
    code, doc = cli_json(capsys, "--config", str(config_path), "restart", "--json")
    assert code == 0, doc
    steps = steps_of(doc)
    assert steps["converge"]["data"]["converged"] is False and "drafter unknown" in steps["converge"]["detail"]
    assert steps["launch"]["status"] == "ok" and steps["launch"]["data"]["pid"] != old["pid"]
    now = record(clean_sandbox)
    assert now["drafter_fingerprint"] == steps["fix-keys"]["data"]["fingerprint"]
    assert now["drafter_update"]["how"] == "reloaded" and "a swap failed on this server before" in now["drafter_update"]["why"]
