"""The sandbox (SIMULATED GPU hosts, a test double) behaves like the real thing where it matters.

Everything here goes through real ssh/sshd (Sandbox.run) or real HTTP, never through deployctl's
own transport, so these tests check the stand-ins themselves. The first group needs no sandbox.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandbox import drafter as drafter_mod
from tests.integration.helpers import REPO

SIM_SMI = REPO / "sandbox" / "sim_nvidia_smi.py"
SIM_LAUNCH = REPO / "sandbox" / "sim_sglang" / "sglang" / "launch_server.py"
H200_MIB = 143771

#: the stand-in's `import sglang` sleeps 2.5 s like a real install's; these tests of the stand-in
#: itself start it a dozen times and pay 0.2 s (tests/integration/helpers.py TEST_LAUNCH_ENV)
FAST_IMPORT = "SGLANG_SIM_IMPORT_SECONDS=0.2"
LAUNCH = ("python3 -m sglang.launch_server --model-path ~/models/Kimi-K2.5 "
          "--speculative-algorithm EAGLE3 --speculative-draft-model-path {drafter} "
          "--speculative-num-steps 15 --speculative-eagle-topk 1 --speculative-num-draft-tokens 16 "
          "--tp-size 8 --host {host} --port {port} --trust-remote-code --mem-fraction-static 0.85")


# --------------------------------------------------------------------------------------------
# helpers


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll predicate() until it returns something truthy; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def gpu_used(sb, name: str) -> list[int]:
    res = sb.run(name, "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits")
    assert res.returncode == 0, res.stderr
    rows = [line.split(", ") for line in res.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == list(range(len(rows)))
    return [int(r[1]) for r in rows]


def compute_apps(sb, name: str) -> list[list[str]]:
    res = sb.run(name, "nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid "
                       "--format=csv,noheader,nounits")
    assert res.returncode == 0, res.stderr
    return [line.split(", ") for line in res.stdout.splitlines()]


def http(url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def health(host, port: int) -> int | None:
    try:
        return http(f"http://{host.address}:{port}/health", timeout=2)[0]
    except OSError:
        return None  # refused while loading, as with real SGLang


def launch_healthy(sb, name: str, drafter: str, extra: str = "") -> int:
    """The stand-in server on ``name``'s port 30000 with ``drafter``, quick to load, once /health says 200."""
    h = sb.host(name)
    args = LAUNCH.format(drafter=drafter, host=h.address, port=30000) + extra
    pid = launch_detached(sb, name, args, "~/sglang.log", env="SGLANG_SIM_LOAD_SECONDS=0.5")
    wait_until(lambda: health(h, 30000) == 200, 30, "/health 200")
    return pid


def launch_detached(sb, name: str, args: str, log: str, env: str = "") -> int:
    # Not "cd ~ && X &": that backgrounds a subshell which keeps ssh's stdout open (reference 7).
    cmd = f"cd ~ || exit 1; {FAST_IMPORT} {env} setsid nohup {args} > {log} 2>&1 < /dev/null & echo $!"
    res = sb.run(name, cmd)
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


def pid_alive(sb, name: str, pid: int) -> bool:
    """Running (a zombie waiting for this container's slow PID 1 to reap it counts as dead)."""
    state = sb.run(name, f"ps -o stat= -p {pid}").stdout.strip()
    return bool(state) and not state.startswith("Z")


def rename_header_prefix(path: Path, old: str, new: str) -> int:
    """Same-length key rename in the safetensors header, in place; the tensor bytes never move."""
    assert len(old) == len(new)
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        renamed = {(new + k[len(old):] if k.startswith(old) else k): v for k, v in header.items()}
        blob = json.dumps(renamed, separators=(",", ":")).encode()
        assert len(blob) <= n
        f.seek(8)
        f.write(blob + b" " * (n - len(blob)))
    return sum(k.startswith(old) for k in header)


