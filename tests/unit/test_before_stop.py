"""The doctor's checks of what the stop will meet (issue 17): phantom GPU memory, other runs' servers,
extra_args SGLang would refuse, tp x dp x pp. Facts gathered by the real host helper (doctor_facts.py)
from a fake host in tmp_path (a scripted nvidia-smi, real processes), judged by the pure checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.doctor.before_stop import (StopPlan, all_checks, check_extra_args, check_gpu_memory, check_other_servers,
                                       check_parallelism, gpu_baseline, option, parse_extra_args)
from deploy.doctor.checks import DoctorInput
from deploy.facts.doctor import SglangCliFacts
from deploy.facts.gpus import GpuRow
from deploy.remote import doctor_facts
from deploy.steps.wait_gpus_free import busy_beyond_baseline
from tests.unit.test_doctor_checks import World

SIM_SERVER_ARGS = Path(__file__).resolve().parents[2] / "sandbox" / "sim_sglang" / "sglang" / "srt" / "server_args.py"
UUID = "GPU-6ef0c3b2-4b1a-9d3e-1c2f-00000000000{}"


class Host(World):
    """World with an nvidia-smi that answers each query from its own file, and real holder processes."""

    def __init__(self, root: Path, monkeypatch):
        super().__init__(root, monkeypatch)
        shutil.copy(SIM_SERVER_ARGS, self.site / "sglang" / "srt" / "server_args.py")
        self.used = [0] * 8
        self.apps: list[tuple[int, int, str]] = []  # (gpu, pid, MiB or "[N/A]")
        self.procs: list[subprocess.Popen] = []
        script = self.bin / "nvidia-smi"
        script.write_text(f"#!/bin/sh\ncase \"$1\" in --query-compute-apps*) cat {root}/apps.out;; "
                          f"*) cat {root}/gpus.out;; esac\n")
        script.chmod(0o755)
        self.write()

    def write(self) -> None:
        (self.root / "gpus.out").write_text("".join(f"{i}, {UUID.format(i)}, {u}, 143771, 0\n"
                                                    for i, u in enumerate(self.used)))
        (self.root / "apps.out").write_text("".join(f"{UUID.format(g)}, {pid}, {mib}, python3\n"
                                                    for g, pid, mib in self.apps))

    def hold(self, gpu: int, mib, pid: int | None = None, *argv: str) -> int:
        if pid is None:
            proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *argv],
                                    stdin=subprocess.PIPE)
            self.procs.append(proc)
            pid = proc.pid
        self.apps.append((gpu, pid, mib))
        if isinstance(mib, int):
            self.used[gpu] += mib
        self.write()
        return pid

    def our_server(self, pid: int, run: str = "kimi") -> None:
        state = self.root / "state"
        state.mkdir(exist_ok=True)
        (state / "server.pid").write_text(f"{pid}\n")
        (state / "deployment.json").write_text(json.dumps({"run": run, "argv": ["python3"], "pid": pid}))

    def given(self, **run) -> DoctorInput:
        host, r = self.host(), self.run(**run)
        facts, sglang = self.facts(host, r)
        return DoctorInput(host, r, r.draft_tokens, facts, sglang)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def host(tmp_path, monkeypatch):
    h = Host(tmp_path, monkeypatch)
    yield h
    h.close()


# --- phantom GPU memory -----------------------------------------------------------------------------

@pytest.mark.parametrize("gpu,mib", [(0, 1), (3, 512), (7, 80000)])
def test_memory_no_process_holds_fails_before_the_stop_naming_the_gpu(host, gpu, mib):
    host.used[gpu] = mib
    host.write()
    check = check_gpu_memory(host.given(), StopPlan())
    assert check.status == "fail", check
    assert f"GPU {gpu}: {mib} MiB of {mib} MiB held by no listed process" in check.reason
    assert "threshold_mib" in check.fix and "--gpu-reset" in check.fix and "reboot" in check.fix
    assert str(mib) in check.fix
    # at or under the playbook's threshold: the wait would end, so it is fine
    assert check_gpu_memory(host.given(), StopPlan(threshold_mib=mib)).status == "pass"
    assert gpu_baseline(host.given()) == {gpu: mib}


def test_memory_held_by_processes_the_stop_ends_passes(host):
    pid = host.hold(0, 70000, None, "sglang::scheduler_TP0")
    host.hold(1, 70000, pid)
    check = check_gpu_memory(host.given(), StopPlan())
    assert check.status == "pass" and "140000 MiB held by processes it ends" in check.reason
    assert gpu_baseline(host.given()) == {}


@pytest.mark.parametrize("pid,why", [(2 ** 22 + 17, "another container"), (1, "another user")])
def test_memory_of_a_process_the_stop_cannot_end_is_named(host, monkeypatch, pid, why):
    if why == "another user":
        monkeypatch.setattr(doctor_facts.os, "getuid", lambda: 4242)  # we run as an unprivileged user; pid 1 is root's
    host.hold(2, 1024, pid)
    check = check_gpu_memory(host.given(), StopPlan())
    assert check.status == "fail" and f"pid {pid} python3" in check.reason and why in check.reason


def test_a_process_with_no_memory_figure_is_not_blamed(host):
    host.hold(4, "[N/A]")
    host.used[4] = 9000
    host.write()
    assert check_gpu_memory(host.given(), StopPlan()).status == "pass"


def test_own_server_with_no_attributed_memory_cannot_be_decided(host):
    pid = host.hold(0, 1, None, "-m", "sglang.launch_server")
    host.apps.clear()  # a container without the host's PID namespace: nvidia-smi lists nobody
    host.used[0] = 70000
    host.write()
    host.our_server(pid)
    assert check_gpu_memory(host.given(), StopPlan()).status == "warn"


@pytest.mark.parametrize("threshold,baseline,used,busy", [
    (0, {}, [0, 0], []), (0, {}, [1, 0], [0]), (0, {1: 512}, [0, 512], []), (0, {1: 512}, [0, 513], [1]),
    (600, {1: 512}, [600, 599], []), (0, {0: 100, 1: 100}, [100, 101], [1]),
])
def test_the_wait_ends_at_the_baseline_held_before_the_stop(threshold, baseline, used, busy):
    rows = [GpuRow(index=i, uuid=UUID.format(i), used_mib=u, total_mib=143771, utilization_pct=0)
            for i, u in enumerate(used)]
    assert [r.index for r in busy_beyond_baseline(rows, threshold, baseline)] == busy


# --- servers of another run, or not deployctl's ---------------------------------------------------------

def test_a_server_deployctl_did_not_start_on_the_gpus_is_named(host):
    pid = host.hold(5, 60000, None, "-m", "sglang.launch_server", "--port", "31000")
    check = check_other_servers(host.given(), StopPlan())
    assert check.status == "fail" and f"pid {pid}" in check.reason and "sglang.launch_server --port 31000" in check.reason
    assert "--replace" in check.fix
    assert check_other_servers(host.given(), StopPlan(replace=True)).status == "warn"


def test_the_server_deployctl_launched_and_its_ranks_are_its_own(host):
    server = host.hold(0, 60000, None, "-m", "sglang.launch_server")
    host.our_server(server)
    assert check_other_servers(host.given(), StopPlan()).status == "pass"


@pytest.mark.parametrize("other_run", ["a", "kimi-old", "KIMI"])
def test_a_server_of_another_run_in_the_state_dir_is_named(host, other_run):
    server = host.hold(0, 60000, None, "-m", "sglang.launch_server")
    host.our_server(server, run=other_run)
    check = check_other_servers(host.given(), StopPlan())
    assert check.status == "fail" and f"serves run {other_run!r}" in check.reason and f"pid {server}" in check.reason


def test_a_stale_python_that_is_no_server_is_left_to_stop_stale(host):
    host.hold(1, 100, None, "train.py")
    assert check_other_servers(host.given(), StopPlan()).status == "pass"


# --- extra_args against the installed SGLang's options ------------------------------------------------

BAD_EXTRA_ARGS = [
    (["--not-an-option"], "unrecognized option --not-an-option"),
    (["--log-levl", "debug"], "did you mean --log-level"),
    (["--help"], "--help"), (["--hel"], "--help"), (["-h"], "help"),
    (["--"], "lone '--'"), (["--enable-metrics", "--"], "lone '--'"),
    (["-x"], "no short options"), (["stray"], "'stray' is not an option"),
    (["--d", "2"], "ambiguous option --d"),
    (["--enable-lora"], "unrecognized option --enable-lora"),
]


@pytest.mark.parametrize("args", [["--tp", "4"], ["--model", "/x"], ["--port=1"], ["--speculative-algo=EAGLE"],
                                  ["--speculative-num-steps", "3"], ["--tensor-parallel-size", "2"], ["--ho", "h"]])
def test_an_option_deployctl_sets_is_refused_whatever_its_spelling(args):
    """The config refuses these already (exit 3); the parser names them too, by SGLang's own groups."""
    parsed = parse_extra_args(args, _sim_options())
    assert len(parsed.problems) == 1 and "deployctl sets itself" in parsed.problems[0]


