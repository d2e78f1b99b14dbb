"""Regenerate the captured host outputs under tests/facts/<fact>/ by running the real commands here.

    .venv/bin/python tests/facts/capture.py [FACT ...]   (only these fact directories; default: all)

Each case is the output of the product's own command builder, run for real on this machine
(psmisc fuser, coreutils sha256sum, the host-side helpers under deploy/remote/, and for
gpu_status the sandbox's SIMULATED nvidia-smi, sandbox/sim_nvidia_smi.py): stored as JSON
{"command", "exit_code", "stdout", "stderr"} and read by tests/unit/test_facts_table.py, which
holds the expected facts. Only processes this script starts are signalled (a ``sleep`` it owns).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from deploy.facts import fuser, gpus, helpers, host_helper  # noqa: E402
from deploy.steps.memory import StepMemory
from tests.fixer_zipapp import fixer_zipapp  # noqa: E402

OUT = Path(__file__).resolve().parent
HOST_OPS = str(ROOT / "deploy" / "remote" / "host_ops.py")
FIXER = str(fixer_zipapp())  # as the hosts run it
PY = sys.executable
SIM_NVIDIA_SMI = ROOT / "sandbox" / "sim_nvidia_smi.py"


def run(command: str, env: dict | None = None) -> dict:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60,
                          env=None if env is None else os.environ | env)
    return {"command": command, "exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def save(fact: str, case: str, data: dict, tmp: str, expect: dict) -> None:
    """``expect`` is what the case must parse to, from what this script set up (never from the parser):
    {"fact": {field: value, ...}} (the fields given must match) or {"error": "message fragment"}."""
    text = json.dumps(data | expect, indent=1, sort_keys=True).replace(tmp, "/TMP").replace(PY, "python3").replace(str(ROOT), "/REPO")
    (OUT / fact).mkdir(exist_ok=True)
    (OUT / fact / f"{case}.json").write_text(text + "\n")


def held_by_sleep(path: Path) -> subprocess.Popen:
    proc = subprocess.Popen(["sh", "-c", f'exec sleep 60 < "{path}"'])
    for _ in range(100):  # bounded: until the sleep has the file open
        if any(os.path.realpath(f"/proc/{proc.pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{proc.pid}/fd")):
            break
        threading.Event().wait(0.02)
    return proc


def capture_sandbox_gpu_status(tmp: str) -> None:
    """gpu-status's one command against the sandbox's SIMULATED nvidia-smi (8 GPUs; GPU 1's device
    file held by a ``sleep`` this script starts, which the simulation counts as 512 MiB)."""
    sim = Path(tmp) / "sim"
    (sim / "bin").mkdir(parents=True)
    (sim / "dev").mkdir()
    (sim / "bin" / "nvidia-smi").write_bytes(SIM_NVIDIA_SMI.read_bytes())
    (sim / "bin" / "nvidia-smi").chmod(0o755)
    uuids = [f"GPU-{i:08x}-5eed-4d00-8000-{i:012x}" for i in range(8)]
    for i in range(8):
        (sim / "dev" / f"nvidia{i}").touch()
    config = {"gpu_count": 8, "gpu_dir": str(sim / "dev"), "uuids": uuids, "alloc_dir": str(sim / "alloc")}
    (sim / "config.json").write_text(json.dumps(config))
    env = {"PATH": f"{sim / 'bin'}:{os.environ['PATH']}", "NVIDIA_SMI_SIM_CONFIG": str(sim / "config.json")}
    tag = "5eed5eed5eed5eed"
    idle = [{"index": i, "uuid": uuids[i], "used_mib": 0, "total_mib": 143771, "utilization_pct": 0, "holders": []}
            for i in range(8)]
    save("gpu_status", "sandbox_sim_idle", run(gpus.gpu_status_command(tag), env), tmp,
         {"expected_gpus": 8, "fact": {"gpus": idle}, "source": "SIMULATION: sandbox/sim_nvidia_smi.py"})
    holder = held_by_sleep(sim / "dev" / "nvidia1")
    busy = [dict(r) for r in idle]
    busy[1] = busy[1] | {"used_mib": 512, "holders": [
        {"gpu_uuid": uuids[1], "pid": holder.pid, "used_mib": 512, "process_name": "sleep"}]}
    save("gpu_status", "sandbox_sim_one_holder", run(gpus.gpu_status_command(tag), env), tmp,
         {"expected_gpus": 8, "fact": {"gpus": busy}, "source": "SIMULATION: sandbox/sim_nvidia_smi.py"})
    holder.kill()
    holder.wait(timeout=10)
    (sim / "driver_failed").touch()
    save("gpu_status", "sandbox_sim_driver_failed", run(gpus.gpu_status_command(tag), env), tmp,
         {"expected_gpus": 8, "error": "GPU query (--query-gpu) failed (exit code 9): NVIDIA-SMI has failed",
          "source": "SIMULATION: sandbox/sim_nvidia_smi.py"})


def capture_helper_state(tmp: str) -> None:
    """ensure-helper's one read when no doctor ran: the host python's version and the helpers' sha256."""
    (Path(tmp) / "host_ops.py").write_bytes(Path(HOST_OPS).read_bytes())
    paths = [f"{tmp}/host_ops.py", f"{tmp}/fixer.pyz"]
    version = "%d.%d.%d" % sys.version_info[:3]
    save("helper_state", "one_missing", run(helpers.helper_state_command(PY, paths)), tmp,
         {"fact": {"python": version, "files": {"host_ops.py": hashlib.sha256(Path(HOST_OPS).read_bytes()).hexdigest(),
                                                "fixer.pyz": None}}})
    save("helper_state", "python_not_found", run(helpers.helper_state_command("/nonexistent/python3", paths)), tmp,
         {"error": "cannot run the host's python '/nonexistent/python3'"})