def load_launch_module():
    # the stand-in imports its own package (sglang.srt.layers.quantization, sglang.srt.speculative):
    # put it on sys.path only while it loads, so no other test sees a top-level `sglang`
    spec = importlib.util.spec_from_file_location("sim_sglang_launch_server", SIM_LAUNCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    root = str(SIM_LAUNCH.parents[1])
    sys.path.insert(0, root)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(root)
        for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
            del sys.modules[name]
    return module


# --------------------------------------------------------------------------------------------
# no sandbox needed


def test_drafter_is_valid_safetensors_in_speculators_layout(tmp_path):
    """Checked by the real safetensors library (it refuses holes, overlaps and wrong sizes on open)."""
    from safetensors import safe_open

    names = drafter_mod.write_eagle3_drafter(tmp_path / "d")
    raw = (tmp_path / "d" / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and raw[8:9] == b"{"               # padded like the safetensors writer
    with safe_open(str(tmp_path / "d" / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        header = {k: {"shape": f.get_slice(k).get_shape(), "dtype": f.get_slice(k).get_dtype()} for k in f.keys()}
    assert sorted(header) == sorted(names)
    assert {v["dtype"] for v in header.values()} <= {"BF16", "I64", "BOOL"}
    assert {k for k in header if k.startswith("layers.0.")} and not any("midlayer" in k for k in header)
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["transformer_layer_config"]["hidden_size"] == 64
    assert header["fc.weight"]["shape"] == [64, 192]


def test_loader_name_resolution_follows_sglang_versions():
    ls = load_launch_module()
    speculators = list(drafter_mod.drafter_tensor_specs(layout="speculators"))
    sglang = list(drafter_mod.drafter_tensor_specs(layout="sglang"))
    legacy, modern = (0, 5, 9), (0, 5, 12)

    res = ls.resolve_eagle3_names(speculators, legacy, ls.eagle3_params(legacy, 1, {}))
    assert sorted(res.dropped) == sorted(k for k in speculators if k.startswith("layers.0."))
    assert "model.midlayer.self_attn.qkv_proj.weight" not in res.loaded and res.hot_token_map

    res = ls.resolve_eagle3_names(sglang, legacy, ls.eagle3_params(legacy, 1, {}))
    assert res.dropped == []
    assert len(res.loaded["model.midlayer.self_attn.qkv_proj.weight"]) == 3  # q, k, v stacked

    for names in (speculators, sglang):  # 0.5.12+: layers.0 native, midlayer via the legacy map
        res = ls.resolve_eagle3_names(names, modern, ls.eagle3_params(modern, 1, {}))
        assert res.dropped == [] and "model.layers.0.mlp.gate_up_proj.weight" in res.loaded

    with pytest.raises(ValueError, match="only supports 1 layer"):
        ls.eagle3_params(legacy, 2, {})


def test_stand_in_collapses_without_capture_and_with_the_cuda_graph_bug():
    ls = load_launch_module()
    # read from the stand-in's own model sources: Phi3 inherits the hook from LlamaForCausalLM
    assert ls.target_capture({"architectures": ["Phi3ForCausalLM"]}, (0, 5, 9)) is None
    with pytest.raises(ValueError, match="not supported"):
        ls.target_capture({"architectures": ["NoSuchForCausalLM"]}, (0, 5, 9))
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": {"num_hidden_layers": 61}}
    custom = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}}
    default = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    assert "PR #22836" in ls.cuda_graph_capture_bug(custom, kimi, (0, 5, 10), False)
    assert ls.cuda_graph_capture_bug(custom, kimi, (0, 5, 10), True) is None
    assert ls.cuda_graph_capture_bug(custom, kimi, (0, 5, 11), False) is None
    assert ls.cuda_graph_capture_bug(default, kimi, (0, 5, 9), False) is None


def test_sim_nvidia_smi_formats_like_the_real_one(tmp_path):
    dev = tmp_path / "dev"
    dev.mkdir()
    for i in range(4):
        (dev / f"nvidia{i}").touch()
    alloc = tmp_path / "alloc"
    alloc.mkdir()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"gpu_count": 4, "gpu_dir": str(dev), "alloc_dir": str(alloc)}))
    env = {**os.environ, "NVIDIA_SMI_SIM_CONFIG": str(config)}

    def smi(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SIM_SMI), *args], env=env, capture_output=True,
                              text=True, timeout=20)

    holder = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1]); sys.stdin.read()",
                               str(dev / "nvidia2")], stdin=subprocess.PIPE)
    try:
        (alloc / f"{holder.pid}.2").write_text("1000\n")
        out = wait_until(lambda: "1000 MiB" in (r := smi("--query-gpu=index,uuid,memory.used,memory.total,"
                                                         "utilization.gpu", "--format=csv")).stdout and r,
                         10, "the holder to show up").stdout.splitlines()
        assert out[0] == "index, uuid, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
        assert out[1].endswith(f", 0 MiB, {H200_MIB} MiB, 0 %")
        assert out[3].startswith("2, GPU-") and out[3].endswith(f", 1000 MiB, {H200_MIB} MiB, 0 %")
        nounits = smi("--query-gpu=index,memory.used", "--format=csv,nounits").stdout.splitlines()
        assert nounits[0] == "index, memory.used [MiB]" and nounits[3] == "2, 1000"
        apps = smi("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits")
        assert apps.stdout == f"{holder.pid}, {sys.executable}, 1000\n"
        assert smi("-L").stdout.splitlines()[0].startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
        bad = smi("--query-gpu=index,bogus", "--format=csv")
        assert (bad.returncode, bad.stdout.strip()) == (2, 'Field "bogus" is not a valid field to query.')
        bad = smi("--frobnicate")
        assert bad.returncode == 2 and "Invalid combination of input arguments" in bad.stdout
    finally:
        holder.kill()
        holder.wait()
    empty = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert (empty.returncode, empty.stdout) == (0, "")
    (tmp_path / "driver_failed").touch()
    failed = smi("-L")
    assert failed.returncode == 9 and "couldn't communicate with the NVIDIA driver" in failed.stdout


