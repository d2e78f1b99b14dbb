"""Issue 41: ``sglang_payloads``' output through the real SGLang ``MultiprocessingSerializer.deserialize``
in another process, for the 0.5.21 and 0.5.23 wheels, with a real (CPU) torch.

tests/bootstrap.sh builds ``.sglang-contract-venv`` (the system python 3.11, ``torch==2.13.0+cpu``,
safetensors, pybase64) and downloads the wheels (``.sglang-wheels``). From each wheel the test takes
the real ``MultiprocessingSerializer`` and ``SafeUnpickler`` classes (their source, out of
``srt/utils/common.py``, whose module imports far more than this needs) and the real
``srt/utils/patch_torch.py`` (``monkey_patch_torch_reductions``), puts them where ``sglang.srt.utils``
would be, and runs, under the contract venv:

- the producer: the product's ``sglang_payloads`` (deploy/remote/drafter_swap.py) on a drafter of real
  tensors, tp 2, with two changes: ``torch.device("cuda", i)`` is the CPU and ``torch.cuda.synchronize``
  does nothing (no GPU here), and the reductions are torch's own CPU ones (shared memory, file
  descriptors): SGLang's ``monkey_patch_torch_reductions`` rewrites ``reduce_tensor``'s CUDA arguments
  (device index -> UUID, argument 6) and fails on a CPU tensor (IndexError: the first test below
  checks that fact in the consumer, once it has deserialized, which is why the sender must copy the
  drafter to the GPUs);
- the consumer: another process (spawned by the producer, which keeps its tensors alive as the sender
  does) that runs the real ``monkey_patch_torch_reductions`` and ``MultiprocessingSerializer.deserialize``
  (base64 text, SafeUnpickler) on entry [rank] for each rank, and compares names, dtypes, shapes and
  values with the file.

One run per wheel answers both tests (each starts two interpreters that import torch, about 2 s of
CPU each here): the first test of a version runs it, the other reads its answer.

What only a GPU shows: the CUDA IPC reductions (SGLang's patched ``reduce_tensor`` with device UUIDs,
``rebuild_cuda_tensor``) and the copy on each rank's own GPU: tests/device/swap_drafter_gpu.py.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEELS = REPO / ".sglang-wheels"
VENV_PYTHON = REPO / ".sglang-contract-venv" / "bin" / "python"
VERSIONS = ("0.5.21", "0.5.23")

PROGRAM = r'''
import json, multiprocessing, sys
import torch
from safetensors.torch import save_file, load_file

def consume(path, entries, out):
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    monkey_patch_torch_reductions()
    want = load_file(path)
    ranks = []
    for rank, entry in enumerate(entries):
        named = MultiprocessingSerializer.deserialize(entry)  # deserialize_own_rank: entry [tp_rank]
        ranks.append({"names": sorted(n for n, _ in named),
                      "equal": all(t.dtype == want[n].dtype and list(t.shape) == list(want[n].shape)
                                   and torch.equal(t, want[n]) for n, t in named)})
    out.put({"ranks": ranks, "patched_cpu_tensor": patched_cpu_tensor()})

def patched_cpu_tensor():
    """SGLang's patched reduce_tensor on a CPU tensor: what the real reductions allow."""
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    monkey_patch_torch_reductions()
    try:
        MultiprocessingSerializer.serialize([("w", torch.ones(2))], output_str=True)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None

if __name__ == "__main__":
    drafter, sender_dir = sys.argv[1], sys.argv[2]
    # SGLang's monkey_patch_torch_reductions rewrites reduce_tensor's CUDA arguments (device -> UUID) and
    # fails on a CPU tensor: torch's own reductions here (the patch sees itself applied and returns)
    import torch.multiprocessing.reductions as reductions
    reductions._reduce_tensor_original = reductions.reduce_tensor
    save_file({"fc.weight": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
               "midlayer.self_attn.q_proj.weight": torch.randn(4, 4),
               "d2t": torch.arange(8, dtype=torch.int64)}, drafter + "/model.safetensors")
    cpu = torch.device("cpu")
    torch.device = lambda *args, **kwargs: cpu          # no GPU: the copies stay on the CPU
    torch.cuda.synchronize = lambda *args, **kwargs: None
    sys.path.insert(0, sender_dir)
    import drafter_swap
    entries, count, keep = drafter_swap.sglang_payloads(drafter, 2, 0)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=consume, args=(drafter + "/model.safetensors", entries, out))
    child.start()
    consumed = out.get(timeout=120)
    child.join(60)
    print(json.dumps({"count": count, "entries": len(entries), "all_text": all(isinstance(e, str) for e in entries),
                      "ranks": consumed["ranks"], "patched_cpu_tensor": consumed["patched_cpu_tensor"],
                      "exit": child.exitcode}))
