"""The sandbox's C nvidia-smi (sandbox/sim_nvidia_smi_fast.c) answers what the Python stand-in
(sandbox/sim_nvidia_smi.py) answers, byte for byte and with its exit code, on generated host states:
GPU device files held by real processes (some by several, some through a linked path), MiB and
utilization files (numbers, signs, blanks, junk, stale ones, a directory), configs with and without
uuids and bus ids, the knob files (driver failed, phantom memory, a query delay), and command lines
deployctl sends, others the real tool refuses, and ones only the Python model serves (-L, -i, the table).

Where the C program answers itself is checked too: built a second time with its fallback pointing
nowhere, it must answer the plain queries (so the suite's hosts stop starting python3 for them) and
hand everything else over (exit 127 there, never a guess).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "sandbox" / "sim_nvidia_smi_fast.c"
sys.path.insert(0, str(REPO))
from sandbox import sim_nvidia_smi  # noqa: E402
from sandbox.hosts import NVIDIA_SMI_FAST_FLAGS, _compile, nvidia_smi_launcher  # noqa: E402

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler (tests/bootstrap.sh installs gcc)")

QUERIES = [
    ["--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits"],
    ["--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits"],
    ["--query-gpu=index,name,memory.free,pci.bus_id,gpu_uuid,gpu_name,gpu_bus_id", "--format=csv"],
    ["--format=csv,nounits", "--query-compute-apps=pid,name,used_gpu_memory,gpu_bus_id,gpu_name"],
    ["--query-gpu=index, memory.used ,utilization.gpu", "--format=csv, noheader"],
    ["--query-compute-apps=pid", "--format=csv,noheader"],
]
#: the real tool refuses these (the Python model says how), or only the Python model serves them
ELSEWHERE = [
    ["--query-gpu=index,bogus", "--format=csv"], ["--query-gpu=index,", "--format=csv"],
    ["--query-gpu=index", "--format=tsv"], ["--query-gpu=index", "--format=csv,"], ["--query-gpu=index"],
    ["--query-gpu", "index", "--format=csv"], ["-i", "0", "--query-gpu=index", "--format=csv"],
    ["--query-gpu=index", "--query-compute-apps=pid", "--format=csv"], ["-L"], [], ["-h"],
    ["--query-gpu=index", "--format=csv", "--format=csv"], ["--query-gpu=ind\tex", "--format=csv"],
]
NUMBERS = ["70000", " 1024\n", "", "-5", "+12", "0", "abc", "1_000", "99999999999999", "42 43", "\u0661"]


def _build(tmp: Path, name: str, fallback: str | None = None) -> Path:
    """Built as sandbox/hosts.py builds it (its flags), warnings on, the fallback's python optionally elsewhere."""
    flags = [*NVIDIA_SMI_FAST_FLAGS, "-Wall"] + ([f'-DFALLBACK_PYTHON="{fallback}"'] if fallback else [])
    binary = _compile(SOURCE, tmp / name, *flags)
    assert binary is not None
    return binary


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smi-build")
    return _build(tmp, "nvidia-smi"), _build(tmp, "nvidia-smi-alone", "/nonexistent/python3")


def _home(root: Path, rng: random.Random, index: int) -> tuple[Path, dict]:
    home = root / f"host{index}"
    sim = home / ".sim"
    (sim / "alloc").mkdir(parents=True)
    (sim / "lib").mkdir()
    count = rng.choice([1, 2, 8])
    gpu_dir = home / "dev"
    gpu_dir.mkdir()
    for i in range(count):
        (gpu_dir / f"nvidia{i}").touch()
    config: dict = {"simulated": True, "gpu_count": count, "gpu_dir": str(gpu_dir) + rng.choice(["", "/"]),
                    "gpu_total_mib": rng.choice([143771, 81559, 1000])}
    if rng.random() < 0.5:
        config["gpu_name"] = rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
    if rng.random() < 0.5:
        config["uuids"] = [f"GPU-{index:04x}{i:04x}-1111-2222-3333-444455556666" for i in range(count)]
    if rng.random() < 0.3:
        config["pci_bus_ids"] = [f"00000000:{0x40 + i:02X}:00.0" for i in range(count)]
    if rng.random() < 0.2:
        config["uuids"] = []
    if rng.random() < 0.2:
        config["alloc_dir"] = str(sim / "alloc")
    if rng.random() < 0.2:
        config["extra"] = {"nested": [1, 2.5, -3e2, None, True, False, "a\\\"b", "\u00e9"]}
    (sim / "config.json").write_text(json.dumps(config, indent=rng.choice([None, 2])))
    # the Python stand-in behind the C program, as sandbox/hosts.py installs it
    (sim / "lib" / "sim_nvidia_smi_main.py").write_text(nvidia_smi_launcher(REPO / "sandbox"))
    knob = rng.random()
    if knob < 0.06:
        (sim / "driver_failed").touch()
    elif knob < 0.12:
        (sim / "phantom.json").write_text(json.dumps({"0": 512}))
    elif knob < 0.16:
        (sim / "query_delay_s").write_text("0.01")
    return home, config