# --------------------------------------------------------------------------------------------
# the sandbox hosts


@pytest.mark.sandbox
def test_hosts_answer_ssh_as_their_own_user_with_the_stand_ins(clean_sandbox):
    sandbox = clean_sandbox
    assert [h.name for h in sandbox.hosts] == ["sb1", "sb2", "sb3"]
    assert len({h.address for h in sandbox.hosts}) == 3
    for h in sandbox.hosts:
        res = sandbox.run(h.name, 'id -un; command -v nvidia-smi; '
                                  f'{FAST_IMPORT} python3 -c "import sglang; print(sglang.__file__, sglang.__version__)"')
        assert res.returncode == 0, res.stderr
        assert res.stdout.split("\n")[:3] == [
            h.user, f"{h.home}/bin/nvidia-smi", f"{h.home}/pylib/sglang/__init__.py 0.5.11"]
        assert gpu_used(sandbox, h.name) == [0] * 8
        assert compute_apps(sandbox, h.name) == []
        assert h.gpu_glob == f"{h.home}/dev/nvidia*" and h.gpu_count == 8
        assert h.state_dir == h.home / ".deployctl" and not h.state_dir.exists()

    # Host key checking is on: without the sandbox's known_hosts the login is refused.
    argv = sandbox.ssh_argv("sb1", "true", multiplex=False)
    argv[argv.index(f"UserKnownHostsFile={sandbox.known_hosts}")] = "UserKnownHostsFile=/dev/null"
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert res.returncode == 255 and "Host key verification failed" in res.stderr

    import yaml
    config = yaml.safe_load(sandbox.config_path.read_text())
    assert config["ssh"]["host_key_policy"] == "reject"
    assert [h["port"] for h in config["hosts"]] == [h.port for h in sandbox.hosts]
    assert config["runs"][0]["drafter"] == "~/drafters/kimi-k25-eagle3"