@pytest.mark.parametrize("args,fragment", BAD_EXTRA_ARGS + [
    ([f"--{name}"], "unrecognized option") for name in ("tp-sizes", "enable-metric-s", "cuda-graphs", "xyz", "dtype2")
])
def test_extra_args_sglang_would_refuse_fail_naming_the_option(host, args, fragment):
    check = check_extra_args(host.given(extra_args=args))
    assert check.status == "fail", check
    assert fragment in check.reason and "server_args.py" in check.fix


@pytest.mark.parametrize("args", [
    ["--enable-metrics"], ["--log-level", "debug"], ["--log-level=debug"], ["--mem", "0.8"],
    ["--random-seed", "-1"], ["--disable-cuda-graph", "--dp-size", "1"], ["--enable-dp-attention", "--dp", "2"],
])
def test_extra_args_sglang_accepts_pass(host, args):
    assert check_extra_args(host.given(extra_args=args)).status == "pass"


def test_without_sglang_sources_extra_args_cannot_be_decided(host):
    (host.site / "sglang" / "srt" / "server_args.py").unlink()
    check = check_extra_args(host.given(extra_args=["--enable-metrics"]))
    assert check.status == "warn" and "server_args.py" in check.reason


def test_the_sandbox_launcher_accepts_exactly_what_the_doctor_reads():
    """One source for both: the stand-in's parser is built from the server_args.py the doctor scans."""
    import argparse

    sys.path.insert(0, str(SIM_SERVER_ARGS.parents[2]))
    try:
        from sglang.srt.server_args import ServerArgs
    finally:
        sys.path.pop(0)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser, "0.5.11")
    parsed = {o for a in parser._actions for o in a.option_strings} - {"-h", "--help"}
    assert {n for o in _sim_options() for n in o.names} == parsed