def main() -> None:
    only = set(sys.argv[1:])
    if only:
        with tempfile.TemporaryDirectory() as tmp:
            if "gpu_status" in only:
                capture_sandbox_gpu_status(tmp)
            if "helper_state" in only:
                capture_helper_state(tmp)
        return
    with tempfile.TemporaryDirectory() as tmp:
        capture_sandbox_gpu_status(tmp)
        dev = Path(tmp) / "dev"
        dev.mkdir()
        for i in range(2):
            (dev / f"nvidia{i}").touch()
        holder = held_by_sleep(dev / "nvidia1")
        save("fuser_kill", "one_holder", run(fuser.kill_command(f"{dev}/nvidia*")), tmp, {"fact": {"pids": [holder.pid]}})
        holder.wait(timeout=10)
        save("fuser_kill", "no_holder", run(fuser.kill_command(f"{dev}/nvidia*")), tmp, {"fact": {"pids": []}})
        save("fuser_kill", "no_device_files", run(fuser.kill_command(f"{tmp}/none/nvidia*")), tmp,
             {"error": "no GPU device files match /TMP/none/nvidia*"})

        capture_helper_state(tmp)

        save("stop_processes", "pidfile_missing", run(host_helper.stop_processes_command(
            PY, HOST_OPS, "pidfile", 1, pidfile=f"{tmp}/server.pid")), tmp, {"fact": {"scope": "pidfile", "processes": []}})
        server = subprocess.Popen(["bash", "-c", "exec -a sglang-stand-in sleep 60"])
        (Path(tmp) / "server.pid").write_text(f"{server.pid}\n")
        save("stop_processes", "pidfile_term", run(host_helper.stop_processes_command(
            PY, HOST_OPS, "pidfile", 5, pidfile=f"{tmp}/server.pid")), tmp,
            {"fact": {"scope": "pidfile", "note": None, "processes": [
                {"pid": server.pid, "cmdline": "sglang-stand-in 60", "signal": "TERM", "exited": True, "error": None}]}})
        server.wait(timeout=10)

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        port = httpd.server_address[1]
        log = Path(tmp) / "server.log"
        log.write_text("[2026-11-30 10:00:00] Load weight begin\n[2026-11-30 10:00:01] Uvicorn running\n")
        save("probe", "http_404", run(host_helper.probe_command(PY, HOST_OPS, f"http://127.0.0.1:{port}/health",
                                                                os.getpid(), str(log))), tmp,
             {"fact": {"pid": os.getpid(), "alive": True, "status": 404, "error_kind": None,
                       "last_log_line": "[2026-11-30 10:00:01] Uvicorn running"}})
        httpd.shutdown()
        httpd.server_close()
        save("probe", "refused_dead_pid", run(host_helper.probe_command(
            PY, HOST_OPS, f"http://127.0.0.1:{port}/health", 2 ** 22 + 7, str(log))), tmp,
            {"fact": {"pid": 2 ** 22 + 7, "alive": False, "status": None, "error_kind": "refused"}})
        save("accept_check", "refused", run(host_helper.accept_check_command(
            PY, HOST_OPS, f"http://127.0.0.1:{port}", 2, 8)), tmp,
            {"fact": {"ok": False, "accept_length": None, "samples": []}})

        save("fixer_summary", "no_such_checkpoint", run(f"{PY} {FIXER} --json {tmp}/no-drafter"), tmp,
             {"fact": {"status": "error", "code": 6, "error": "/TMP/no-drafter does not exist"}})
        save("fixer_summary", "fingerprint_no_such_dir", run(f"{PY} {FIXER} --fingerprint {tmp}/no-drafter"), tmp,
             {"fact": {"status": "error", "code": 6}})
        capture_fixer_store(tmp)
        save("sglang_version", "not_installed", run(
            f"{PY} -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'"), tmp,
             {"error": "SGLang is not installed for 'python3'"})


