"""Steps' run() without SSH: the product's Transport base class over a scripted wire (tests/recording.py).

Each test scripts the host's answers (captured formats: fuser, nvidia-smi CSV, host_ops JSON) and
checks what the step concluded and exactly which commands it sent.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from deploy.base.errors import (BenchmarkHarnessFailed, ConnectionFailed, ExitCode, RemoteCommandFailed, RemoteOutputError,
                           StepTimeout, VerificationFailed)
from deploy.host.records import AcceptMeasurement
from deploy.facts.fuser import NO_DEVICE_FILES
from deploy.steps import (converge, ensure_helper, launch, free_gpus, record_good, regression_gate, stop_stale, verify_acceptance,
                          wait_gpus_free, wait_ready)
from deploy.host.records import DeploymentRecord, LastGood
from deploy.steps.base import StepContext
from deploy.steps.launch import desired_record
from deploy.ssh.transport import ExecTimedOut
from deploy.steps.memory import StepMemory
from tests.recording import RecordingTransport, Reply

from tests.fixtures import KIMI_HOST as HOST, KIMI_RUN as RUN  # noqa: E402
UUID = ["GPU-4a1b2c3d-0000-0000-0000-00000000000" + str(i) for i in range(2)]


def ctx(module, conn, run=RUN, memory=None, **settings):
    return StepContext(host=HOST, run=run, settings=module.Settings(step=module.NAME, **settings), conn=conn,
                       launch_stamp="20261129T000000Z", memory=StepMemory() if memory is None else memory)


# -- the base class: wrapper, error mapping, ~ ------------------------------------------------------


def test_every_command_is_bounded_on_the_host_and_locally():
    conn = RecordingTransport(HOST, [Reply("^true$")])
    assert conn.run("true", timeout=30).ok
    assert conn.wrapped == ["timeout --kill-after=5 30 sh -c true"] and conn.timeouts == [40]


@pytest.mark.parametrize("raised, error", [(ExecTimedOut("x"), StepTimeout), (ConnectionError("reset"), ConnectionFailed),
                                           (EOFError(), ConnectionFailed)])
def test_wire_failures_become_deployctl_errors_naming_the_host(raised, error):
    conn = RecordingTransport(HOST, [Reply("sleep", raises=raised)])
    with pytest.raises(error) as exc:
        conn.run("sleep 100", timeout=5)
    assert str(exc.value).startswith("kimi-a (")


def test_check_names_what_failed_and_its_stderr():
    conn = RecordingTransport(HOST, [Reply("cat", exit_code=1, stderr="cat: /x: No such file or directory\n")])
    with pytest.raises(RemoteCommandFailed) as exc:
        conn.check("cat /x", what="reading /x")
    assert "reading /x failed with exit code 1: cat: /x: No such file" in str(exc.value)


def test_tilde_resolves_with_the_remote_home_and_uploads_need_absolute_paths(tmp_path):
    conn = RecordingTransport(HOST, [], home="/home/dsb")
    assert conn.resolve("~/a b") == "/home/dsb/a b" and conn.resolve("~") == "/home/dsb"
    assert conn.resolve("/abs/~") == "/abs/~"
    local = tmp_path / "f"
    local.write_bytes(b"payload")
    with pytest.raises(ValueError):
        conn.put(local, "~/f")
    conn.put(local, conn.resolve("~/f"))
    assert conn.uploads == [("/home/dsb/f", b"payload")]


# -- steps ------------------------------------------------------------------------------------


def test_free_gpus_reports_the_pids_fuser_killed():
    conn = RecordingTransport(HOST, [Reply(r"fuser", exit_code=0, stdout="4242 4243 ",
                                           stderr="/home/x/dev/nvidia0:\n")])
    outcome = free_gpus.run(ctx(free_gpus, conn))
    assert outcome.data["killed"] == [4242, 4243] and conn.commands == [free_gpus.command(ctx(free_gpus, None))]


def test_free_gpus_with_no_device_files_is_an_error_not_free():
    conn = RecordingTransport(HOST, [Reply(r"fuser", exit_code=NO_DEVICE_FILES,
                                           stderr="no GPU device files match /dev/nvidia*\n")])
    with pytest.raises(RemoteCommandFailed) as exc:
        free_gpus.run(ctx(free_gpus, conn))
    assert "no GPU device files match" in str(exc.value) and "gpu_devices" in str(exc.value)


def _stop_output(*processes, note=None):
    return json.dumps({"processes": list(processes), "note": note})


def test_stop_stale_lists_what_it_stopped():
    out = _stop_output({"pid": 11, "cmdline": "python3 -m sglang.launch_server", "signal": "TERM", "exited": True},
                       {"pid": 12, "cmdline": "python3 stubborn.py", "signal": "KILL", "exited": True})
    conn = RecordingTransport(HOST, [Reply(r"host_ops\.py' stop-processes --scope pidfile --grace 30 --pidfile ~/'deployctl state/server\.pid' "
                                            r"--record ~/'deployctl state/deployment\.json'$", stdout=out)])
    outcome = stop_stale.run(ctx(stop_stale, conn))
    assert outcome.detail == "stopped 2 process(es), 1 needed SIGKILL"


def test_stop_stale_survivor_of_sigkill_is_an_error():
    out = _stop_output({"pid": 13, "cmdline": "python3 zombie", "signal": "KILL", "exited": False, "error": "D state"})
    conn = RecordingTransport(HOST, [Reply(r"stop-processes", stdout=out)])
    with pytest.raises(RemoteOutputError) as exc:
        stop_stale.run(ctx(stop_stale, conn))
    assert "survived SIGKILL: 13 python3 zombie (D state)" in str(exc.value)


@pytest.mark.parametrize("output", ["", "not json", '{"processes": [{"pid": 1}]}', '{"processes": [{"pid": 1, '
                                    '"cmdline": "x", "exited": true, "signal": "HUP"}]}'])
def test_stop_stale_unexpected_output_is_never_fine(output):
    conn = RecordingTransport(HOST, [Reply(r"stop-processes", stdout=output)])
    with pytest.raises(RemoteOutputError):
        stop_stale.run(ctx(stop_stale, conn))


def _gpus(*used):
    return "".join(f"{i}, {UUID[i]}, {mib}, 143771, {50 if mib else 0}\n" for i, mib in enumerate(used))


def _sample(gpus, apps):
    return json.dumps({"gpus": {"exit_code": 0, "stdout": gpus, "stderr": ""},
                       "apps": {"exit_code": 0, "stdout": apps, "stderr": ""}}) + "\n"


def test_wait_gpus_free_watches_on_the_host_until_every_gpu_is_free():
    busy = _sample(_gpus(70000, 0), f"{UUID[0]}, 4242, 70000, python3\n")
    conn = RecordingTransport(HOST, [
        Reply(r"^python3 -I -S ~/'deployctl state/helpers/host_ops\.py' watch-gpus --gpu-query 'nvidia-smi --query-gpu=.*"
              r" --apps-query 'nvidia-smi --query-compute-apps=.* --interval 0\.01 --every 1 --for 120 --until-stdin-eof$",
              stdout=busy * 2 + _sample(_gpus(0, 0), "") + busy),
    ])
    outcome = wait_gpus_free.run(ctx(wait_gpus_free, conn, interval_s=0.01))
    # one exec channel for the whole wait; the step stops reading at the first free sample
    assert outcome.data["polls"] == 3 and len(conn.commands) == 1 and conn.lines_read == 3


def test_wait_gpus_free_times_out_naming_the_holder():
    conn = RecordingTransport(HOST, [Reply(r" watch-gpus ", stdout=_sample(_gpus(70000, 0), f"{UUID[0]}, 4242, 70000, python3\n"))])
    with pytest.raises(StepTimeout) as exc:
        wait_gpus_free.run(ctx(wait_gpus_free, conn, interval_s=0.01, timeout_s=0.05))
    assert "4242" in str(exc.value)


@pytest.mark.parametrize("step", [wait_gpus_free, wait_ready])
def test_a_watch_that_fails_on_the_host_is_its_error_never_a_timeout(step):
    missing = "python3: can't open file '/home/deploy/deployctl state/helpers/host_ops.py': [Errno 2] No such file or directory\n"
    conn = RecordingTransport(HOST, [Reply(r" watch-", exit_code=2, stderr=missing)])
    with pytest.raises(RemoteCommandFailed) as exc:
        step.run(ctx(step, conn, memory=StepMemory(pid=7, log="/l/x.log")))
    assert "exit code 2" in str(exc.value) and "run ensure-helper before this step" in str(exc.value)


@pytest.mark.parametrize("line", ["", "ok", "{}", '{"gpus": {"exit_code": 0, "stdout": "", "stderr": ""}}',
                                  '{"gpus": {"exit_code": "0", "stdout": "", "stderr": ""}, "apps": {"exit_code": 0, "stdout": "", "stderr": ""}}',
                                  _sample("0, GPU-x, lots, 1, 0\n", "")])
def test_wait_gpus_free_unexpected_watch_output_is_never_free(line):
    conn = RecordingTransport(HOST, [Reply(r" watch-gpus ", stdout=line if line.strip() else "\n")])
    with pytest.raises(RemoteOutputError):
        wait_gpus_free.run(ctx(wait_gpus_free, conn, interval_s=0.01))


def test_regression_gate_without_a_last_good_record_makes_this_the_baseline():
    conn = RecordingTransport(HOST, [Reply(r"last-good\.json", stdout="")])
    outcome = regression_gate.run(ctx(regression_gate, conn, memory=StepMemory(verify=AcceptMeasurement(accept_length=3.1, settings={}))))
    assert "becomes the baseline" in outcome.detail and conn.commands[0].count("/home/deploy/") == 0


def test_record_good_is_skipped_without_a_deployment():
    conn = RecordingTransport(HOST, [])
    assert record_good.run(ctx(record_good, conn)).status == "skipped" and conn.commands == []


def _probe(**fields):
    return json.dumps({"pid": 7, "alive": True, "status": None, "error": None, "error_kind": "refused", "body": "",
                       "last_log_line": ""} | fields)


def test_wait_ready_reads_the_pidfile_then_watches_until_healthy():
    conn = RecordingTransport(HOST, [
        Reply(r"^cat -- ~/'deployctl state/server\.pid'$", stdout="7\n"),
        Reply(r"host_ops\.py' watch-health --url http://10\.1\.230\.174:30000/health --pid 7 .* --interval 0\.01 --every 1 --for 1800 --until-stdin-eof$",
              stdout="\n".join([_probe(), _probe(), _probe(status=503, error_kind=None), _probe(status=200, error_kind=None),
                                _probe(status=503, error_kind=None)])),
    ])
    outcome = wait_ready.run(ctx(wait_ready, conn, interval_s=0.01))
    # pidfile + one exec channel for the whole wait, read up to the first 200
    assert outcome.status == "ok" and len(conn.commands) == 2 and conn.lines_read == 4


def test_wait_ready_without_a_recorded_pid_says_launch_first():
    conn = RecordingTransport(HOST, [Reply(r"^cat -- ", exit_code=1, stderr="cat: No such file or directory\n")])
    with pytest.raises(RemoteOutputError) as exc:
        wait_ready.run(ctx(wait_ready, conn))
    assert "no server PID recorded" in str(exc.value) and "(launch first)" in str(exc.value)


def _accept(**fields):
    return json.dumps({"ok": True, "accept_length": 3.02, "completion_tokens": 1024, "spec_verify_ct": 339,
                       "server_avg_spec_accept_length": 3.0, "samples": []} | fields)


def test_verify_acceptance_records_the_measured_accept_length():
    conn = RecordingTransport(HOST, [Reply(r"host_ops\.py' accept-check --base http://10\.1\.230\.174:30000 "
                                           r"--requests 4 --max-new-tokens 256 --concurrency 4 --prompts-json '\[\"",
                                           stdout=_accept())])
    memory = StepMemory()
    outcome = verify_acceptance.run(ctx(verify_acceptance, conn, memory=memory))
    assert outcome.status == "ok" and memory.verify.accept_length == 3.02
    # measured on the built-in prompt set, named by its sha256 (the regression gate compares like with like)
    from deploy.local import datasets

    assert memory.verify.settings["prompts_sha256"] == datasets.builtin().sha256
    argv = shlex.split(conn.commands[-1])
    sent = json.loads(argv[argv.index("--prompts-json") + 1])
    assert sent == datasets.verify_prompts(4) and len({p.split()[0] for p in sent}) == 4
    # a server with --api-key: the helper reads it from the deployment record on the host, never this line
    assert argv[argv.index("--key-from") + 1].endswith("/deployment.json")


def test_verify_acceptance_of_one_point_zero_fails_with_likely_causes():
    conn = RecordingTransport(HOST, [Reply(r"accept-check", stdout=_accept(accept_length=1.0))])
    with pytest.raises(VerificationFailed) as exc:
        verify_acceptance.run(ctx(verify_acceptance, conn))
    assert "no draft token was accepted" in str(exc.value)


def _helper_state(python="3.11.7", missing=()):
    from deploy.steps.ensure_helper import HELPER_FILES, local_digests

    digests = local_digests()
    return json.dumps({"python": python, "files": {n: None if n in missing else digests[n] for n in HELPER_FILES}})


def test_ensure_helper_uploads_only_a_missing_helper_in_one_sftp_session():
    conn = RecordingTransport(HOST, [Reply(r"sys\.version_info", stdout=_helper_state(missing=("host_ops.py",)), times=1)])
    outcome = ensure_helper.run(ctx(ensure_helper, conn))
    assert outcome.data["uploaded"] == ["host_ops.py"]
    helpers_dir = "/home/deploy/deployctl state/helpers"
    assert conn.upload_dirs == [helpers_dir]  # created 0700 when missing, in the same SFTP session
    [(remote, payload)] = conn.uploads
    assert remote == f"{helpers_dir}/host_ops.py" and conn.upload_modes[remote] == 0o600
    from deploy.facts.helpers import helper_payloads

    # host_ops with the state_files it imports, bundled into the one installed file (issue 31)
    assert payload == helper_payloads()["host_ops.py"]
    assert len(conn.commands) == 1  # one command, one SFTP session: no mkdir, no mv, no $HOME lookup


def test_ensure_helper_refuses_an_old_host_python():
    conn = RecordingTransport(HOST, [Reply(r"sys\.version_info", stdout=_helper_state(python="3.6.9"))])
    with pytest.raises(RemoteCommandFailed) as exc:
        ensure_helper.run(ctx(ensure_helper, conn))
    assert "need 3.8+" in str(exc.value) and conn.uploads == []


def test_ensure_helper_uses_what_doctor_read_and_sends_nothing_when_current():
    import time

    from deploy.facts.server import RunSnapshot, ServerState
    from deploy.steps.ensure_helper import local_digests

    snapshot = RunSnapshot(time.monotonic(), "3.10.12", local_digests(), ServerState(None, False, None, None, None), None)
    conn = RecordingTransport(HOST, [])
    outcome = ensure_helper.run(ctx(ensure_helper, conn, memory=StepMemory(snapshot=snapshot)))
    assert outcome.data["uploaded"] == [] and conn.commands == [] and conn.uploads == []
    old = RunSnapshot(time.monotonic(), "3.7.3", local_digests(), ServerState(None, False, None, None, None), None)
    with pytest.raises(RemoteCommandFailed, match="need 3.8"):
        ensure_helper.run(ctx(ensure_helper, conn, memory=StepMemory(snapshot=old)))


def _state(**fields):
    """server-state's answer; a record as the host reads deployment.json (its JSON document)."""
    if isinstance(fields.get("record"), DeploymentRecord):
        fields["record"] = fields["record"].document()
    return json.dumps({"pid": None, "alive": False, "cmdline": "", "record": None, "status": None,
                       "error": "refused"} | fields)


