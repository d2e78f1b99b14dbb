"""Helpers for integration tests over the real-sshd sandbox (SIMULATED GPU hosts)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml

from deploy.cli.main import main
from tests.fixtures import default_signals  # noqa: F401  (the sandbox tests' deployctl children)

#: The stand-in SGLang's `import sglang` sleeps 2.5 s like a real install's (sandbox/sim_sglang),
#: and every server a test launches pays it before it even starts loading: about a quarter of the
#: integration suite's wall time went there. The tests' servers import in 0.2 s instead, the way
#: they already load in 0.5-1 s instead of minutes. The tests' hosts export the same 0.2 s for every
#: other command too (tests/conftest.py HOST_SIM_ENV: bench_serving's rounds, the swap sender); a
#: deployctl code path that regressed to `import sglang` on the host (doctor, fix-keys) shows in the
#: benchmarks (docs/benchmarks.md), whose sandbox keeps the full 2.5 s. A test that sets its own value keeps it.
#: The load (1.0 s) and warm-up (0.3 s) the stand-in defaults to, faithful for the demo, are halved
#: and more for the tests' servers too, as the fleet and safe-redeploy tests always did (FAST): no
#: test reads the server while it loads unless it sets its own, longer, load time.
FAST = {"SGLANG_SIM_LOAD_SECONDS": "0.5", "SGLANG_SIM_WARMUP_SECONDS": "0.1"}
TEST_LAUNCH_ENV = {"SGLANG_SIM_IMPORT_SECONDS": "0.2", **FAST}


def write_config(sandbox, tmp_path: Path, *, ssh: dict | None = None, hosts: list[dict] | None = None,
                 run: dict | None = None, extra_hosts: list[dict] | None = None) -> Path:
    """The sandbox's deployctl.yaml with overrides, written under tmp_path."""
    config = yaml.safe_load(Path(sandbox.config_path).read_text())
    config["ssh"].update(ssh or {})
    if hosts is not None:
        config["hosts"] = hosts
    config["hosts"] += extra_hosts or []
    if run:
        config["runs"][0].update(run)
    config["runs"][0]["env"] = {**TEST_LAUNCH_ENV, **(config["runs"][0].get("env") or {})}
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


REPO = Path(__file__).resolve().parents[2]


def nightly_with(tmp_path: Path, **benchmark) -> Path:
    """The shipped nightly playbook with other benchmark settings (a new file under tmp_path each call).

    Each benchmark round is one bench_serving run on the host, a fresh interpreter and ``import
    sglang`` (0.2 s on the tests' hosts, HOST_SIM_ENV) plus its requests: the shipped 12 rounds are
    the longest part of a nightly, three times over for a 3-replica fleet. A test whose subject is
    not the gate's statistics takes ``rounds=4`` (deploy/local/throughput_gate.MIN_ROUNDS: the fewest
    that still give the gate its interval, so a regression is still conclusive)."""
    document = yaml.safe_load((REPO / "playbooks" / "nightly.yaml").read_text())
    for step in document["steps"]:
        if step["step"] == "benchmark":
            step.update(benchmark)
    path = tmp_path / f"nightly-{len(list(tmp_path.glob('nightly-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def cli_json(capsys, *argv: str) -> tuple[int, dict]:
    code, doc, _ = cli_json_err(capsys, *argv)
    return code, doc


def cli_json_err(capsys, *argv: str) -> tuple[int, dict, str]:
    """Exit code, the JSON document on stdout, and the progress lines on stderr."""
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, json.loads(captured.out), captured.err


def start_stray(sandbox, host: str, program: str) -> int:
    """A fully detached python3 process on the host; returns its PID."""
    wrapped = f"setsid nohup python3 -c {json.dumps(program)} > /dev/null 2>&1 < /dev/null & echo $!"
    result = sandbox.run(host, wrapped)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.strip())


def hold_gpu_program(home: str, index: int, *, ignore_term: bool = False) -> str:
    lines = ["import signal, time"]
    if ignore_term:
        lines.append("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    lines.append(f"f = open('{home}/dev/nvidia{index}', 'rb')")
    lines.append("time.sleep(600)")
    return "; ".join(lines)


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gpu_used(sandbox, host: str) -> list[int]:
    out = sandbox.run(host, "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