'''


def _class_sources(common: str, names: tuple[str, ...]) -> str:
    tree = ast.parse(common)
    return "\n\n".join(ast.get_source_segment(common, node) for node in tree.body
                       if isinstance(node, ast.ClassDef) and node.name in names)


def _shim(wheel: Path, root: Path) -> Path:
    """The real classes and patch_torch.py of ``wheel`` under ``root``/sglang/srt/utils."""
    with zipfile.ZipFile(wheel) as zf:
        common = zf.read("sglang/srt/utils/common.py").decode()
        patch = zf.read("sglang/srt/utils/patch_torch.py").decode()
    utils = root / "sglang" / "srt" / "utils"
    utils.mkdir(parents=True)
    for package in (root / "sglang", root / "sglang" / "srt"):
        (package / "__init__.py").write_text("")
    header = ("import io, pickle\nimport pybase64\nimport torch\nfrom multiprocessing.reduction import ForkingPickler\n\n"
              "def is_npu():\n    return False\n\ndef is_musa():\n    return False\n\n"
              "torch_release = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2])\n\n"
              "def _safe_load_torch_storage(*args, **kwargs):\n    raise RuntimeError('not used')\n\n")
    (utils / "common.py").write_text(header + _class_sources(common, ("MultiprocessingSerializer", "SafeUnpickler")))
    (utils / "__init__.py").write_text("from sglang.srt.utils.common import MultiprocessingSerializer\n")
    (utils / "patch_torch.py").write_text(patch)
    return root


def _prepare(version: str, tmp_path: Path):
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    missing = [str(p) for p in ([] if found else [WHEELS / f"sglang-{version}-*.whl"])
               + ([] if VENV_PYTHON.is_file() else [VENV_PYTHON])]
    if missing:
        reason = f"{', '.join(missing)} missing: run tests/bootstrap.sh"
        if os.environ.get("DEPLOYCTL_TEST_REQUIRE_SANDBOX") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    shim = _shim(found[0], tmp_path / "shim")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    program = tmp_path / "payload.py"
    program.write_text(PROGRAM)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(shim), "HOME": str(tmp_path)}

    def run(*extra: str) -> dict:
        done = subprocess.run([str(VENV_PYTHON), str(program), str(drafter), str(REPO / "deploy" / "remote"), *extra],
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    return run


_RUNS: dict[str, dict] = {}


def payload_run(version: str, tmp_path_factory) -> dict:
    """The producer's and the consumer's answers for ``version``'s wheel, from one run."""
    if version not in _RUNS:
        _RUNS[version] = _prepare(version, tmp_path_factory.mktemp(f"payload-{version}"))()
    return _RUNS[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_sglangs_patched_reductions_take_cuda_tensors_only(version, tmp_path_factory):
    result = payload_run(version, tmp_path_factory)
    assert result["patched_cpu_tensor"] and result["patched_cpu_tensor"].startswith("IndexError"), result


@pytest.mark.parametrize("version", VERSIONS)
def test_sglang_payloads_deserialize_with_the_real_serializer_in_another_process(version, tmp_path_factory):
    result = payload_run(version, tmp_path_factory)
    assert result["count"] == 3 and result["entries"] == 2 and result["all_text"] and result["exit"] == 0, result
    for rank in result["ranks"]:
        assert rank == {"names": ["d2t", "fc.weight", "midlayer.self_attn.q_proj.weight"], "equal": True}, result