LEGACY_RUN = RUN.model_copy(update={"sglang_generation": "legacy"})  # no version read: one command


def test_converge_redeploys_when_nothing_is_recorded():
    conn = RecordingTransport(HOST, [Reply(r"host_ops\.py' server-state ", stdout=_state())])
    outcome = converge.run(ctx(converge, conn, run=LEGACY_RUN))
    assert outcome.data["converged"] is False and outcome.detail == "redeploying: no deployment is recorded on this host"
    assert len(conn.commands) == 1


def test_converge_leaves_a_server_running_as_desired_alone():
    probe = ctx(converge, None, run=LEGACY_RUN)
    record = desired_record(probe).but(log="/l/sglang-x.log")
    conn = RecordingTransport(HOST, [Reply(r" server-state ", stdout=_state(pid=4242, alive=True, status=200,
                                                                             error=None, record=record))])
    memory = StepMemory()
    outcome = converge.run(ctx(converge, conn, run=LEGACY_RUN, memory=memory))
    assert outcome.data["converged"] is True and memory.pid == 4242 and memory.log == "/l/sglang-x.log"


def test_converge_redeploys_a_recorded_server_that_answers_500():
    record = desired_record(ctx(converge, None, run=LEGACY_RUN))
    conn = RecordingTransport(HOST, [Reply(r" server-state ", stdout=_state(pid=4242, alive=True, status=500,
                                                                             error=None, record=record))])
    outcome = converge.run(ctx(converge, conn, run=LEGACY_RUN))
    assert outcome.data["converged"] is False and "/health 500" in outcome.detail