def _sim_options():
    read = doctor_facts.sglang_options(str(SIM_SERVER_ARGS.parents[1]))
    return SglangCliFacts.model_validate(read).options


REAL_SHAPE = '''
class ServerArgs:
    model_path: str

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        # Model and tokenizer
        parser.add_argument(
            "--model-path",
            "--model",
            type=str,
            help="The path of the model weights.",
            required=True,
        )
        parser.add_argument("--enable-dp-attention", action="store_true", help="Enabling data parallelism for attention")
        parser.add_argument(
            '--data-parallel-size', '--dp-size', type=int, default=ServerArgs.dp_size,
        )

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        parser.add_argument("--not-in-add-cli-args")
'''


def test_options_are_read_from_add_cli_args_as_sglang_writes_it(tmp_path):
    (tmp_path / "srt").mkdir()
    (tmp_path / "srt" / "server_args.py").write_text(REAL_SHAPE)
    found = doctor_facts.sglang_options(str(tmp_path))
    assert [(o["names"], o["nargs"]) for o in found["options"]] == [
        (["--model-path", "--model"], "1"), (["--enable-dp-attention"], "0"), (["--data-parallel-size", "--dp-size"], "1")]
    (tmp_path / "srt" / "server_args.py").write_text("x = 1\n")
    assert doctor_facts.sglang_options(str(tmp_path))["options"] is None