def capture_fixer_store(tmp: str) -> None:
    """``fixer.pyz store`` as the fix-keys step builds it, on drafters written here."""
    import shutil

    from deploy.config.models import Host, Run
    from deploy.steps import fix_keys
    from deploy.steps.base import StepContext
    from tests.fixtures_ckpt import make_speculators_drafter

    state = Path(tmp) / "state"
    (state / "helpers").mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXER, state / "helpers" / "fixer.pyz")

    def command(drafter: Path, version: str | None, **settings) -> str:
        host = Host.model_construct(**{**Host(name="h", address="10.0.0.1").model_dump(), "state_dir": str(state),
                                       "python": PY})
        run_ = Run(name="r", hosts=["h"], base_model="/m", drafter=str(drafter), sglang_python=PY)
        ctx = StepContext(host=host, run=run_, settings=fix_keys.Settings(step="fix-keys", **settings), conn=None,
                          launch_stamp="x", memory=StepMemory(sglang_version=version or None))
        return fix_keys.plan(ctx)[0].command

    one = make_speculators_drafter(Path(tmp) / "drafter")
    save("fixer_summary", "store_converted", run(command(one, "0.5.11")), tmp,
         {"fact": {"status": "converted", "exit_code": 0, "renamed": 10, "stored_before": False,
                   "sglang_version": "0.5.11"}})
    save("fixer_summary", "store_unchanged", run(command(one, "0.5.11", when="changed")), tmp,
         {"fact": {"status": "unchanged", "exit_code": 0, "stored_before": True, "verification": None}})
    two = make_speculators_drafter(Path(tmp) / "two-layers", layers=2)
    save("fixer_summary", "store_two_layers_on_0_5_11", run(command(two, "0.5.11")), tmp,
         {"fact": {"status": "verify_failed", "exit_code": 8, "stored_before": False, "pruned": None}})
    save("fixer_summary", "store_no_sglang", run(command(two, None)), tmp,
         {"fact": {"status": "no_sglang_version", "exit_code": 1, "sglang_version": None}})


if __name__ == "__main__":
    main()