@pytest.mark.parametrize("state, reason", [
    ({"pid": None, "alive": False, "record": None}, "no deployment is recorded"),
    ({"pid": 4242, "alive": False}, "not running"),
    ({"pid": 4242, "alive": True, "status": 503}, "/health 503"),
    ({"pid": 4242, "alive": True, "status": 200, "argv_changed": True}, "argv changed"),
])
def test_a_replica_kept_in_the_router_must_still_converge_or_nothing_is_stopped(state, reason):
    """The fleet kept it serving because a probe found it unchanged: a change since is an error, not a redeploy."""
    from deploy.base.errors import DeployError
    from deploy.steps.converge import would_converge
    from deploy.facts.server import ServerState

    record = desired_record(ctx(converge, None, run=LEGACY_RUN)).but(log="/l/x.log")
    if state.pop("argv_changed", False):
        record = record.but(argv=record.argv + ["--disable-cuda-graph"])
    fields = {"pid": 4242, "alive": True, "status": 200, "error": None, "record": record} | state
    conn = RecordingTransport(HOST, [Reply(r" server-state ", stdout=_state(**fields))])
    with pytest.raises(DeployError, match="since the check before the drain") as exc:
        converge.run(ctx(converge, conn, run=LEGACY_RUN, memory=StepMemory(must_converge=True)))
    assert reason in str(exc.value) and exc.value.exit_code == 1 and len(conn.commands) == 1
    probe = ServerState(fields["pid"], fields["alive"], fields.get("status"), None, fields["record"])
    unchanged, why = would_converge(launch.desired(ctx(converge, None, run=LEGACY_RUN)), probe)
    assert unchanged is False and reason.split()[0] in why


