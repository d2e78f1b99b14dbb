"""Issue 7: doctor on the real-sshd sandbox. A failing host keeps its running server.

For each host-level failure the issue names, a server deployed earlier is still alive and answers
/health after the refused `up`; `deployctl doctor` changes no file and no process on the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.request

import pytest
import yaml

from deploy.cli.main import main
from deploy.base.errors import ExitCode
from tests.integration.helpers import cli_json, cli_json_err, start_stray, wait_until, write_config

pytestmark = pytest.mark.sandbox


def steps_of(doc: dict, host: str) -> dict:
    [entry] = [h for h in doc["hosts"] if h["host"] == host]
    return {s["step"]: s for s in entry["steps"]}


def health(address: str, port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as response:
            return response.status
    except OSError as exc:
        return getattr(exc, "code", 0) or 0


def server_pid(sandbox, name: str) -> int:
    return int((sandbox.host(name).state_dir / "server.pid").read_text().strip())


def alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def tree_digest(*roots) -> dict[str, str]:
    digests = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if os.path.islink(path):
                    digests[path] = "link:" + os.readlink(path)
                    continue
                st = os.stat(path)
                with open(path, "rb") as handle:
                    digests[path] = f"{hashlib.sha256(handle.read()).hexdigest()} {st.st_mtime_ns} {st.st_mode}"
    return digests


def user_processes(sandbox, name: str) -> set[tuple[int, str]]:
    uid = sandbox.host(name).home.stat().st_uid
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    cmd = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                    if "sshd" not in cmd and cmd:
                        found.add((int(entry), cmd))
            except OSError:
                continue
    return found


LISTEN = ("import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
          "s.bind(('{address}', {port})); s.listen(); time.sleep(600)")


def test_failing_doctor_keeps_the_running_server(clean_sandbox, tmp_path, capsys):
    sandbox = clean_sandbox
    host = sandbox.host("sb1")
    base = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    code, doc = cli_json(capsys, "-c", str(base), "up", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    assert steps_of(doc, "sb1")["doctor"]["status"] == "ok"
    pid = server_pid(sandbox, "sb1")
    assert health(host.address, 30000) == 200

    # a foreign process on another port the run is then pointed at
    stray = start_stray(sandbox, "sb1", LISTEN.format(address=host.address, port=30123))
    wait_until(lambda: os.path.exists(f"/proc/{stray}"), what="stray listener")

    def nvidia_smi_missing(on: bool):
        smi = host.home / "bin" / "nvidia-smi"
        if on:
            os.rename(smi, smi.with_name("nvidia-smi.off"))
        else:
            os.rename(smi.with_name("nvidia-smi.off"), smi)

    def kimi_on_059(on: bool):
        sandbox.set_sglang_version("sb1", "0.5.9" if on else "0.5.11")

    cases = [
        ("serve-port", {"run": {"port": 30123}}, None, f"pid {stray}"),
        ("nvidia-smi", {}, nvidia_smi_missing, "not on PATH"),
        ("gpu-devices", {"host": {"gpu_devices": "~/nodev/nvidia*"}}, None, "matches no file"),
        ("state-dir", {"host": {"min_free_mib": 10 ** 12}}, None, "min_free_mib"),
        ("target-capture", {}, kimi_on_059, "KimiK25ForConditionalGeneration"),
        # issue 40: a value the option's type refuses, through the host's reading of SGLang's options
        ("extra-args", {"run": {"extra_args": ["--context-length", "4x"]}}, None, "--context-length '4x'"),
    ]
    for check, overrides, toggle, fragment in cases:
        config = yaml.safe_load(base.read_text())
        config["runs"][0].update(overrides.get("run", {}))
        config["hosts"][0].update(overrides.get("host", {}))
        path = tmp_path / f"{check}.yaml"
        path.write_text(yaml.safe_dump(config))
        if toggle:
            toggle(True)
        try:
            code, doc, err = cli_json_err(capsys, "-c", str(path), "up", "--json")
        finally:
            if toggle:
                toggle(False)
        steps = steps_of(doc, "sb1")
        assert code == ExitCode.VERIFY, (check, json.dumps(doc, indent=1))
        assert steps["doctor"]["status"] == "failed"
        assert f"{check}: " in steps["doctor"]["detail"] and fragment in steps["doctor"]["detail"], steps["doctor"]
        # what it left, from the doctor's own read (issue 17: never a fixed "keeps serving")
        assert "nothing was stopped" in steps["doctor"]["detail"] and f"pid {pid}" in steps["doctor"]["detail"]
        assert all(s["status"] == "not-run" for name, s in steps.items() if name != "doctor")
        assert alive(pid) and server_pid(sandbox, "sb1") == pid, check
        assert health(host.address, 30000) == 200, check

    # EAGLE through an argparse prefix in extra_args: refused at config load, nothing contacted
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"],
                                                "extra_args": ["--speculative-algo=EAGLE"]})
    code = main(["-c", str(path), "up", "--json"])
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG and "--speculative-algorithm" in err
    assert alive(pid) and health(host.address, 30000) == 200


def test_doctor_changes_no_file_and_no_process(clean_sandbox, tmp_path, capsys):
    sandbox = clean_sandbox
    host = sandbox.host("sb1")
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    before_files = tree_digest(host.state_dir, host.drafter_dir, host.base_model_dir)
    before_procs = user_processes(sandbox, "sb1")
    code, doc = cli_json(capsys, "-c", str(path), "doctor", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    [entry] = doc["hosts"]
    assert entry["host"] == "sb1" and entry["ok"] is True
    assert set(doc) == {"hosts"} and set(entry) == {"host", "ok", "checks"}
    assert all(set(c) == {"name", "status", "reason", "fix"} for c in entry["checks"])
    serve_port = next(c for c in entry["checks"] if c["name"] == "serve-port")
    assert "held by the server deployctl launched" in serve_port["reason"]
    assert tree_digest(host.state_dir, host.drafter_dir, host.base_model_dir) == before_files
    assert user_processes(sandbox, "sb1") == before_procs


def test_doctor_verb_exit_codes(clean_sandbox, tmp_path, capsys):
    sandbox = clean_sandbox
    sandbox.set_sglang_version("sb2", "0.5.9")
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1", "sb2"]})
    code, doc = cli_json(capsys, "-c", str(path), "doctor", "--json")
    assert code == ExitCode.VERIFY
    ok = {h["host"]: h["ok"] for h in doc["hosts"]}
    assert ok == {"sb1": True, "sb2": False}
    failing = [c["name"] for c in doc["hosts"][1]["checks"] if c["status"] == "fail"]
    assert failing == ["target-capture"], doc
    # a fresh host: doctor writes nothing, not even its helper
    assert not sandbox.host("sb2").state_dir.exists()
    unreachable = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]},
                               hosts=[{**yaml.safe_load(path.read_text())["hosts"][0], "port": 1}])
    code, doc = cli_json(capsys, "-c", str(unreachable), "doctor", "--json")
    assert code == ExitCode.CONNECTION and doc["hosts"][0]["ok"] is False


def test_ignore_doctor_runs_on_and_verify_still_catches_it(clean_sandbox, tmp_path, capsys):
    sandbox = clean_sandbox
    sandbox.set_sglang_version("sb1", "0.5.9")
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    code, doc, err = cli_json_err(capsys, "-c", str(path), "up", "--json", "--ignore-doctor")
    steps = steps_of(doc, "sb1")
    assert "--ignore-doctor" in err
    assert steps["doctor"]["status"] == "ok" and "IGNORED" in steps["doctor"]["detail"]
    assert code == ExitCode.VERIFY, json.dumps(doc, indent=1)
    detail = steps["verify-acceptance"]["detail"]
    assert "accept length 1.00" in detail
    causes = detail.split("most likely first:")[1].strip().splitlines()
    assert causes[0].strip().startswith("1. the target does not capture") and "FAILED" in causes[0]


def test_two_layer_drafter_on_old_sglang_is_refused_before_the_drafter_is_touched(clean_sandbox, tmp_path, capsys):
    from sandbox.drafter import write_eagle3_drafter

    sandbox = clean_sandbox
    host = sandbox.host("sb1")
    drafter = host.home / "drafters" / "two-layers"
    write_eagle3_drafter(drafter, num_layers=2)
    st = host.home.stat()
    for dirpath, _, filenames in os.walk(drafter):
        os.chown(dirpath, st.st_uid, st.st_gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), st.st_uid, st.st_gid)
    before = tree_digest(drafter)
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"], "drafter": "~/drafters/two-layers"})
    code, doc = cli_json(capsys, "-c", str(path), "up", "--json")
    assert code == ExitCode.VERIFY
    detail = steps_of(doc, "sb1")["doctor"]["detail"]
    assert detail.splitlines()[1].strip().startswith("drafter-layers: EAGLE3 currently only supports 1 layer"), detail
    assert steps_of(doc, "sb1")["fix-keys"]["status"] == "not-run"
    assert tree_digest(drafter) == before
