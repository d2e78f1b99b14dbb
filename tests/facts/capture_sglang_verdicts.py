"""Regenerate tests/facts/sglang_verdicts.json: what the REAL parser of SGLang 0.5.12, 0.5.15 and 0.5.23
does with each argv of a generated corpus of extra_args (issue 40).

    pip download --no-deps sglang==0.5.12 -d /tmp/sglang-wheels   (and 0.5.15, 0.5.23)
    python3 -m venv /tmp/capvenv && /tmp/capvenv/bin/pip install msgspec typing_extensions pyyaml
    .venv/bin/python tests/facts/capture_sglang_verdicts.py --wheels /tmp/sglang-wheels --python /tmp/capvenv/bin/python

The parser is built exactly as capture_sglang_options.py builds it (its ``BUILD_PARSER``: the wheel's own
``ServerArgs.add_cli_args(argparse.ArgumentParser())``), with MORE of SGLang's modules real, because
they decide values, not just option names:

* ``sglang.srt.utils.common`` (``human_readable_int``, ``json_list_type``, ``nullable_str``: the ``type=``
  of ``--context-length``, ``--max-total-tokens``, ...); its package ``sglang.srt.utils`` is a bare
  package (its ``__init__`` star-imports the runtime). Its third-party imports (torch, orjson's
  neighbours ...) stay stubs: none of them runs when a type function is called, except ``orjson``,
  which is NOT stubbed here (json_list_type calls ``orjson.loads``; install it in the capture venv, or
  the script says so and stops);
* ``sglang.srt.model_executor.cuda_graph_config`` (``parse_cuda_graph_config_arg``, 0.5.15+; stdlib only);
* the run-time choice lists: ``sglang.srt.parser.reasoning_parser_names``,
  ``sglang.srt.function_call.parser_names`` (0.5.23's ``_reasoning_parser_choices``), and
  ``sglang.kernels.ops.kv_canary.consts`` (0.5.15: ``sglang.jit_kernel.kv_canary.consts``; ``RealKvHashMode``),
  each a dependency-free module;
* ``yaml`` (PyYAML) and the config merger (``server_args_config_parser``): an argv with ``--config``
  goes through ``ConfigArgumentMerger(parser).merge_config_with_args`` first, as ``prepare_server_args``
  does (the corpus's config files are written to a scratch folder; the JSON stores their text).

What stays a stub, and why it does not change a verdict: ``envs.SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE.get()``
is a falsy stub, as the variable is unset on a host (``--sampling-backend token_oracle`` is refused, as
it is without the variable); every other stubbed name only declares defaults or help texts.
An option whose choices still come from a stub (0.5.12 and 0.5.15 build the reasoning and tool-call
parser lists from registries that import the runtime) is listed in the JSON (``stubbed_choices``),
and an argv that names it has no verdict (``"ok": null``): the test does not count it either way.

Each verdict: ``{"ok": true}`` or ``{"ok": false, "error": argparse's message}``; ``parse_args`` runs
with ``--model-path m`` first (the one required option; deployctl passes it itself). ``-h`` / ``--help``
(exit 0, no server) counts as refused.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_sglang_options import BUILD_PARSER, RUN_TIME, STUBBED  # noqa: E402

OUT = Path(__file__).resolve().parent / "sglang_verdicts.json"
OPTIONS = Path(__file__).resolve().parent / "sglang_options"
VERSIONS = ("0.5.12", "0.5.15", "0.5.23")
REAL = ("sglang.srt.server_args", "sglang.srt.arg_groups.arg_utils", "sglang.srt.arg_groups.argparse_actions",
        "sglang.srt.arg_groups.choices", "sglang.srt.arg_groups.fields", "sglang.srt.arg_groups.field_order",
        "sglang.srt.utils.common", "sglang.srt.model_executor.cuda_graph_config",
        "sglang.srt.parser.reasoning_parser_names", "sglang.srt.function_call.parser_names",
        "sglang.kernels.ops.kv_canary.consts", "sglang.jit_kernel.kv_canary.consts", "sglang.srt.server_args_config_parser",
        "sglang.srt.utils.server_args_config_parser")
BARE_PACKAGES = ("sglang.srt.utils", "sglang.srt.model_executor", "sglang.srt.parser", "sglang.srt.function_call",
                 "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.kv_canary", "sglang.jit_kernel",
                 "sglang.jit_kernel.kv_canary")
NOT_STUBBED = {"yaml", "orjson"}

VERDICTS = r'''
import tempfile
cases = json.loads(sys.stdin.read())
try:
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
except ImportError:
    from sglang.srt.server_args_config_parser import ConfigArgumentMerger
class Refused(Exception):
    pass
def _error(message):
    raise Refused(message)
def _exit(status=0, message=None):
    raise Refused("exit %s%s" % (status, ": " + message if message else ""))
parser.error = _error
parser.exit = _exit
def _from_stub(choices):
    if choices is None:
        return False
    if not isinstance(choices, (list, tuple, set, frozenset, dict, range)):
        return True
    return any(isinstance(c, _Meta) for c in choices)
stubbed_actions = [a for a in parser._actions if _from_stub(a.choices)]
stubbed = sorted(a.option_strings[0] for a in stubbed_actions)
stubbed_strings = set(s for a in stubbed_actions for s in a.option_strings)
scratch = tempfile.mkdtemp()
out = []
for case in cases:
    argv = list(case["argv"])
    if case.get("config") is not None:
        path = os.path.join(scratch, case["config"]["name"])
        with open(path, "w") as handle:
            handle.write(case["config"]["text"])
        argv = [path if a == "@CONFIG@" else a for a in argv]
    if any(a.split("=")[0] in stubbed_strings for a in argv):
        out.append({"ok": None, "error": "not judged: its choices come from a module the capture stubs"})
        continue
    try:
        if "--config" in argv:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        parser.parse_args(["--model-path", "m"] + argv)
        out.append({"ok": True})
    except Refused as exc:
        out.append({"ok": False, "error": str(exc)[:300]})
    except BaseException as exc:
        out.append({"ok": False, "error": ("%s: %s" % (type(exc).__name__, exc))[:300]})
json.dump({"verdicts": out, "stubbed_choices": stubbed, "python": sys.version.split()[0]}, sys.stdout)
'''


# --- the corpus --------------------------------------------------------------------------------------

#: values probed on every option that takes one: each kind of thing a user types
PROBES = ["8", "-1", "0.5", "1e3", "4k", "2.5Ki", "4x", "", "auto", "abc", '{"a": 1}', "[1, 2]", "None",
          "1_000", "fp8_e4m3"]


def _options(version: str) -> list[dict]:
    return json.loads((OPTIONS / version / "expected.json").read_text())["options"]


def corpus() -> list[dict]:
    """The argvs: hand-written ones (the issue's cases, each shape of error) and generated ones (every
    option of every version, with probe values chosen by a fixed seed)."""
    cases: list[dict] = []

    def add(argv: list[str], why: str, config: dict | None = None) -> None:
        case = {"argv": argv, "why": why}
        if config is not None:
            case["config"] = config
        cases.append(case)

    # the cases
    for argv in (["--max-prefill-tokens", "1e3"], ["--max-total-tokens="], ["--context-length", "4x"],
                 ["--sampling-backend", "torch"], ["--sampling-backend", "pytorch"],
                 ["--attention-backend", "flashx"], ["--quantization", "fp9"], ["--load-format", "safetensor"],
                 ["--attention-backend", "flashinfer"], ["--quantization", "fp8"], ["--load-format", "safetensors"],
                 ["--enable-metrics", "yes"], ["--enable-metrics=yes"], ["--enable-metrics"],
                 ["--context-length"], ["--log-level", "info", "--kv-cache-dtype"],
                 ["--context-length", "32k"], ["--context-length", "32Ki"], ["--context-length", "2.5Ki"],
                 ["--context-length", "25.6k"], ["--context-length", " 4096 "], ["--context-length", "1_000"],
                 ["--max-total-tokens", "1M"], ["--max-prefill-tokens", "16384"], ["--chunked-prefill-size", "-1"],
                 ["--chunked-prefill-size", "8k"], ["--reasoning-parser", "qwen3"], ["--reasoning-parser", "qwen9"],
                 ["--tool-call-parser", "llama3"], ["--tool-call-parser", "llama9"],
                 ["--kv-canary-real-data", "none"], ["--kv-canary-real-data", "partial"],
                 ["--kv-canary-real-data", "some"], ["--sampling-backend", "token_oracle"],
                 ["--json-model-override-args", '{"rope_theta": 1e6}'], ["--json-model-override-args", "{bad"],
                 ["--cuda-graph-config", '{"decode": {}}'], ["--cuda-graph-config", "[]"],
                 ["--cuda-graph-config", '{"nowhere": {}}'], ["--cuda-graph-backend-decode", "tc_piecewise"],
                 ["--lora-paths", "a", "b"], ["--lora-paths"], ["--lora-target-modules", "q_proj"],
                 ["--lora-target-modules", "q_prj"], ["--lora-target-modules"], ["--random-seed", "-1"],
                 ["--mem-fraction-static", "nan"], ["--mem-fraction-static", "inf"], ["--mem-fraction-static", "1e-1"],
                 ["--mem-frac", "0.8"], ["--mem", "0.8"], ["--enable-metrics", "--mem-fraction-static", "0.8"],
                 ["--base-gpu-id", "2"], ["--base-gpu-id", "two"], ["--gpu-id-step", "2"]):
        add(argv, "issue 40 / hand-written")

    # --config: the file must exist and be YAML; every key is an option, checked like one
    for name, text, why in (
            ("ok.yaml", "mem-fraction-static: 0.8\ncontext-length: 8192\n", "valid keys"),
            ("flag.yaml", "enable-metrics: true\ntrust-remote-code: false\n", "store_true keys"),
            ("badint.yaml", "context-length: 4x\n", "a value its type refuses"),
            ("badchoice.yaml", "kv-cache-dtype: fp9\n", "a value outside the choices"),
            ("unknown.yaml", "no-such-option: 1\n", "an unknown key"),
            ("list.yaml", "lora-paths: [a, b]\n", "a list"),
            ("empty.yaml", "", "an empty file"),
            ("scalar.yaml", "- a\n- b\n", "not a mapping"),
            ("broken.yaml", "a: [\n", "not YAML"),
            ("config.json", "{}", "not a .yaml name"),
            ("human.yaml", "max-total-tokens: 4k\n", "human_readable_int through the config"),
            ("flagvalue.yaml", "enable-metrics: yes-please\n", "a flag given a value"),
            ("mapping.yaml", "forward-hooks: {a: 1}\n", "a mapping for a json.loads option"),
            ("mapping2.yaml", "mm-process-config: {image: {max: 2}}\n", "a mapping for a json.loads option"),
            ("deprecated.yaml", "disable-cuda-graph: true\n", "a flag of a custom action"),
            ("onevalue.yaml", "experts-shared-outer-loras: true\nlora-strict-loading: true\n", "custom actions"),
            ("reserved.yaml", "speculative-num-steps: 3\n", "a reserved option"),
            ("underscore.yaml", "context_length: 8192\n", "a key with underscores"),
    ):
        add(["--config", "@CONFIG@"], f"--config: {why}", {"name": name, "text": text})
    add(["--config", "/nonexistent/sglang.yaml"], "--config: a missing file")
    add(["--config"], "--config without its value")

    # generated: every option of every version, with probes chosen by a fixed seed
    rng = random.Random(40)
    seen_names: set[str] = set()
    for version in VERSIONS:
        for option in _options(version):
            name = option["names"][0]
            if name in seen_names:
                continue
            seen_names.add(name)
            if option["nargs"] == "0":
                add([name], "generated: a flag")
                add([name, rng.choice(["yes", "1", "true"])], "generated: a flag given a value")
                continue
            choices = option["choices"]
            if isinstance(choices, list) and choices:
                good = str(rng.choice(choices))
                add([name, good], "generated: one of its choices")
                bad = good[:-1] + ("x" if not good.endswith("x") else "y") if good else "x"
                add([name, bad], "generated: a near miss of a choice")
                continue
            add([name, rng.choice(PROBES)], "generated: a probe value")
            if rng.random() < 0.5:
                add([name + "=" + rng.choice(PROBES)], "generated: a probe value after =")
            if rng.random() < 0.2:
                add(["--log-level", "info", name], "generated: its value missing at the end")
    return cases


def capture(wheels: Path, python: str) -> dict:
    cases = corpus()
    result: dict = {"corpus": cases, "versions": {}}
    stubbed = ",".join(s for s in STUBBED if s not in NOT_STUBBED)
    for version in VERSIONS:
        wheel = next(wheels.glob(f"sglang-{version}-*.whl"))
        with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(wheel) as archive:
            archive.extractall(scratch, [n for n in archive.namelist() if n.startswith("sglang/") and n.endswith(".py")])
            done = subprocess.run([python, "-c", BUILD_PARSER + VERDICTS, scratch, stubbed, ",".join(REAL), RUN_TIME,
                                   ",".join(BARE_PACKAGES)], input=json.dumps(cases), capture_output=True, text=True,
                                  timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"})  # sets print in one order
        if done.returncode != 0:
            raise SystemExit(f"the real parser of {version} failed:\n{done.stderr[-3000:]}")
        found = json.loads(done.stdout)
        result["versions"][version] = {"wheel": wheel.name, "python": found["python"],
                                       "stubbed_choices": found["stubbed_choices"]}
        for case, verdict in zip(cases, found["verdicts"]):
            case.setdefault("verdicts", {})[version] = verdict
        refused = sum(1 for v in found["verdicts"] if v["ok"] is False)
        print(f"{version}: {len(cases)} argvs, {refused} refused by the real parser; "
              f"choices still from stubs: {found['stubbed_choices']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", default="/tmp/sglang-wheels", help="folder of sglang-*.whl")
    parser.add_argument("--python", default=sys.executable, help="a Python with msgspec, PyYAML and orjson")
    args = parser.parse_args()
    check = subprocess.run([args.python, "-c", "import msgspec, yaml, orjson"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"{args.python} lacks msgspec, PyYAML or orjson: {check.stderr.strip()[-300:]}", file=sys.stderr)
        return 2
    result = capture(Path(args.wheels), args.python)
    lines = ",\n".join("  " + json.dumps(case) for case in result["corpus"])
    OUT.write_text(f'{{"versions": {json.dumps(result["versions"])},\n"corpus": [\n{lines}\n]}}\n')
    return 0


if __name__ == "__main__":
    sys.exit(main())