def test_a_replica_kept_in_the_router_that_converges_passes():
    from deploy.facts.server import ServerState
    from deploy.steps.converge import would_converge

    record = desired_record(ctx(converge, None, run=LEGACY_RUN)).but(log="/l/x.log")
    conn = RecordingTransport(HOST, [Reply(r" server-state ", stdout=_state(pid=7, alive=True, status=200, error=None,
                                                                             record=record))])
    outcome = converge.run(ctx(converge, conn, run=LEGACY_RUN, memory=StepMemory(must_converge=True)))
    assert outcome.data["converged"] is True
    assert would_converge(launch.desired(ctx(converge, None, run=LEGACY_RUN)), ServerState(7, True, 200, None, record)) == (
        True, "already running as desired")


# -- launch, doctor, benchmark: one action each, SSH-free ------------------------------------------


def test_launch_is_one_command_and_records_the_pid_it_printed():
    from deploy.steps import launch

    run = RUN.model_copy(update={"env": {"HF_TOKEN": "hf_s3cr3t"}})
    conn = RecordingTransport(HOST, [Reply(r"setsid nohup", stdout="4242\n")])
    c = ctx(launch, conn, run=run, memory=StepMemory(drafter_path="~/deployctl state/drafters/ab12", drafter_fingerprint="ab12",
                                            sglang_version="0.5.11"))
    outcome = launch.run(c)
    assert outcome.data["pid"] == 4242 and c.memory.deployment is not None and c.memory.deployment.pid == 4242
    assert c.memory.deployment.argv[c.memory.deployment.argv.index("--speculative-draft-model-path") + 1] \
        == "~/deployctl state/drafters/ab12"
    [command] = conn.commands  # log dir, link, launch, PID file, record, pruning: one exec channel
    assert "hf_s3cr3t" not in command and ". ~/'deployctl state/launch.env'" in command
    [(remote, payload)] = conn.uploads
    assert remote == "/home/deploy/deployctl state/launch.env" and conn.upload_modes[remote] == 0o600
    assert payload == b"HF_TOKEN=hf_s3cr3t\n"
    assert [step for step, _ in c.journal] == ["", ""] and [a.kind for _, a in c.journal] == ["upload", "command"]


