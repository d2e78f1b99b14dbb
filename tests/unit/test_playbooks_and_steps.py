"""Pure parts of the steps and playbooks: command builders, parsers, validation. No SSH."""

import hashlib
import json
import sys
import os
import re
from pathlib import Path
import shlex
import subprocess

import pytest

from deploy.config.models import Host, Run
from deploy.host.sglang_argv import sglang_argv
from deploy.base.errors import ConfigError, RemoteOutputError
from deploy.facts.fuser import parse_killed
from deploy.facts.host_helper import parse_probe, parse_stop_report
from deploy.engine.plan import plan_playbook
from deploy.engine.playbook import load_playbook
from deploy.steps import REGISTRY, ensure_helper, free_gpus, launch, stop_stale, wait_gpus_free, wait_ready
from deploy.steps.base import StepContext

HOST = Host(name="kimi-a", address="10.1.230.174", state_dir="/var/lib/deploy ctl")
RUN = Run(name="r", hosts=["kimi-a"], base_model="/data/models/Kimi K2.5", drafter="~/drafters/it's",
          extra_args=["--mem-fraction-static", "0.85"], env={"NCCL_DEBUG": "WARN x", "HF_TOKEN": "hf_s3cr3t"})


def ctx_for(module, run=RUN, host=HOST, **settings):
    return StepContext(host=host, run=run, settings=module.Settings(step=module.NAME, **settings), conn=None,
                       launch_stamp="20261129T000000Z")


@pytest.mark.parametrize("name", ["up", "restart", "down"])
def test_builtin_playbooks_load(name):
    playbook = load_playbook(name)
    assert playbook.steps and all(s.name in REGISTRY for s in playbook.steps)


def test_up_playbook_order_matches_the_seed_procedure():
    assert [s.name for s in load_playbook("up").steps] == [
        "doctor", "ensure-helper", "fix-keys", "converge", "stop-stale", "free-gpus", "wait-gpus-free", "launch",
        "wait-ready", "verify-acceptance", "record-good"]


@pytest.mark.parametrize("name", ["up", "restart", "bench"])
def test_doctor_runs_before_anything_is_stopped(name):
    steps = [s.name for s in load_playbook(name).steps]
    assert steps[0] == "doctor" and steps.index("doctor") < steps.index("stop-stale")