def _holders(home: Path, config: dict, rng: random.Random) -> list[subprocess.Popen]:
    """Real processes holding GPU files (through the path or a link to it), with their alloc files."""
    count = config["gpu_count"]
    gpu_dir = Path(config["gpu_dir"])
    link = home / "devlink"
    link.symlink_to(gpu_dir)
    procs = []
    for _ in range(rng.randint(0, 3)):
        gpus = rng.sample(range(count), rng.randint(1, count))
        redirects = " ".join(f"{3 + k}<{(link if rng.random() < 0.3 else gpu_dir) / f'nvidia{g}'}"
                             for k, g in enumerate(gpus))
        proc = subprocess.Popen(["sh", "-c", f"exec {redirects}; exec sleep 120"], stdin=subprocess.DEVNULL)
        procs.append(proc)
        alloc = home / ".sim" / "alloc"
        for g in gpus:
            roll = rng.random()
            if roll < 0.6:
                (alloc / f"{proc.pid}.{g}").write_text(rng.choice(NUMBERS))
            elif roll < 0.7:
                (alloc / f"{proc.pid}.{g}").mkdir()
            elif roll < 0.8:
                stale = alloc / f"{proc.pid}.{g}"
                stale.write_text("9999")
                os.utime(stale, (1_000_000, 1_000_000))  # older than the process: an earlier pid's
            if rng.random() < 0.4:
                (alloc / f"{proc.pid}.{g}.util").write_text(rng.choice(["37", "150", "-1", "x", ""]))
    return procs


def _python(home: Path, argv: list[str], monkeypatch) -> tuple[int, str]:
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NVIDIA_SMI_SIM_CONFIG", str(home / ".sim" / "config.json"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = sim_nvidia_smi.main(list(argv))
        except Exception as exc:  # the model's own crash on a config it cannot read
            return -1, type(exc).__name__
    return code, out.getvalue()


def _c(binary: Path, home: Path, argv: list[str]) -> tuple[int, str]:
    """The program as a host has it: ~/bin/nvidia-smi, the Python stand-in's launcher in ~/.sim/lib."""
    installed = home / "bin" / binary.name
    if not installed.exists():
        installed.parent.mkdir(exist_ok=True)
        shutil.copy2(binary, installed)
    env = {"HOME": str(home), "NVIDIA_SMI_SIM_CONFIG": str(home / ".sim" / "config.json"), "PATH": os.environ["PATH"]}
    done = subprocess.run([str(installed)] + argv, capture_output=True, text=True, env=env, timeout=60)
    return done.returncode, done.stdout


def _timeless(argv: list[str], answer: tuple[int, str]) -> tuple[int, str]:
    """The table's first line is the clock (the two calls may straddle a second)."""
    code, out = answer
    return (code, out.split("\n", 1)[-1]) if not argv else answer


def _wait_ready(procs: list[subprocess.Popen]) -> None:
    """Each holder has exec'd sleep with its files open (the shell's redirects come first): the two
    programs must read the same processes, not a shell that becomes sleep between them."""
    deadline = time.monotonic() + 30
    for proc in procs:
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"):
            assert proc.poll() is None and time.monotonic() < deadline, f"holder {proc.pid} never became sleep"
            time.sleep(0.005)


def test_the_c_program_answers_what_the_python_model_answers(binaries, tmp_path, monkeypatch):
    fast, alone = binaries
    rng = random.Random(20261207)
    decided = handed_over = 0
    for index in range(10):
        home, config = _home(tmp_path, rng, index)
        procs = _holders(home, config, rng)
        try:
            _wait_ready(procs)
            for argv in QUERIES + rng.sample(ELSEWHERE, 2):
                expected = _python(home, argv, monkeypatch)
                assert _timeless(argv, _c(fast, home, argv)) == _timeless(argv, expected), (index, argv, config)
                code, out = _c(alone, home, argv)
                if code == 127:
                    handed_over += 1
                else:
                    decided += 1
                    assert (code, out) == expected, (index, argv, config)
                    assert argv in QUERIES, argv  # only the plain queries are answered without the model
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    assert decided >= 30 and handed_over >= 20, (decided, handed_over)


def test_a_plain_host_state_is_answered_without_python(binaries, tmp_path, monkeypatch):
    _, alone = binaries
    rng = random.Random(7)
    home, config = _home(tmp_path, rng, 0)
    for knob in ("driver_failed", "phantom.json", "query_delay_s"):
        (home / ".sim" / knob).unlink(missing_ok=True)
    holder = subprocess.Popen(["sh", "-c", f"exec 3<{config['gpu_dir'].rstrip('/')}/nvidia0; exec sleep 120"])
    try:
        _wait_ready([holder])
        (home / ".sim" / "alloc" / f"{holder.pid}.0").write_text("70000\n")
        for argv in QUERIES:
            assert _c(alone, home, argv) == _python(home, argv, monkeypatch), argv
        code, out = _c(alone, home, QUERIES[1])
        assert code == 0 and f", {holder.pid}, 70000, sleep\n" in out, out
    finally:
        holder.kill()
        holder.wait()
