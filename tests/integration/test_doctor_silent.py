"""Issue 19 on the real-sshd sandbox: the silent EAGLE-3 failures are caught before anything is stopped.

`restart` onto a drafter without d2t, or with SGLANG_SIMULATE_ACC_LEN in the run's env or the
host's, exits 8 and the running server keeps its PID; onto a quantized target it deploys with
``--speculative-draft-model-quantization unquant``. With ``--ignore-doctor`` the stand-in SGLang
shows each effect (accept 1.00, a simulated number, the crash at draft load) and verify /
wait-ready catch it; a drafter window shorter than the requests (a warning) is caught by verify.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from deploy.base.errors import ExitCode
from sandbox.drafter import encode_safetensors
from tests.integration.helpers import cli_json_err, write_config
from tests.integration.test_doctor import alive, health, server_pid, steps_of

pytestmark = pytest.mark.sandbox

FLAG = "--speculative-draft-model-quantization"


def _chown_like_home(host, path) -> None:
    st = host.home.stat()
    for dirpath, _, filenames in os.walk(path):
        os.chown(dirpath, st.st_uid, st.st_gid)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), st.st_uid, st.st_gid)


def drafter_without_d2t(host) -> str:
    """A copy of the host's drafter whose safetensors lost d2t (a trainer that did not save it)."""
    target = host.home / "drafters" / "no-d2t"
    shutil.copytree(host.drafter_dir, target)
    for path in target.glob("*.safetensors"):
        raw = path.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
        tensors = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
                   for k, v in header.items() if k not in ("__metadata__", "d2t")}
        path.write_bytes(encode_safetensors(tensors, {"format": "pt"}))
    _chown_like_home(host, target)
    return "~/drafters/no-d2t"


def edit_json(path, change) -> None:
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))  # in place: the host user keeps owning it


def quantize_target(host, method: str = "awq") -> None:
    edit_json(host.base_model_dir / "config.json",
              lambda c: c.update(quantization_config={"quant_method": method, "bits": 4}))


def deployment_argv(host) -> list[str]:
    return json.loads((host.state_dir / "deployment.json").read_text())["argv"]


def test_restart_onto_each_silent_failure_keeps_the_running_server(clean_sandbox, tmp_path, capsys):
    sandbox = clean_sandbox
    host = sandbox.host("sb1")
    base = {"group": None, "hosts": ["sb1"]}
    path = write_config(sandbox, tmp_path, run=base)
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "up", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    pid = server_pid(sandbox, "sb1")
    assert FLAG not in deployment_argv(host)

    no_d2t = drafter_without_d2t(host)
    bashrc = host.home / ".bashrc"
    rc_before = bashrc.read_text()
    cases = [
        ("draft-vocab-map", {"drafter": no_d2t}, None, "no d2t tensor"),
        ("simulated-acceptance", {"env": {"SGLANG_SIMULATE_ACC_LEN": "3.2"}}, None, "the run's env"),
        ("simulated-acceptance", {}, "export SGLANG_SIMULATE_ACC_LEN=3.2\n", "the host's environment"),
    ]
    for check, run, rc_line, fragment in cases:
        bashrc.write_text(rc_before + (rc_line or ""))
        path = write_config(sandbox, tmp_path, run={**base, **run})
        code, doctor, _ = cli_json_err(capsys, "-c", str(path), "doctor", "--json")
        found = {c["name"]: c for c in doctor["hosts"][0]["checks"]}
        assert code == ExitCode.VERIFY and found[check]["status"] == "fail" and fragment in found[check]["reason"]
        code, doc, _ = cli_json_err(capsys, "-c", str(path), "restart", "--json")
        bashrc.write_text(rc_before)
        steps = steps_of(doc, "sb1")
        assert code == ExitCode.VERIFY, (check, json.dumps(doc, indent=1))
        detail = steps["doctor"]["detail"]
        assert f"{check}: " in detail and fragment in detail and "the running server keeps serving" in detail, detail
        assert all(s["status"] == "not-run" for name, s in steps.items() if name != "doctor")
        assert alive(pid) and server_pid(sandbox, "sb1") == pid, check
        assert health(host.address, 30000) == 200, check

    # a quantized target: deployctl passes the drafter's quantization itself and the deploy works
    quantize_target(host)
    path = write_config(sandbox, tmp_path, run=base)
    code, doctor, _ = cli_json_err(capsys, "-c", str(path), "doctor", "--json")
    found = {c["name"]: c for c in doctor["hosts"][0]["checks"]}["draft-quantization"]
    assert code == 0 and found["status"] == "pass" and f"deployctl passes {FLAG} unquant" in found["reason"], found
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "restart", "--json")
    assert code == 0, json.dumps(doc, indent=1)
    steps = steps_of(doc, "sb1")
    assert f"the launch passes {FLAG} unquant" in steps["doctor"]["detail"]
    argv = deployment_argv(host)
    assert argv[argv.index(FLAG) + 1] == "unquant"
    assert steps["verify-acceptance"]["status"] == "ok"