@pytest.mark.parametrize("stdout, exit_code, stderr, error, fragment", [
    ("", 0, "", RemoteOutputError, "expected the server PID"),
    ("4242\nnohup: ignoring input\n", 0, "", RemoteOutputError, "expected the server PID"),
    ("pid 4242", 0, "", RemoteOutputError, "expected the server PID"),
    ("", 1, "cannot write the PID file ~/x (server pid 77)", RemoteCommandFailed, "launching SGLang failed"),
    ("", 1, "mkdir: cannot create directory: Permission denied", RemoteCommandFailed, "Permission denied"),
])
def test_launch_refuses_anything_but_a_pid(stdout, exit_code, stderr, error, fragment):
    from deploy.steps import launch

    conn = RecordingTransport(HOST, [Reply(r"setsid nohup", stdout=stdout, exit_code=exit_code, stderr=stderr)])
    c = ctx(launch, conn)
    with pytest.raises(error, match=fragment):
        launch.run(c)
    assert c.memory.pid is None and c.memory.deployment is None


def test_a_rollback_launch_relaunches_the_recorded_argv_and_uploads_nothing():
    from deploy.steps import launch

    record = LastGood(argv=["python3", "-m", "sglang.launch_server", "--port", "30000"], drafter_path="~/d/old",
                      drafter_fingerprint="old", env_hash="e", sglang_version="0.5.11", draft_tokens=16,
                      run="r", env_file="~/deployctl state/last-good.env")
    run = RUN.model_copy(update={"env": {"HF_TOKEN": "new"}})
    conn = RecordingTransport(HOST, [Reply(r"setsid nohup", stdout="99\n")])
    c = ctx(launch, conn, run=run, memory=StepMemory(rollback_record=record))
    assert launch.run(c).data["argv"] == record.argv
    assert conn.uploads == [] and ". ~/'deployctl state/last-good.env'" in conn.commands[0]