@pytest.mark.sandbox
def test_stray_gpu_holder_is_freed_by_fuser_and_nothing_else_dies(clean_sandbox):
    sb = clean_sandbox
    hold = ("setsid nohup python3 -c 'import os, time; f = open(os.path.expanduser(\"~/dev/nvidia3\")); "
            "time.sleep(600)' > /dev/null 2>&1 < /dev/null & echo $!")
    strays = {name: int(sb.run(name, hold).stdout.strip()) for name in ("sb1", "sb2")}
    for name, pid in strays.items():
        used = wait_until(lambda: (u := gpu_used(sb, name))[3] and u, 10, f"GPU 3 used on {name}")
        assert used == [0, 0, 0, 512, 0, 0, 0, 0]
        assert [a[0] for a in compute_apps(sb, name)] == [str(pid)]
        assert compute_apps(sb, name)[0][1:3] == ["python3", "512"]

    # The hand-run procedure's cleanup, verbatim but for the device path: every stray python3 of the host dies.
    res = sb.run("sb1", "killall python3 2>/dev/null; fuser -k ~/dev/nvidia* 2>/dev/null; "
                        "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader")
    assert res.returncode == 0
    wait_until(lambda: gpu_used(sb, "sb1") == [0] * 8, 10, "GPU 3 on sb1 to be freed")
    assert not pid_alive(sb, "sb1", strays["sb1"])

    # fuser -k alone frees a holder too (a fresh stray, not a python3 this time).
    pid = int(sb.run("sb1", "setsid nohup sleep 600 < ~/dev/nvidia5 > /dev/null 2>&1 & echo $!").stdout)
    wait_until(lambda: gpu_used(sb, "sb1")[5] == 512, 10, "GPU 5 used by the sleep")
    sb.run("sb1", "fuser -k ~/dev/nvidia*")
    wait_until(lambda: gpu_used(sb, "sb1") == [0] * 8, 10, "GPU 5 on sb1 to be freed")
    assert not pid_alive(sb, "sb1", pid)

    # The other host's process, the other hosts' sshd and this test runner all survived.
    assert pid_alive(sb, "sb2", strays["sb2"])
    assert gpu_used(sb, "sb2")[3] == 512
    assert sb.run("sb3", "true").returncode == 0
    os.kill(os.getpid(), 0)
    sb.run("sb2", f"kill {strays['sb2']}")
    wait_until(lambda: gpu_used(sb, "sb2") == [0] * 8, 10, "GPU 3 on sb2 to be freed")


@pytest.mark.sandbox
def test_driver_failure_knob(clean_sandbox):
    h = clean_sandbox.host("sb3")
    clean_sandbox.run("sb3", "touch ~/.sim/driver_failed")
    res = clean_sandbox.run("sb3", "nvidia-smi --query-gpu=index --format=csv")
    assert res.returncode == 9 and res.stdout.startswith("NVIDIA-SMI has failed")
    (h.sim_dir / "driver_failed").unlink()


# --------------------------------------------------------------------------------------------
# the stand-in SGLang


@pytest.mark.sandbox
def test_unconverted_speculators_drafter_accepts_nothing(clean_sandbox):
    sb = clean_sandbox
    h = sb.host("sb1")
    pid = launch_healthy(sb, "sb1", "~/drafters/kimi-k25-eagle3")
    used = gpu_used(sb, "sb1")
    assert all(u > 100_000 for u in used), used
    apps = compute_apps(sb, "sb1")
    assert sorted(a[1] for a in apps) == [f"sglang::scheduler_TP{i}" for i in range(8)]

    status, body = http(f"http://{h.address}:30000/server_info")
    assert status == 200 and "avg_spec_accept_length" not in json.loads(body)["internal_states"][0]
    status, body = http(f"http://{h.address}:30000/generate",
                        {"text": "Write a haiku about GPUs.",
                         "sampling_params": {"max_new_tokens": 64, "temperature": 0}})
    assert status == 200
    meta = json.loads(body)["meta_info"]
    assert meta["completion_tokens"] == 64 and meta["spec_verify_ct"] == 64
    info = json.loads(http(f"http://{h.address}:30000/server_info")[1])
    assert info["internal_states"][0]["avg_spec_accept_length"] == 1.0  # speculators keys on SGLang < 0.5.12: layer dropped silently
    assert info["speculative_num_draft_tokens"] == 16
    log = (h.home / "sglang.log").read_text()
    assert "deployctl sandbox TEST DOUBLE" in log.splitlines()[0]
    assert "accept len: 1.00, accept rate: 0.06" in log
    assert f"Uvicorn running on http://{h.address}:30000" in log
    assert "The server is fired up and ready to roll!" in log
    assert "layers.0." not in log  # SGLang drops them without a word

    # Killing the GPU holders (the TP ranks) frees the GPUs but leaves an unhealthy main process.
    sb.run("sb1", "fuser -k ~/dev/nvidia*")
    wait_until(lambda: gpu_used(sb, "sb1") == [0] * 8, 10, "GPUs freed by fuser -k")
    wait_until(lambda: health(h, 30000) == 503, 10, "/health 503 after the ranks died")
    assert pid_alive(sb, "sb1", pid)
    sb.run("sb1", f"kill {pid}")
    wait_until(lambda: not pid_alive(sb, "sb1", pid), 10, "the main process to exit")