def test_ignore_doctor_lets_the_effects_show_and_verify_catch_them(clean_sandbox, tmp_path, capsys):
    sandbox = clean_sandbox
    host = sandbox.host("sb1")
    base = {"group": None, "hosts": ["sb1"]}

    # no d2t: accept length collapses; verify names the missing map first
    path = write_config(sandbox, tmp_path, run={**base, "drafter": drafter_without_d2t(host)})
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "up", "--json", "--ignore-doctor")
    detail = steps_of(doc, "sb1")["verify-acceptance"]["detail"]
    assert code == ExitCode.VERIFY and "accept length 1.00" in detail, json.dumps(doc, indent=1)
    causes = detail.split("most likely first:")[1].strip().splitlines()
    assert causes[0].strip().startswith("1. a reduced draft vocabulary without d2t") and "FAILED" in causes[0]

    # SGLANG_SIMULATE_ACC_LEN: the stand-in reports 3.2 whatever the drafter; verify refuses the number
    path = write_config(sandbox, tmp_path, run={**base, "env": {"SGLANG_SIMULATE_ACC_LEN": "3.2"}})
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "up", "--json", "--ignore-doctor")
    detail = steps_of(doc, "sb1")["verify-acceptance"]["detail"]
    assert code == ExitCode.VERIFY and "is simulated, not measured" in detail, json.dumps(doc, indent=1)

    # the drafter's window (a warning, nothing to ignore): long generations accept ~1.0, verify fails
    edit_json(host.drafter_dir / "config.json",
              lambda c: c["transformer_layer_config"].update(max_position_embeddings=16))
    edit_json(host.base_model_dir / "config.json",
              lambda c: c["text_config"].update(max_position_embeddings=262144))
    path = write_config(sandbox, tmp_path, run=base)
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "up", "--json")
    steps = steps_of(doc, "sb1")
    assert "drafter-window" in steps["doctor"]["detail"], steps["doctor"]
    assert code == ExitCode.VERIFY, json.dumps(doc, indent=1)
    assert "requests longer than the drafter's window" in steps["verify-acceptance"]["detail"]


def test_old_sglang_cannot_keep_the_draft_unquantized(clean_sandbox, tmp_path, capsys):
    """0.5.6 has no --speculative-draft-model-quantization: the doctor fails; ignored, the draft
    inherits awq and the stand-in dies at draft load as SGLang does."""
    sandbox = clean_sandbox
    host = sandbox.host("sb1")
    sandbox.set_sglang_version("sb1", "0.5.6")
    quantize_target(host)
    path = write_config(sandbox, tmp_path, run={"group": None, "hosts": ["sb1"]})
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "up", "--json")
    assert code == ExitCode.VERIFY and "draft-quantization: " in steps_of(doc, "sb1")["doctor"]["detail"]
    code, doc, _ = cli_json_err(capsys, "-c", str(path), "up", "--json", "--ignore-doctor")
    assert code != 0
    text = json.dumps(doc)
    assert "Cannot find the config file for awq" in text, json.dumps(doc, indent=1)