# --- tp x dp x pp --------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp,args,status", [
    (8, ["--dp", "2"], "fail"), (8, ["--dp-size=2"], "fail"), (8, ["--pp-size", "2"], "fail"),
    (4, ["--dp", "2"], "pass"), (4, ["--pp-size", "2"], "pass"), (2, ["--dp", "2", "--pp", "2"], "pass"),
    (2, ["--dp", "4", "--pp", "2"], "fail"), (8, ["--dp", "2", "--enable-dp-attention"], "pass"),
    (2, ["--dp", "4", "--enable-dp-attention"], "fail"), (8, [], "pass"), (8, ["--dp", "0"], "fail"),
    (8, ["--dp", "x"], "fail"),
])
def test_tp_dp_pp_against_the_hosts_gpus(host, tp, args, status):
    check = check_parallelism(host.given(tp_size=tp, extra_args=args))
    assert check.status == status, check


def test_all_checks_name_each_check_once(host):
    names = [c.name for c in all_checks(host.given())]
    assert len(names) == len(set(names))
    assert {"gpu-memory", "other-servers", "extra-args", "parallelism"} <= set(names)


def test_parse_keeps_values_with_their_options():
    options = [option(["--log-level"]), option(["--enable-metrics"], "0"), option(["--random-seed"], value_type="int")]
    parsed = parse_extra_args(["--log-level", "warn", "--enable-metrics", "--random-seed=-3"], options)
    assert parsed.options == {"--log-level": "warn", "--enable-metrics": None, "--random-seed": "-3"}
    assert parsed.problems == ()


# --- the stand-in nvidia-smi's knob: memory no process holds ------------------------------------------

@pytest.mark.parametrize("phantom,used", [({"3": 512}, [0, 0, 0, 512]), ({"0": 1, "2": 7}, [1, 0, 7, 0]),
                                          ({"9": 5, "x": 1, "1": -4, "2": "a"}, [0, 0, 0, 0]), ("[]", [0, 0, 0, 0])])
