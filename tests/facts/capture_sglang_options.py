"""Regenerate tests/facts/sglang_options/<version>/ from the published SGLang wheels.

    pip download --no-deps sglang==0.5.12 -d /tmp/sglang-wheels   (one version at a time: 0.5.15, 0.5.23)
    python3 -m venv /tmp/capvenv && /tmp/capvenv/bin/pip install msgspec typing_extensions
    .venv/bin/python tests/facts/capture_sglang_options.py --wheels /tmp/sglang-wheels --python /tmp/capvenv/bin/python

For each ``sglang-<version>-*.whl`` it stores two things:

* ``sglang/srt/...``: the source files SGLang builds ``launch_server``'s parser from, as the wheel
  has them: ``srt/server_args.py`` and, where the version has them, ``srt/arg_groups/arg_utils.py``
  (``Arg``, ``add_cli_args_from_dataclass``), ``argparse_actions.py``, ``choices.py`` and
  ``fields/*.py`` (0.5.2x keeps the ServerArgs fields there), and the files the value checks follow:
  ``utils/common.py`` (``human_readable_int``, ``json_list_type``), ``model_executor/cuda_graph_config.py``,
  ``parser/reasoning_parser_names.py`` and ``function_call/parser_names.py`` (0.5.23's parser lists),
  ``kv_canary/consts.py`` (``RealKvHashMode``: 0.5.15 under ``sglang/jit_kernel``, 0.5.23 ``sglang/kernels/ops``). The doctor's reader
  (deploy/remote/sglang_cli.py) reads these with ``ast``; tests/unit/test_sglang_options.py runs it here.
* ``expected.json``: the options of the REAL parser, by an independent method: the wheel's own
  ``ServerArgs.add_cli_args(argparse.ArgumentParser())`` executed, with SGLang's own
  ``add_cli_args_from_dataclass`` on its own field classes (``get_type_hints``, msgspec Structs in
  0.5.2x). Only the parser's modules run for real (server_args, arg_groups.arg_utils,
  argparse_actions, choices, fields, field_order); torch, transformers and every other SGLang
  module are stand-ins (a permissive stub), since they are not installable here and do not declare
  options. A choice list that comes from a stub (the reasoning and tool-call parser registries,
  ``RealKvHashMode``, the LoRA modules of ``srt/utils/common.py``) is stored as
  ``"computed at run time"``. Three known effects of the stubs, checked by reading the source:
  ``--cuda-graph-backend-{decode,prefill}`` have ``choices=Backend.ALL`` (a stub, falsy) and so show
  the field's ``Literal`` values; ``--sampling-backend``'s choices are a set (any order) to which
  0.5.23 adds ``token_oracle`` when ``SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE`` is set. The test
  allows exactly these.

Counts read (names, the literal add_argument calls of add_cli_args): 0.5.12 387 options (387
literal calls), 0.5.15 437 (27 literal), 0.5.23 531 (9 literal).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "sglang_options"
#: the files the parser is built from (their paths inside the wheel)
PARSER_FILES = re.compile(r"^sglang/srt/(server_args\.py|arg_groups/(arg_utils|argparse_actions|choices|field_order)\.py"
                          r"|arg_groups/fields/[A-Za-z0-9_]+\.py"
                          # the type= functions and run-time choice lists the reader follows (issue 40)
                          r"|utils/common\.py|model_executor/cuda_graph_config\.py|parser/reasoning_parser_names\.py"
                          r"|function_call/parser_names\.py)$"
                          r"|^sglang/(kernels/ops|jit_kernel)/kv_canary/consts\.py$")  # RealKvHashMode (0.5.23, 0.5.15)
#: third-party packages SGLang's modules import at module level: stubs while the real parser is built
STUBBED = ("torch torchvision torchao transformers numpy triton packaging psutil requests zmq huggingface_hub "
           "safetensors fastapi uvicorn orjson aiohttp setproctitle sgl_kernel flashinfer einops tqdm PIL pydantic "
           "pydantic_core uvloop starlette prometheus_client pybase64 openai tiktoken xgrammar outlines llguidance "
           "partial_json_parser compressed_tensors cuda pynvml yaml jinja2 blobfile hf_transfer modelscope interegular "
           "datasets scipy sentencepiece msgpack IPython decord soundfile timm nvtx grpc google anthropic jsonschema "
           "regex tokenizers accelerate cloudpickle dill ray").split()
REAL_MODULES = ("sglang.srt.server_args", "sglang.srt.arg_groups.arg_utils", "sglang.srt.arg_groups.argparse_actions",
                "sglang.srt.arg_groups.choices", "sglang.srt.arg_groups.fields", "sglang.srt.arg_groups.field_order")
RUN_TIME = "computed at run time"

# The real-parser builder, run under --python (a Python with msgspec) as a separate process.
# (capture_sglang_verdicts.py runs BUILD_PARSER with more real modules, then parses argvs with it.)
BUILD_PARSER = r'''
import argparse, importlib.abc, importlib.machinery, json, os, sys, types
ROOT, STUBBED, REAL, RUN_TIME = sys.argv[1], set(sys.argv[2].split(",")), tuple(sys.argv[3].split(",")), sys.argv[4]
#: packages whose __init__ is not run (it imports the runtime): the builder's own, plus argv[5]
PACKAGES = ("sglang", "sglang.srt", "sglang.srt.arg_groups") + tuple(filter(None, (sys.argv[5:6] or [""])[0].split(",")))
ABSENT = {"npu", "hpu", "xpu", "musa", "mlu", "mps"}  # torch.npu etc.: SGLang probes hasattr(torch, ...)
KEEP = {"__wrapped__", "__signature__", "__origin__", "__args__", "__parameters__", "__qualname__", "__annotations__",
        "__dataclass_fields__", "__struct_fields__", "__get__", "__set_name__", "__class_getitem__",
        "__typing_subst__", "__len__", "__iter__", "__await__", "__aiter__"}

class _Base:
    def __init_subclass__(cls, **kw): pass
    def __init__(self, *a, **k): pass

class _Meta(type):
    """A stub that is also a class: attributes, calls, subscripts, bases, unions all give stubs."""
    def __new__(mcls, name, bases, ns, **kw): return super().__new__(mcls, name, bases, ns)
    def __init__(cls, name, bases, ns, **kw): super().__init__(name, bases, ns)
    def __getattr__(cls, name):
        if name in KEEP or name.startswith("_abc") or name.startswith("__pydantic"):
            raise AttributeError(name)
        return _make(cls.__name__ + "." + name)
    def __getitem__(cls, item): return _make(cls.__name__ + "[]")
    def __setitem__(cls, item, value): pass
    def __delitem__(cls, item): pass
    def __iter__(cls): return iter((_make(RUN_TIME),))
    def __len__(cls): return 0
    def __or__(cls, other): return _make("union")
    __ror__ = __or__
    def __add__(cls, other): return _make("sum")
    __radd__ = __add__
    def __bool__(cls): return False
    def __lt__(cls, o): return False
    __le__ = __gt__ = __ge__ = __lt__
    def __mro_entries__(cls, bases): return (_Base,)
    def __call__(cls, *a, **k): return _make(cls.__name__ + "()")
    def __int__(cls): return 0
    def __index__(cls): return 0
    def __float__(cls): return 0.0
    def __str__(cls): return "stub"
    def __fspath__(cls): return "/nonexistent"
    def __contains__(cls, x): return False
    def __enter__(cls): return cls
    def __exit__(cls, *a): return False
    def __hash__(cls): return id(cls)
    def __eq__(cls, o): return cls is o

def _make(name):
    return _Meta(name, (_Base,), {})

class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if (name.startswith("__") and name.endswith("__")) or name in ABSENT:
            raise AttributeError(name)
        return _make(self.__name__ + "." + name)

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top == "sglang":
            if any(name == r or name.startswith(r + ".") for r in REAL):
                return None  # the real source, by the normal path finder
            spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
            if name in PACKAGES:  # their __init__ is not run (it imports the runtime)
                spec.submodule_search_locations = [os.path.join(ROOT, *name.split("."))]
            return spec
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if top in STUBBED else None
    def create_module(self, spec):
        if spec.name in PACKAGES:
            m = types.ModuleType(spec.name)
            m.__path__ = list(spec.submodule_search_locations)
            return m
        m = StubModule(spec.name)
        m.__path__, m.__version__ = [], "2.9.0"
        return m
    def exec_module(self, module): pass

sys.path.insert(0, ROOT)
sys.meta_path.insert(0, Finder())
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
'''
LIST_OPTIONS = r'''
out = []
for action in parser._actions:
    if action.option_strings in ([], ["-h", "--help"]):
        continue
    choices = action.choices
    if choices is not None:
        choices = list(choices)
        if any(isinstance(c, _Meta) for c in choices):
            choices = RUN_TIME
    out.append({"names": list(action.option_strings), "nargs": action.nargs, "choices": choices})
json.dump(out, sys.stdout, indent=None)
'''
BUILDER = BUILD_PARSER + LIST_OPTIONS


def real_parser(python: str, tree: Path) -> list[dict]:
    done = subprocess.run([python, "-c", BUILDER, str(tree), ",".join(STUBBED), ",".join(REAL_MODULES), RUN_TIME],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"building the real parser of {tree} failed:\n{done.stderr[-3000:]}")
    options = json.loads(done.stdout)
    for option in options:  # argparse's nargs as the facts spell it
        option["nargs"] = "1" if option["nargs"] is None else str(option["nargs"])
    return options


def capture(wheel: Path, python: str) -> None:
    version = wheel.name.split("-")[1]
    target = OUT / version
    if target.exists():
        shutil.rmtree(target)
    with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")]
        archive.extractall(scratch, names)  # the whole package: the builder needs its layout
        for name in names:
            if PARSER_FILES.match(name):
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(os.path.join(scratch, name), target / name)
        options = real_parser(python, Path(scratch))
    lines = ",\n".join("  " + json.dumps(option) for option in options)  # one option a line: diffs stay readable
    (target / "expected.json").write_text(f'{{"version": {json.dumps(version)}, "wheel": {json.dumps(wheel.name)}, '
                                          f'"options": [\n{lines}\n]}}\n')
    print(f"{version}: {len(options)} options; {sum(1 for _ in target.rglob('*.py'))} source files")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", default="/tmp/sglang-wheels", help="folder of sglang-*.whl")
    parser.add_argument("--python", default=sys.executable, help="a Python with msgspec installed")
    args = parser.parse_args()
    wheels = sorted(Path(args.wheels).glob("sglang-*.whl"))
    if not wheels:
        print(f"no sglang-*.whl in {args.wheels}", file=sys.stderr)
        return 2
    for wheel in wheels:
        capture(wheel, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