def test_doctor_sends_one_command_and_stops_the_run_on_a_failing_check(tmp_path):
    """The real fact gatherer runs here (no GPU, no SGLang on this machine), answered through the wire."""
    import subprocess
    import sys

    from deploy.base.errors import RemoteOutputError as Bad
    from deploy.steps import doctor

    host = HOST.model_copy(update={"python": sys.executable, "state_dir": str(tmp_path / "state")})
    probe = StepContext(host=host, run=RUN.model_copy(update={"sglang_python": sys.executable}),
                        settings=doctor.Settings(step="doctor"), conn=None, launch_stamp="x", memory=StepMemory())
    real = subprocess.run(["sh", "-c", doctor.action(probe, script=None).command], capture_output=True, text=True,
                          timeout=60)
    assert real.returncode == 0, real.stderr
    conn = RecordingTransport(host, [Reply(r"exec\(sys\.deployctl_program\)", stdout=real.stdout)])
    c = StepContext(host=host, run=probe.run, settings=doctor.Settings(step="doctor"), conn=conn, launch_stamp="x",
                    memory=StepMemory())
    with pytest.raises(VerificationFailed, match="nothing was stopped"):
        doctor.run(c)
    assert len(conn.commands) == 1
    ignored = StepContext(host=host, run=probe.run, settings=doctor.Settings(step="doctor", ignore=True), conn=conn,
                          launch_stamp="x", memory=StepMemory())
    assert "IGNORED" in doctor.run(ignored).detail
    snapshot = ignored.memory.snapshot  # the run's state, read in the same command
    assert snapshot.server.alive is False and snapshot.last_good is None and set(snapshot.helpers) == {
        "host_ops.py", "fixer.pyz", "drafter_swap.py"} and not any(snapshot.helpers.values())
    for garbage in ("", "Traceback (most recent call last):\n  boom", '{"schema": 1}', real.stdout * 2):
        bad = RecordingTransport(host, [Reply(r"exec\(sys\.deployctl_program\)", stdout=garbage)])
        with pytest.raises(Bad):
            doctor.run(StepContext(host=host, run=probe.run, settings=doctor.Settings(step="doctor"), conn=bad,
                                   launch_stamp="x", memory=StepMemory()))