@pytest.mark.sandbox
def test_renamed_drafter_accepts_and_sigterm_frees_the_gpus(clean_sandbox):
    sb = clean_sandbox
    h = sb.host("sb2")
    assert sb.run("sb2", "cp -r ~/drafters/kimi-k25-eagle3 ~/drafters/fixed").returncode == 0
    assert rename_header_prefix(h.home / "drafters/fixed/model.safetensors", "layers.0.", "midlayer.") == 10
    pid = launch_healthy(sb, "sb2", "~/drafters/fixed", " --decode-log-interval 10")
    status, body = http(f"http://{h.address}:30000/generate",
                        {"text": "Explain speculative decoding.", "sampling_params": {"max_new_tokens": 256}})
    assert status == 200
    meta = json.loads(body)["meta_info"]
    accept = json.loads(http(f"http://{h.address}:30000/server_info")[1])["internal_states"][0][
        "avg_spec_accept_length"]
    assert 2.3 < accept < 3.4, accept
    assert meta["spec_verify_ct"] < 256 / 2
    log = (h.home / "sglang.log").read_text()
    assert log.count("Decode batch. #running-req: 1") >= 5
    assert "accept len: 1.00" not in log

    bench = sb.run("sb2", f"python3 -m sglang.bench_serving --backend sglang --host {h.address} --port 30000 "
                          "--dataset-name random-ids --num-prompts 4 --random-input-len 64 "
                          "--random-output-len 128 --max-concurrency 1 --flush-cache")
    assert bench.returncode == 0, bench.stderr
    rows = dict(line.split(":", 1) for line in bench.stdout.splitlines() if line.count(":") == 1)
    assert 2.3 < float(rows["Accept length"]) < 3.4
    assert float(rows["Output token throughput (tok/s)"]) > 100  # ~accept len / 19.5 ms
    offline = sb.run("sb2", f"python3 -m sglang.bench_serving --port 30000 --host {h.address} --dataset-name random")
    assert offline.returncode == 1 and "huggingface.co" in offline.stderr

    status, body = http(f"http://{h.address}:30000/flush_cache", {})
    assert status == 200
    assert "avg_spec_accept_length" not in json.loads(
        http(f"http://{h.address}:30000/server_info")[1])["internal_states"][0]
    completion = json.loads(http(f"http://{h.address}:30000/v1/completions",
                                 {"model": "x", "prompt": "hi", "max_tokens": 8})[1])
    assert completion["usage"]["completion_tokens"] == 8
    assert json.loads(http(f"http://{h.address}:30000/model_info")[1])["is_generation"] is True

    sb.run("sb2", f"kill -TERM {pid}")
    wait_until(lambda: not pid_alive(sb, "sb2", pid), 10, "the server to exit on SIGTERM")
    wait_until(lambda: gpu_used(sb, "sb2") == [0] * 8, 10, "GPUs freed")
    assert "Finished server process" in (h.home / "sglang.log").read_text()


@pytest.mark.sandbox
def test_ranks_die_with_a_sigkilled_server_as_sglangs_do(clean_sandbox):
    # SGLang's ranks set PR_SET_PDEATHSIG (kill_itself_when_parent_died); the stand-in's lifeline pipe
    # must end them the same way when nothing could run a handler in the parent
    sb = clean_sandbox
    pid = launch_healthy(sb, "sb3", "~/drafters/kimi-k25-eagle3")
    ranks = {a[0] for a in compute_apps(sb, "sb3")}
    assert len(ranks) == 8, ranks
    sb.run("sb3", f"kill -KILL {pid}")
    wait_until(lambda: not any(pid_alive(sb, "sb3", rank) for rank in ranks), 10, "every rank gone")
    wait_until(lambda: gpu_used(sb, "sb3") == [0] * 8, 10, "GPUs freed")


