"""Issue 41: the product's sender against the real SGLang session state machine, for the 0.5.21 and
0.5.23 wheels: ``SchedulerWeightUpdaterManager`` (``srt/managers/scheduler_components/weight_updater.py``,
the wheel's own file) driven with stub workers, under ``.sglang-contract-venv`` (python 3.11, a CPU
torch, msgspec; tests/bootstrap.sh builds it).

A small HTTP server in the contract venv decodes each body the sender sends into the wheel's own
request classes (their source out of ``srt/managers/io_struct.py``, on a plain ``msgspec.Struct`` base:
the real module imports half of SGLang), hands it to the real manager, and answers as the tokenizer does
(``tokenizer_control_mixin.py``: ``{"success", "message"}``, 200 or 400, ``weight_version`` recorded only
on success). The stub workers: the target's runner and the draft's runner record what they were given;
``deserialize_own_rank`` is tp_worker.py's (``MultiprocessingSerializer.deserialize`` of entry
[tp_rank], the wheel's serializer); ``torch.distributed.barrier`` does nothing (one process). The
sender is the product's ``run_send`` with its one payload path (``sglang_payloads``), its CUDA device
replaced by the CPU and torch's own reductions (test_sglang_wheel_payload.py says why).

Checked: begin with ``selector: draft`` opens the session for the draft runner only; the update loads
every tensor of the drafter into the draft runner and none into the target's; the scheduler records the
fingerprint; the update does not flush (``flush_cache: false``); end closes the session; /model_info then
names the fingerprint; with requests still at the scheduler the sender's separate /flush_cache is
refused and the swap still verifies, where an update sent with ``flush_cache: true`` would fail (0.5.23)
or raise in the scheduler (0.5.21).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.unit.test_sglang_wheel_payload import VENV_PYTHON, VERSIONS, WHEELS, _shim

REPO = Path(__file__).resolve().parents[2]
IO_CLASSES = ("BeginWeightUpdateReqInput", "BeginWeightUpdateReqOutput", "EndWeightUpdateReqInput",
              "EndWeightUpdateReqOutput", "UpdateWeightsFromTensorReqInput", "UpdateWeightsFromTensorReqOutput")
#: names weight_updater.py imports that the session does not use
UNUSED = ("ChecksumInfo", "CheckWeightsReqInput", "CheckWeightsReqOutput", "DestroyWeightsUpdateGroupReqInput",
          "DestroyWeightsUpdateGroupReqOutput", "GetWeightsByNameReqInput", "GetWeightsByNameReqOutput",
          "InitWeightsUpdateGroupReqInput", "InitWeightsUpdateGroupReqOutput", "ReleaseMemoryOccupationReqInput",
          "ReleaseMemoryOccupationReqOutput", "ResumeMemoryOccupationReqInput", "ResumeMemoryOccupationReqOutput",
          "UpdateWeightFromDiskReqInput", "UpdateWeightFromDiskReqOutput", "UpdateWeightsFromDistributedReqInput",
          "UpdateWeightsFromDistributedReqOutput", "UpdateWeightsFromIPCReqInput", "UpdateWeightsFromIPCReqOutput")

PROGRAM = r'''
import base64, json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
import msgspec, torch
import torch.distributed
from safetensors.torch import save_file

torch.distributed.barrier = lambda *a, **k: None      # one process stands for the TP ranks
import torch.multiprocessing.reductions as reductions
reductions._reduce_tensor_original = reductions.reduce_tensor   # torch's CPU reductions (no GPU)
cpu = torch.device("cpu")
torch.device = lambda *args, **kwargs: cpu
torch.cuda.synchronize = lambda *args, **kwargs: None

from sglang.srt.managers import io_struct
from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
from sglang.srt.utils import MultiprocessingSerializer
from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

drafter, sender_dir, busy = sys.argv[1], sys.argv[2], sys.argv[3] == "busy"
save_file({"fc.weight": torch.ones(3, 4), "midlayer.mlp.up_proj.weight": torch.zeros(4, 4)},
          drafter + "/model.safetensors")

class Runner:
    def __init__(self, role):
        self.role, self.loaded, self.begun, self.ended = role, [], 0, 0
        self.weight_updater = self
    def begin_weight_update(self):
        self.begun += 1
    def end_weight_update(self, run_post_load):
        self.ended += 1
    def update_weights_from_tensor(self, named_tensors, load_format=None):
        self.loaded += [(n, list(t.shape)) for n, t in named_tensors]
        return True, "Success"

target, draft = Runner("target"), Runner("draft")

class TpWorker:
    def weight_update_runners(self):
        return [("target", target)]
    def deserialize_own_rank(self, serialized):   # tp_worker.py, rank 0 of 2
        monkey_patch_torch_reductions()
        return MultiprocessingSerializer.deserialize(serialized[0])

class DraftWorker:
    def weight_update_runners(self):
        return [("draft", draft)]

class Scheduler:
    versions = []
    def record_weight_version_change(self, new_version):
        self.versions.append(new_version)

flushes = []
def flush_cache(**kwargs):
    flushes.append(kwargs)
    return not busy

import dataclasses
extra = {f.name: None for f in dataclasses.fields(SchedulerWeightUpdaterManager)
         if f.name == "tp_cpu_group" and f.init}   # 0.5.21 takes the group; 0.5.23 reads it itself
manager = SchedulerWeightUpdaterManager(tp_worker=TpWorker(), draft_worker=DraftWorker(), memory_saver_adapter=None,
                                        flush_cache=flush_cache, is_fully_idle=lambda **k: not busy,
                                        scheduler=Scheduler(), **extra)
tokenizer = {"weight_version": "default"}
CALLS = {"/begin_weight_update": (io_struct.BeginWeightUpdateReqInput, manager.begin_weight_update),
         "/end_weight_update": (io_struct.EndWeightUpdateReqInput, manager.end_weight_update),
         "/update_weights_from_tensor": (io_struct.UpdateWeightsFromTensorReqInput, manager.update_weights_from_tensor)}
bodies = {}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def answer(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(raw)
        self.close_connection = True
    def _serve(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path in CALLS:
            cls, call = CALLS[self.path]
            obj = msgspec.json.decode(raw or b"{}", type=cls)   # base64 text -> bytes, as the HTTP layer
            bodies[self.path] = sorted(json.loads(raw or b"{}"))
            out = call(obj)
            if out.success and getattr(obj, "weight_version", None) is not None:   # the tokenizer: on success only
                tokenizer["weight_version"] = obj.weight_version
            return self.answer(200 if out.success else 400, {"success": out.success, "message": out.message})
        if self.path == "/server_info":
            return self.answer(200, {"version": "wheel"})
        if self.path == "/model_info":
            return self.answer(200, {"weight_version": tokenizer["weight_version"]})
        if self.path == "/flush_cache":
            return self.answer(200 if flush_cache() else 400, {})
        return self.answer(404, {})
    do_GET = do_POST = _serve

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
sys.path.insert(0, sender_dir)
import drafter_swap
args = SimpleNamespace(url="http://127.0.0.1:%d" % server.server_address[1], drafter=drafter,
                       weight_version="f" * 64, tp=2, base_gpu_id=0, state_dir=drafter, timeout=60.0)
summary = drafter_swap.run_send(args)
seen = {"draft": list(draft.loaded), "target": list(target.loaded), "begun": [target.begun, draft.begun],
        "ended": [target.ended, draft.ended], "versions": list(Scheduler.versions)}
# the same update with flush_cache true, straight to the manager: what the sender avoids
manager.begin_weight_update(io_struct.BeginWeightUpdateReqInput(selector="draft"))
entries, _, keep = drafter_swap.sglang_payloads(drafter, 2, 0)
try:
    out = manager.update_weights_from_tensor(io_struct.UpdateWeightsFromTensorReqInput(
        serialized_named_tensors=[base64.b64decode(e) for e in entries], selector="draft", weight_version="g", flush_cache=True))
    flushing = {"success": out.success, "message": out.message}
except AssertionError as exc:
    flushing = {"raised": "AssertionError: %s" % exc}
print(json.dumps({"summary": summary, **seen, "bodies": bodies, "flushing_update": flushing}))
'''


def _io_struct(io_source: str) -> str:
    tree = ast.parse(io_source)
    classes = "\n\n".join(ast.get_source_segment(io_source, node) for node in tree.body
                          if isinstance(node, ast.ClassDef) and node.name in IO_CLASSES)
    return ("from __future__ import annotations\nfrom typing import Annotated, List, Literal, Optional\nimport msgspec\n\n"
            "class BaseReq(msgspec.Struct, kw_only=True):\n    rid: Optional[str] = None\n\n"
            "class Base64Bytes:\n    pass\n\n" + classes + "\n\n"
            + "".join(f"class {name}:\n    pass\n\n" for name in UNUSED))


def _session_shim(wheel: Path, root: Path) -> Path:
    _shim(wheel, root)
    with zipfile.ZipFile(wheel) as zf:
        io_source = zf.read("sglang/srt/managers/io_struct.py").decode()
        updater = zf.read("sglang/srt/managers/scheduler_components/weight_updater.py").decode()
    srt = root / "sglang" / "srt"
    for package in ("managers", "managers/scheduler_components", "disaggregation"):
        (srt / package).mkdir(parents=True, exist_ok=True)
        (srt / package / "__init__.py").write_text("")
    (srt / "managers" / "io_struct.py").write_text(_io_struct(io_source))
    (srt / "managers" / "scheduler_components" / "weight_updater.py").write_text(updater)
    (srt / "constants.py").write_text("GPU_MEMORY_ALL_TYPES = GPU_MEMORY_TYPE_CUDA_GRAPH = GPU_MEMORY_TYPE_KV_CACHE = "
                                      "GPU_MEMORY_TYPE_WEIGHTS = None\n")
    (srt / "disaggregation" / "utils.py").write_text("class DisaggregationMode:\n    pass\n")
    (srt / "runtime_context.py").write_text(
        "from types import SimpleNamespace\n"
        "def get_parallel():\n    return SimpleNamespace(tp_group=SimpleNamespace(cpu_group=None), tp_rank=0, tp_size=2)\n"
        "def get_model():\n    return SimpleNamespace(weight_cache_mode='off')\n")
    (srt / "utils" / "weight_checker.py").write_text("def overall_checksum(*a, **k):\n    raise RuntimeError('unused')\n")
    return root


def _run(version: str, tmp_path: Path, busy: bool) -> dict:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    missing = [str(p) for p in ([] if found else [WHEELS / f"sglang-{version}-*.whl"])
               + ([] if VENV_PYTHON.is_file() else [VENV_PYTHON])]
    if missing:
        reason = f"{', '.join(missing)} missing: run tests/bootstrap.sh"
        if os.environ.get("DEPLOYCTL_TEST_REQUIRE_SANDBOX") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    shim = _session_shim(found[0], tmp_path / "shim")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    program = tmp_path / "session.py"
    program.write_text(PROGRAM)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(shim), "HOME": str(tmp_path)}
    done = subprocess.run([str(VENV_PYTHON), str(program), str(drafter), str(REPO / "deploy" / "remote"),
                           "busy" if busy else "idle"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "requests-at-the-scheduler"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_sender_drives_the_wheels_session_state_machine(version, tmp_path, busy):
    result = _run(version, tmp_path, busy)
    summary = result["summary"]
    assert summary["ok"] and summary["weight_version"] == "f" * 64 and summary["ended"], summary
    assert summary["flushed"] is (not busy)
    assert sorted(result["draft"]) == [["fc.weight", [3, 4]], ["midlayer.mlp.up_proj.weight", [4, 4]]]
    assert result["target"] == [] and result["begun"][0] == 0 and result["ended"][0] == 0
    assert result["begun"] == [0, 1] and result["ended"] == [0, 1]
    assert result["versions"] == ["f" * 64]
    assert result["bodies"]["/update_weights_from_tensor"] == ["flush_cache", "selector", "serialized_named_tensors",
                                                              "weight_version"]
    flushing = result["flushing_update"]
    if not busy:
        assert flushing == {"success": True, "message": "Success"}
    elif version == "0.5.21":
        assert flushing == {"raised": "AssertionError: Cache flush failed after updating weights"}
    else:
        assert flushing["success"] is False and flushing["message"].startswith(
            "Weights were updated, but the cache was not flushed")