BENCH_CASE = json.loads((Path(__file__).parents[1] / "facts" / "bench_serving" / "kimi_k26_eagle3_padded_values.json").read_text())
BENCH_OUTPUT = BENCH_CASE["stdout"]


def test_benchmark_is_one_command_and_checks_every_request_succeeded():
    from deploy.steps import benchmark

    conn = RecordingTransport(HOST, [Reply(r"sglang\.bench_serving", stdout=BENCH_OUTPUT)])
    c = ctx(benchmark, conn, num_prompts=768, dataset="random-ids")
    outcome = benchmark.run(c)
    assert outcome.data["dataset"] == "random-ids" and outcome.data["dataset_sha256"] is None
    assert outcome.data["output_tok_s"] == pytest.approx(BENCH_CASE["fact"]["output_tok_s"])
    assert c.memory.bench is not None and c.memory.bench.draft_tokens == 16
    [command] = conn.commands
    assert "--num-prompts 768" in command and "--output-file ~/'deployctl state/bench/bench-20261129T000000Z-t16.jsonl'" in command
    short = RecordingTransport(HOST, [Reply(r"sglang\.bench_serving", stdout=BENCH_OUTPUT)])
    # the harness's failures, never the checkpoint's (issue 28): typed, with the exit codes they had
    with pytest.raises(BenchmarkHarnessFailed, match="only 768 of 800") as lost:
        benchmark.run(ctx(benchmark, short, num_prompts=800, dataset="random-ids"))
    assert lost.value.exit_code == ExitCode.REMOTE_OUTPUT
    failed = RecordingTransport(HOST, [Reply(r"sglang\.bench_serving", exit_code=1, stderr="CUDA out of memory")])
    with pytest.raises(BenchmarkHarnessFailed, match="bench_serving failed .*CUDA out of memory"):
        benchmark.run(ctx(benchmark, failed, dataset="random-ids"))
    garbled = RecordingTransport(HOST, [Reply(r"sglang\.bench_serving", stdout="Traceback (most recent call last)")])
    with pytest.raises(BenchmarkHarnessFailed, match="no 'Serving Benchmark Result' block") as garbage:
        benchmark.run(ctx(benchmark, garbled, dataset="random-ids"))
    assert garbage.value.exit_code == ExitCode.REMOTE_OUTPUT


def _scaled(tok_s: float) -> str:
    return re.sub(r"(Output token throughput \(tok/s\):\s+)\S+", lambda m: f"{m.group(1)}{tok_s}", BENCH_OUTPUT)