@pytest.mark.sandbox
def test_sglang_flag_errors(clean_sandbox):
    sb = clean_sandbox
    h = sb.host("sb3")
    res = sb.run("sb3", f"{FAST_IMPORT} python3 -m sglang.launch_server --model-path ~/models/Kimi-K2.5 --bogus-flag 1")
    assert res.returncode == 2 and "unrecognized arguments: --bogus-flag" in res.stderr

    res = sb.run("sb3", f"{FAST_IMPORT} python3 -m sglang.launch_server --model-path ~/models/Kimi-K2.5 "
                        "--speculative-algorithm EAGLE3 --speculative-draft-model-path ~/drafters/kimi-k25-eagle3 "
                        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 16")
    assert res.returncode == 1 and "ValueError: speculative_num_steps is not set" in res.stderr

    # topk 1 and T != S + 1: warning, T = S + 1; then an unexpanded '~' path fails like SGLang.
    res = sb.run("sb3", f"{FAST_IMPORT} python3 -m sglang.launch_server --model-path ~/models/Kimi-K2.5 "
                        "--speculative-algorithm EAGLE3 --speculative-draft-model-path '~/drafters/nope' "
                        "--speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 16")
    assert res.returncode == 1
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in res.stderr
    assert "speculative_num_draft_tokens=6" in res.stderr
    assert "HFValidationError: Repo id must be in the form" in res.stderr and "'~/drafters/nope'" in res.stderr
    assert gpu_used(sb, "sb3") == [0] * 8
    assert h.gpu_count == 8


@pytest.mark.sandbox
def test_sglang_port_taken_and_crash_during_load(clean_sandbox):
    sb = clean_sandbox
    h = sb.host("sb3")
    args = LAUNCH.format(drafter="~/drafters/kimi-k25-eagle3", host=h.address, port=30000)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind((h.address, 30000))
        taken.listen()
        res = sb.run("sb3", f"{FAST_IMPORT} {args}")
    assert res.returncode == 1
    assert ("ERROR:    [Errno 98] error while attempting to bind on address "
            f"('{h.address}', 30000): address already in use") in res.stderr
    assert gpu_used(sb, "sb3") == [0] * 8

    res = sb.run("sb3", f"{FAST_IMPORT} SGLANG_SIM_CRASH_DURING_LOAD=1 SGLANG_SIM_LOAD_SECONDS=0.4 {args}")
    assert res.returncode == 1
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a " \
           "total capacity of 139.81 GiB" in res.stderr
    assert "TP3] Scheduler hit an exception" in res.stderr
    wait_until(lambda: gpu_used(sb, "sb3") == [0] * 8, 10, "GPUs freed after the crash")
    assert compute_apps(sb, "sb3") == []


# --------------------------------------------------------------------------------------------
# stop


@pytest.mark.sandbox
def test_stop_sandbox_leaves_no_sshd_and_no_users(sandbox_slot):
    from sandbox.hosts import _live_pids_of_uid, _pid_alive, _read_state, start_sandbox, stop_sandbox

    root = Path(tempfile.mkdtemp(prefix="deployctl-stop-test-", dir="/var/tmp"))
    root.chmod(0o755)
    try:
        sb = start_sandbox(root, ("sbstop",), gpus=2, address_base=sandbox_slot.stop_test_address_base,
                           user_prefix=sandbox_slot.user_prefix)
        h = sb.host("sbstop")
        assert sb.run("sbstop", "setsid nohup sleep 600 > /dev/null 2>&1 < /dev/null & echo $!").returncode == 0
        sshd_pid = _read_state(root)["hosts"][0]["sshd_pid"]
        uid = h.home.stat().st_uid
        stop_sandbox(root)
        assert not _pid_alive(sshd_pid)
        assert subprocess.run(["getent", "passwd", f"{sandbox_slot.user_prefix}sbstop"], capture_output=True).returncode == 2
        assert _live_pids_of_uid(uid) == []
        with pytest.raises(OSError):
            socket.create_connection((h.address, h.port), timeout=2).close()
        stop_sandbox(root)  # idempotent
    finally:
        stop_sandbox(root, remove_root=True)
    assert not root.exists()