def test_the_sandbox_nvidia_smi_reports_memory_no_listed_process_holds(tmp_path, phantom, used):
    sim = Path(__file__).resolve().parents[2] / "sandbox" / "sim_nvidia_smi.py"
    (tmp_path / "dev").mkdir()
    for i in range(4):
        (tmp_path / "dev" / f"nvidia{i}").touch()
    (tmp_path / "config.json").write_text(json.dumps({"gpu_count": 4, "gpu_dir": str(tmp_path / "dev")}))
    (tmp_path / "phantom.json").write_text(phantom if isinstance(phantom, str) else json.dumps(phantom))
    env = {"NVIDIA_SMI_SIM_CONFIG": str(tmp_path / "config.json"), "PATH": "/usr/bin:/bin"}
    gpus = subprocess.run([sys.executable, str(sim), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, env=env, timeout=30)
    apps = subprocess.run([sys.executable, str(sim), "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, env=env, timeout=30)
    assert [int(x) for x in gpus.stdout.split()] == used
    assert apps.stdout == ""  # nobody holds it


def _json_documents(seed: int, count: int) -> list[str]:
    """Random JSON texts (nested objects and arrays, numbers, escapes, constants, whitespace)."""
    import random

    rng = random.Random(seed)

    def value(depth: int):
        kind = rng.randrange(8 if depth < 4 else 5)
        if kind == 0:
            return rng.randrange(-10**12, 10**12)
        if kind == 1:
            return rng.uniform(-1e6, 1e6)
        if kind == 2:
            return "".join(rng.choice('ab"\\/\u00e9\n\t\u2028 ') for _ in range(rng.randrange(6)))
        if kind == 3:
            return rng.choice([True, False, None])
        if kind == 4:
            return rng.choice([float("nan"), float("inf"), -float("inf"), 0.0, -0.0])
        if kind in (5, 6):
            return {str(rng.randrange(100)): value(depth + 1) for _ in range(rng.randrange(4))}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    return [rng.choice(["", " ", "\n", "\t\r\n "]) + json.dumps(value(0), indent=rng.choice([None, 2]))
            + rng.choice(["", "\n", "  \n"]) for _ in range(count)]


def test_the_sandbox_nvidia_smi_reads_json_as_the_json_module_does():
    """load_json (json's C scanner, no ``import json``) against json.loads: the same value, or a
    ValueError where json.loads raises one."""
    import io
    import math

    from sandbox.sim_nvidia_smi import load_json

    def same(a, b) -> bool:
        if isinstance(a, float) and isinstance(b, float):
            return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return type(a) is type(b) and a == b

    documents = _json_documents(17, 300)
    broken = [d[: len(d) // 2] for d in documents if len(d.strip()) > 2] + ["", " ", "{", "[1,]", "nul", "{} x",
                                                                          '{"a" 1}', "[1] [2]", "\x00", "'a'",
                                                                          "\x0c[1]", "[1]\x0b", "\u00a0{}"]
    for text in documents:
        assert same(load_json(io.StringIO(text)), json.loads(text)), text
    for text in broken:
        try:
            json.loads(text)
        except ValueError:
            with pytest.raises(ValueError):
                load_json(io.StringIO(text))
        else:
            assert same(load_json(io.StringIO(text)), json.loads(text)), text


# --- issue 39: another user's GPU holder is never killed unasked, and the doctor names every one ----------

import os  # noqa: E402

from deploy.doctor.before_stop import check_gpu_holders  # noqa: E402

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a process of another user (uid 65534) needs root")


def device_holder(host: Host, device: Path, user: int | None) -> int:
    """A process holding ``device`` open: opened here and inherited, so uid 65534 needs no path to it."""
    fd = os.open(device, os.O_RDONLY)
    try:
        kwargs = {"user": user, "group": user} if user is not None else {}
        proc = subprocess.Popen(["sleep", "60"], pass_fds=(fd,), **kwargs)
    finally:
        os.close(fd)
    host.procs.append(proc)
    return proc.pid


@needs_root
def test_deploying_as_root_another_users_gpu_memory_is_not_the_stops_to_free(host):
    """Before issue 39 root "could end" any process, so the doctor passed; free-gpus then SIGKILLed it."""
    theirs = subprocess.Popen(["sleep", "60"], user=65534, group=65534)
    host.procs.append(theirs)
    host.hold(3, 2048, theirs.pid)
    check = check_gpu_memory(host.given(), StopPlan())
    assert check.status == "fail" and f"pid {theirs.pid} python3 (uid 65534: another user's)" in check.reason
    assert check_gpu_memory(host.given(), StopPlan(kill_other_users=True)).status == "pass"


@needs_root
def test_the_doctor_names_every_process_free_gpus_would_kill_and_each_it_leaves_alone(host):
    device = host.root / "dev" / "nvidia2"
    mine, theirs = device_holder(host, device, None), device_holder(host, device, 65534)
    check = check_gpu_holders(host.given(), StopPlan())
    assert check.status == "warn", check
    assert f"free-gpus would kill pid {mine} (user root, uid 0): sleep 60" in check.reason
    assert f"left alone (another user's; free-gpus kill_other_users: true to kill it): pid {theirs} (user nobody, " \
           f"uid 65534)" in check.reason
    told = check_gpu_holders(host.given(), StopPlan(kill_other_users=True))
    assert told.status == "pass" and f"free-gpus would kill pid {theirs} (user nobody, uid 65534)" in told.reason


def test_the_server_stop_stale_stops_is_not_listed_and_nothing_held_passes(host):
    check = check_gpu_holders(host.given(), StopPlan())
    assert check.status == "pass" and "would kill nothing" in check.reason
    pid = device_holder(host, host.root / "dev" / "nvidia0", None)
    host.our_server(pid)
    assert "would kill nothing" in check_gpu_holders(host.given(), StopPlan()).reason


def test_free_gpus_kill_other_users_reaches_the_doctor():
    from deploy.engine.playbook import load_playbook

    doctor = next(s for s in load_playbook("up").steps if s.name == "doctor")
    assert doctor.settings.kill_other_users is False