def test_benchmark_rounds_run_one_after_the_other_and_report_their_median_and_each_round():
    from deploy.steps import benchmark

    replies = [Reply(r"sglang\.bench_serving", stdout=_scaled(v), times=1) for v in (900.0, 1100.0, 1000.0)]
    conn = RecordingTransport(HOST, replies)
    c = ctx(benchmark, conn, num_prompts=768, dataset="random-ids", rounds=3)
    outcome = benchmark.run(c)
    assert len(conn.commands) == 3 and len(set(conn.commands)) == 1
    assert outcome.data["output_tok_s_rounds"] == [900.0, 1100.0, 1000.0] and outcome.data["output_tok_s"] == 1000.0
    assert "median of 3 rounds, 900.0-1100.0" in outcome.detail
    # the plan is the run: one planned command per round
    assert [a.description.rsplit("(", 1)[1] for a in benchmark.plan(c)] == [
        "round 1 of 3, one after the other)", "round 2 of 3, one after the other)", "round 3 of 3, one after the other)"]
    assert [a.description for _, a in c.journal] == [a.description for a in benchmark.plan(c)]
    second_fails = RecordingTransport(HOST, [Reply(r"sglang\.bench_serving", stdout=BENCH_OUTPUT, times=1),
                                             Reply(r"sglang\.bench_serving", exit_code=1, stderr="Killed")])
    with pytest.raises(BenchmarkHarnessFailed, match=r"round 2 of 3\) \(exit 1\): Killed"):
        benchmark.run(ctx(benchmark, second_fails, num_prompts=768, dataset="random-ids", rounds=3))


def _dataset_state(name: str, digest: str | None) -> str:
    return json.dumps({"python": "3.10.12", "files": {name: digest}})


@pytest.mark.parametrize("on_host", ["missing", "other", "same"])
def test_benchmark_sends_the_dataset_once_per_sha256(tmp_path, on_host):
    import hashlib

    from deploy.local import datasets
    from deploy.steps import benchmark

    records = [{"conversations": [{"from": "human", "value": f"question {i}?"}, {"from": "gpt", "value": "answer"}]}
               for i in range(768)]
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(records))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    name = f"{digest}.json"
    found = {"missing": None, "other": "0" * 64, "same": digest}[on_host]
    conn = RecordingTransport(HOST, [Reply(r"import sys, json, hashlib", stdout=_dataset_state(name, found)),
                                     Reply(r"sglang\.bench_serving", stdout=BENCH_OUTPUT)])
    c = ctx(benchmark, conn, num_prompts=768, dataset=str(path))
    outcome = benchmark.run(c)
    remote = f"~/'deployctl state/datasets/{name}'"
    assert f"--dataset-name sharegpt --dataset-path {remote} --num-prompts 768 --sharegpt-output-len 512" \
        in conn.commands[-1] and "random" not in conn.commands[-1]
    if on_host == "same":
        assert conn.uploads == [] and outcome.data["dataset_uploaded"] is False
    else:
        [(where, content)] = conn.uploads
        assert where.endswith(f"/deployctl state/datasets/{name}") and hashlib.sha256(content).hexdigest() == digest
    assert outcome.data["dataset"] == "prompts.json" and outcome.data["dataset_sha256"] == digest
    assert outcome.data["settings"] == {"num_prompts": 768, "output_len": 512, "max_concurrency": 8,
                                        "dataset": "prompts.json", "dataset_kind": "sharegpt",
                                        "dataset_sha256": digest}
    assert datasets.load_file(path).sha256 == digest


def test_benchmark_expects_as_many_requests_as_the_dataset_has_prompts(tmp_path):
    from deploy.steps import benchmark

    path = tmp_path / "few.jsonl"
    path.write_text("\n".join(json.dumps({"conversations": [{"role": "user", "content": f"q{i}"},
                                                           {"role": "assistant", "content": "a"}]})
                              for i in range(768)) + "\n")
    conn = RecordingTransport(HOST, [Reply(r"import sys, json, hashlib", stdout=_dataset_state("x", None)),
                                     Reply(r"sglang\.bench_serving", stdout=BENCH_OUTPUT)])
    with pytest.raises(RemoteOutputError, match="helper check reported"):  # never trust the remote shape
        benchmark.run(ctx(benchmark, conn, num_prompts=1000, dataset=str(path)))
    import hashlib

    name = hashlib.sha256(path.read_bytes()).hexdigest() + ".jsonl"
    conn = RecordingTransport(HOST, [Reply(r"import sys, json, hashlib", stdout=_dataset_state(name, None)),
                                     Reply(r"sglang\.bench_serving", stdout=BENCH_OUTPUT)])
    outcome = benchmark.run(ctx(benchmark, conn, num_prompts=1000, dataset=str(path)))  # 768 usable: 768 expected
    assert "--dataset-name custom" in conn.commands[-1] and outcome.data["successful_requests"] == 768