def test_unknown_step_and_setting_name_file_and_line(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nsteps:\n  - step: ensure-helper\n  - step: free-gpu\n  - step: wait-gpus-free\n    treshold_mib: 5\n")
    with pytest.raises(ConfigError) as err:
        load_playbook(str(path))
    text = str(err.value)
    assert f"{path}:4" in text and "unknown step 'free-gpu'" in text
    assert f"{path}:6" in text and "treshold_mib" in text and "unknown key" in text


def test_bad_setting_value(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nsteps:\n  - step: stop-stale\n    scope: everyone\n")
    with pytest.raises(ConfigError, match=r"mine.yaml:4.*scope"):
        load_playbook(str(path))


@pytest.mark.parametrize("tokens, expected", [(16, (15, 1, 16)), (10, (9, 1, 10)), (5, (4, 1, 5)), (2, (1, 1, 2))])
def test_topk1_sets_num_steps_explicitly(tokens, expected):
    assert launch.speculative_plan(RUN, tokens) == expected


def test_topk_above_one_uses_configured_steps():
    run = RUN.model_copy(update={"eagle_topk": 8, "speculative_num_steps": 5})
    assert launch.speculative_plan(run, 32) == (5, 8, 32)


def test_sglang_argv_is_the_documented_command():
    argv = sglang_argv(RUN, HOST, 16)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    pairs = dict(zip(argv[3::2], argv[4::2]))
    assert pairs["--speculative-algorithm"] == "EAGLE3"
    assert pairs["--speculative-num-steps"] == "15" and pairs["--speculative-num-draft-tokens"] == "16"
    assert pairs["--host"] == "10.1.230.174" and pairs["--port"] == "30000" and pairs["--tp-size"] == "8"
    assert "--trust-remote-code" in argv and argv[-2:] == ["--mem-fraction-static", "0.85"]


def test_launch_command_is_detached_and_quoted():
    ctx = ctx_for(launch)
    env_upload, planned = launch.plan(ctx)
    cmd = planned.command
    # the log directory first, on its own: a failure exits before anything is started
    assert cmd.startswith("mkdir -p -m 700 -- '/var/lib/deploy ctl/logs' && ln -sfn -- ")
    assert "deployment.json" in cmd and "tail -n +21" in cmd and cmd.endswith('echo "$pid"')
    assert "HF_TOKEN, NCCL_DEBUG" in env_upload.description and env_upload.secret
    assert env_upload.files[0].mode == 0o600 and env_upload.when
    shown = str(env_upload.to_dict()) + env_upload.shown + str(planned.to_dict())
    assert "hf_s3cr3t" not in shown and "sha256" not in str(env_upload.to_dict())  # secrets stay off the plan
    assert "set -a && . '/var/lib/deploy ctl/launch.env' && set +a || exit 1; setsid nohup python3 -m sglang.launch_server" in cmd
    assert "< /dev/null &" in cmd and "2>&1" in cmd
    assert "~/'drafters/it'\"'\"'s'" in cmd  # tilde expands, the rest is one literal word
    assert "'/data/models/Kimi K2.5'" in cmd
    assert "'/var/lib/deploy ctl/server.pid'" in cmd
    assert planned.argv == sglang_argv(RUN, HOST, 16)
    shlex.split(cmd.replace("~/", "/home/u/"))  # well-formed shell words


def test_log_names_are_unique_per_launch_and_sort_by_time():
    names = [launch.new_log_name() for _ in range(200)]
    assert len(set(names)) == 200
    assert all(re.fullmatch(r"sglang-\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{6}\.log", n) for n in names)


def test_log_pruning_keeps_the_newest_twenty(tmp_path):
    import subprocess

    logs = tmp_path / "logs"
    logs.mkdir()
    names = sorted(f"sglang-202611{d:02d}T000000.000000Z-abcdef.log" for d in range(1, 26))
    names.append("sglang-20261101T000000Z.log")  # the old, second-stamped form
    for n in names + ["keep-me.txt"]:
        (logs / n).write_text("")
    ctx = ctx_for(launch)
    ctx = type(ctx)(**{**ctx.__dict__, "host": HOST.model_copy(update={"state_dir": str(tmp_path)})})
    subprocess.run(["sh", "-c", launch.prune_logs_command(ctx)], check=True)
    left = sorted(os.listdir(logs))
    assert "keep-me.txt" in left and len(left) == 21
    assert [n for n in left if n.startswith("sglang-")] == sorted(names)[-20:]


def test_env_file_round_trips_through_sh(tmp_path):
    import subprocess

    env = {"HF_TOKEN": "hf_s3cr3t", "ODD": "a b'c\"$(id)"}
    path = tmp_path / "launch.env"
    path.write_text(launch.env_file_text(env))
    out = subprocess.run(["sh", "-c", f"set -a; . '{path}'; set +a; env"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert "HF_TOKEN=hf_s3cr3t\n" in out.stdout and "ODD=a b'c\"$(id)\n" in out.stdout


def test_stop_stale_user_scope_excludes_distribution_daemons():
    cmd = stop_stale.command(ctx_for(stop_stale, scope="user"))
    assert "--exclude networkd-dispatcher --exclude unattended-upgrade" in cmd


def test_plan_covers_every_step_in_order():
    plans = plan_playbook(load_playbook("up"), RUN, [HOST])
    assert [name for name, _ in plans["kimi-a"]] == [s.name for s in load_playbook("up").steps]
    commands = [c.shown for _, cmds in plans["kimi-a"] for c in cmds]
    assert not any("killall" in c for c in commands)
    assert any("fuser \"$@\"" in c and "kill -KILL" in c for c in commands)  # the deploy user's holders only (issue 39)


def test_disabled_steps_are_not_planned():
    plans = plan_playbook(load_playbook("down"), RUN, [HOST])
    assert [name for name, _ in plans["kimi-a"]] == ["ensure-helper", "stop-stale"]


def test_fuser_unexpected_output_is_an_error():
    with pytest.raises(RemoteOutputError):
        parse_killed("/dev/nvidia0: 123", "h")


def test_free_gpus_command_quotes_directory_and_keeps_glob():
    host = HOST.model_copy(update={"gpu_devices": "/home/dsb x/dev/nvidia*"})
    assert free_gpus.command(ctx_for(free_gpus, host=host)).startswith("set -- '/home/dsb x/dev/nvidia'*;")


def test_stop_stale_command_and_parser():
    ctx = ctx_for(stop_stale, scope="pidfile", grace_s=3)
    assert stop_stale.command(ctx).endswith("--scope pidfile --grace 3 --pidfile '/var/lib/deploy ctl/server.pid' "
                                              "--record '/var/lib/deploy ctl/deployment.json'")
    doc = {"processes": [{"pid": 5, "cmdline": "python3 x", "signal": "KILL", "exited": True}], "note": None}
    assert parse_stop_report(json.dumps(doc), "h").processes[0].pid == 5
    for bad in ("", "{}", '{"processes": [{"pid": 1}]}', '{"processes": [{"pid": 1, "cmdline": "", "signal": "HUP", "exited": true}]}'):
        with pytest.raises(RemoteOutputError):
            parse_stop_report(bad, "h")


def test_probe_parser_is_strict():
    assert parse_probe('{"alive": true, "status": 503, "error": null}', "h").status == 503
    for bad in ("", "ok", '{"alive": "yes", "status": 200}', '{"alive": true, "status": "200"}'):
        with pytest.raises(RemoteOutputError):
            parse_probe(bad, "h")


def test_health_url_probes_loopback_for_wildcard_bind():
    run = RUN.model_copy(update={"serve_host": "0.0.0.0"})
    assert wait_ready.health_url(ctx_for(wait_ready, run=run)) == "http://127.0.0.1:30000/health"
    assert wait_ready.health_url(ctx_for(wait_ready)) == "http://10.1.230.174:30000/health"


def test_describe_busy_names_holders():
    from deploy.facts.gpus import ComputeApp, GpuRow

    row = GpuRow(index=3, uuid="GPU-1", used_mib=120000, total_mib=143771, utilization_pct=0,
                 holders=(ComputeApp(gpu_uuid="GPU-1", pid=88882, used_mib=120000, process_name="python3"),))
    assert wait_gpus_free.describe_busy([row]) == "GPU 3: 120000 MiB held by pid 88882 python3"


class BusyHost:
    """A transport whose host-side GPU watch shows GPU 0 busy, a line every 0.02 s until the deadline
    or the channel is closed (no SSH: the step's logic only)."""

    host = HOST

    def __init__(self, for_s: float = 60.0):
        self.calls = 0
        self.for_s = for_s

    def watch(self, command, on_line, *, timeout, cancelled, silence_s=None):
        import json
        import time

        from deploy.base.errors import Interrupted
        from deploy.ssh.transport import WatchResult

        self.calls += 1
        gpus = "".join(f"{i}, GPU-{i:04d}, {500 if i == 0 else 0}, 143771, 0\n" for i in range(8))
        line = json.dumps({"gpus": {"exit_code": 0, "stdout": gpus, "stderr": ""},
                           "apps": {"exit_code": 0, "stdout": "GPU-0000, 4242, 500, python3\n", "stderr": ""}})
        deadline = time.monotonic() + self.for_s
        while time.monotonic() < deadline:
            if cancelled.wait(0.02):
                raise Interrupted(f"{self.host.name}: interrupted")
            if on_line(line):
                return WatchResult(command, None, "")
        return WatchResult(command, 0, "")


def test_cancel_stops_a_polling_step_promptly():
    import threading
    import time

    from deploy.base.errors import Interrupted

    ctx = ctx_for(wait_gpus_free, interval_s=30)
    ctx.conn = BusyHost()
    timer = threading.Timer(0.2, ctx.cancelled.set)
    timer.start()
    started = time.monotonic()
    with pytest.raises(Interrupted):
        wait_gpus_free.run(ctx)
    assert time.monotonic() - started < 10  # not the 30 s poll interval
    assert ctx.conn.calls == 1  # one host-side watch: one exec channel


def test_wait_gpus_free_times_out_naming_holder_without_ssh():
    from deploy.base.errors import StepTimeout

    ctx = ctx_for(wait_gpus_free, interval_s=0.01, timeout_s=0.05)
    ctx.conn = BusyHost(for_s=0.05)
    with pytest.raises(StepTimeout, match="GPU 0: 500 MiB held by pid 4242 python3"):
        wait_gpus_free.run(ctx)


_GOOD = {"python": "3.11.7", "files": {"host_ops.py": "a" * 64, "fix_eagle3_keys.py": None}}


@pytest.mark.parametrize(
    "exit_code, stdout, stderr, fragment",
    [
        (0, json.dumps(_GOOD | {"python": "3.6.9"}), "", "need 3.8+"),
        (0, json.dumps(_GOOD | {"python": "2.7.18"}), "", "need 3.8+"),
        (127, "", "sh: 1: python3: not found", "cannot run the host's python"),
        (1, "", "SyntaxError: invalid syntax", "cannot run the host's python"),
        (0, "Python 3.11.7", "", "helper check printed"),
        (0, "", "", "helper check printed"),
        (0, json.dumps(_GOOD | {"python": "three"}), "", "for its version"),
        (0, json.dumps(_GOOD | {"extra": 1}), "", "helper check printed"),
        (0, json.dumps(_GOOD | {"python": 3.11}), "", "helper check printed"),
        (0, json.dumps(_GOOD | {"files": {"host_ops.py": "a" * 64}}), "", "expected"),
        (0, json.dumps(_GOOD | {"files": {"host_ops.py": "A" * 64, "fix_eagle3_keys.py": None}}), "", "malformed"),
        (0, json.dumps(_GOOD | {"files": {"host_ops.py": "a" * 63, "fix_eagle3_keys.py": None}}), "", "malformed"),
        (0, json.dumps(_GOOD | {"files": {"host_ops.py": 5, "fix_eagle3_keys.py": None}}), "", "helper check printed"),
        (0, json.dumps(_GOOD) + "\n" + json.dumps(_GOOD), "", "helper check printed"),
    ],
)
def test_host_python_and_helper_state_are_parsed_strictly(exit_code, stdout, stderr, fragment):
    from deploy.base.errors import DeployError
    from deploy.facts.helpers import parse_helper_state

    names = ["host_ops.py", "fix_eagle3_keys.py"]
    with pytest.raises(DeployError, match=fragment):
        parse_helper_state(exit_code, stdout, stderr, "python3", names, "kimi-a")
    assert parse_helper_state(0, json.dumps(_GOOD), "", "python3", names, "kimi-a").files["fix_eagle3_keys.py"] is None


def test_helper_state_program_runs_on_this_python(tmp_path):
    from deploy.facts.helpers import helper_state_command, parse_helper_state

    (tmp_path / "a.py").write_bytes(b"x")
    result = subprocess.run(["sh", "-c", helper_state_command(sys.executable, [str(tmp_path / "a.py"), str(tmp_path / "b.py")])],
                            capture_output=True, text=True, timeout=30)
    state = parse_helper_state(result.returncode, result.stdout, result.stderr, "python3", ["a.py", "b.py"], "h")
    assert state.files == {"a.py": hashlib.sha256(b"x").hexdigest(), "b.py": None}


def test_fix_keys_reads_the_sglang_version_from_metadata_not_by_importing():
    from deploy.steps import fix_keys

    command = fix_keys.version_command(ctx_for(fix_keys))
    program = shlex.split(command)[2]
    assert "importlib.metadata" in program and "import sys, sglang" not in program
    compile(program, "<version>", "exec")


def test_doctor_plan_is_one_command_and_sends_the_helper_inline():
    from deploy.steps import doctor

    planned = doctor.plan(ctx_for(doctor))
    assert len(planned) == 1  # host python, and sglang_python started by it: one exec channel
    assert planned[0].command.startswith("python3 -I -S -c 'import sys; sys.deployctl_program = sys.argv.pop(1); exec(sys.deployctl_program)' ") and " host " in planned[0].command
    assert "'/data/models/Kimi K2.5'" not in planned[0].command  # the spec is one quoted JSON word
    words = shlex.split(planned[0].command)
    spec = json.loads(words[-1])
    assert spec["base_model"] == "/data/models/Kimi K2.5" and spec["drafter"] == "~/drafters/it's"
    assert spec["sglang"] == {"python": "python3", "timeout_s": 60, "env": {}, "spec": {"base_model": "/data/models/Kimi K2.5"}}
    assert set(spec["run_state"]) == {"helpers", "server", "last_good", "quarantine"}


STEP_FILES = sorted((Path(__file__).resolve().parents[2] / "deploy" / "steps").glob("*.py"))
#: not steps: what steps share (base, the typed memory), and swap_decision (pure, no host: swap-drafter and plan ask it)
#: memory.py (typed step memory), failure_cause.py (the typed failure classification the steps and the engine
#: share, issue 28) and swap_decision.py (the swap decision, issue 29) are not steps
NOT_STEPS = ("base.py", "memory.py", "__init__.py", "swap_decision.py", "failure_cause.py")


@pytest.mark.parametrize("path", [p for p in STEP_FILES if p.name not in NOT_STEPS], ids=lambda p: p.name)
def test_steps_reach_the_host_only_through_planned_actions(path):
    """``run`` performs actions via ctx.execute*, so what it does is what ``plan`` lists (and the journal sees)."""
    text = path.read_text()
    assert "require_conn" not in text and not re.search(r"\bconn\.(run|check|watch|put|upload|stream)\(", text), \
        f"{path.name} sends commands around ctx.execute"
    assert "def plan(" in text and "def run(" in text
