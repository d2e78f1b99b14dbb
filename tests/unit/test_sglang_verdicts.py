"""The doctor's extra_args verdicts against the REAL parsers of SGLang 0.5.12, 0.5.15 and 0.5.23 (issue 40).

tests/facts/sglang_verdicts.json holds a generated corpus of extra_args argvs and what each real parser did
with it (tests/facts/capture_sglang_verdicts.py ran the wheels' own ``ServerArgs.add_cli_args`` parser and,
for ``--config``, their own ConfigArgumentMerger). The doctor reads the options from the captured sources
(tests/facts/sglang_options/) as it reads a host's, and must refuse every argv the real parser rejects and
none it accepts. An argv that sets an option deployctl reserves is refused by deployctl's own rule, whatever
SGLang says: those are checked apart.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.config.models import reserved_option_for
from deploy.doctor.before_stop import check_extra_args, check_parallelism
from deploy.doctor.sglang_options import Context, Parsed, parse_extra_args
from deploy.facts.doctor import ConfigFileFacts, PluginFacts, SglangCliFacts, doctor_program, parse_sglang_facts
from deploy.remote import doctor_facts, sglang_cli
from deploy.ssh.transport import CommandResult

FACTS = Path(__file__).resolve().parents[1] / "facts"
VERSIONS = ("0.5.12", "0.5.15", "0.5.23")
CORPUS = json.loads((FACTS / "sglang_verdicts.json").read_text())["corpus"]
#: the capture ran with no SGLang plugin installed
NO_PLUGINS = PluginFacts(groups=list(doctor_facts.PLUGIN_GROUPS), found=[])
#: ... and with SGLang's environment variables unset (the variables that add choices, as the facts report them)
UNSET = {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": None}
#: where the doctor still disagrees with a real parser, each with its reason (none today)
KNOWN_GAPS: set[tuple[str, tuple[str, ...]]] = set()


@functools.lru_cache(maxsize=None)  # each version's sources read once per session
def cli_facts(version: str) -> SglangCliFacts:
    return SglangCliFacts.model_validate(sglang_cli.read_options(str(FACTS / "sglang_options" / version / "sglang")))


def options(version: str) -> tuple:
    return tuple(cli_facts(version).options or ())


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict:
    """version -> the doctor's Parsed per corpus case (index), computed once for the module's tests."""
    folder = tmp_path_factory.mktemp("configs")
    return {version: [judge(version, case, folder) for case in CORPUS] for version in VERSIONS}


def judge(version: str, case: dict, tmp_path: Path) -> Parsed:
    argv = list(case["argv"])
    if case.get("config") is not None:
        path = tmp_path / case["config"]["name"]
        path.write_text(case["config"]["text"])
        argv = [str(path) if a == "@CONFIG@" else a for a in argv]
    config = None
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        # the SGLang part's reading of the file (deploy/remote/doctor_facts.py), parsed as the doctor parses it
        config = ConfigFileFacts.model_validate(doctor_facts.config_file(argv[argv.index("--config") + 1]))
    return parse_extra_args(argv, list(options(version)), Context(plugins=NO_PLUGINS, config=config, version=version,
                                                                  env=UNSET))


def reserved(case: dict) -> bool:
    return any(reserved_option_for(a.split("=", 1)[0]) for a in case["argv"]) or \
        any(reserved_option_for("--" + line.split(":")[0].strip()) for line in (case.get("config") or {}).get("text", "")
            .splitlines() if ":" in line)


def test_the_corpus_is_big_and_judged_by_every_version():
    assert len(CORPUS) >= 300
    for version in VERSIONS:
        judged = [c for c in CORPUS if c["verdicts"][version]["ok"] is not None]
        assert len(judged) >= 300
        assert sum(1 for c in judged if c["verdicts"][version]["ok"] is False) >= 100
        assert sum(1 for c in judged if c["verdicts"][version]["ok"] is True) >= 100


@pytest.mark.parametrize("version", VERSIONS)
def test_the_doctor_refuses_exactly_what_the_real_parser_refuses(version, verdicts):
    disagree, agree = [], 0
    for case, parsed in zip(CORPUS, verdicts[version]):
        real = case["verdicts"][version]
        if real["ok"] is None or reserved(case):
            continue
        if bool(parsed.problems) == (not real["ok"]):
            agree += 1
        elif (version, tuple(case["argv"])) not in KNOWN_GAPS:
            disagree.append((case["argv"], (case.get("config") or {}).get("text"), real, parsed.problems, parsed.doubts))
    assert not disagree, "\n".join(map(str, disagree[:20]))
    assert agree >= 300


@pytest.mark.parametrize("version", VERSIONS)
def test_every_refusal_names_the_option_and_the_value(version, verdicts):
    for case, parsed in zip(CORPUS, verdicts[version]):
        real = case["verdicts"][version]
        argv = case["argv"]
        if real["ok"] is not False or reserved(case) or case.get("config") or "--config" in argv or \
                (version, tuple(argv)) in KNOWN_GAPS:
            continue
        text = "\n".join(parsed.problems)
        option = argv[-1].split("=")[0] if argv[-1].startswith("--") else argv[-2].split("=")[0]
        assert option in text or argv[0].split("=")[0] in text, (argv, text)
        if not argv[-1].startswith("--") and "unrecognized option" not in text and "ambiguous" not in text:
            assert repr(argv[-1]) in text, (argv, text)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_reserved_option_is_refused_whatever_sglang_says(version, verdicts):
    cases = [(c, p) for c, p in zip(CORPUS, verdicts[version]) if reserved(c) and c["verdicts"][version]["ok"] is not None]
    assert cases
    for case, parsed in cases:
        assert parsed.problems, case["argv"]


@pytest.mark.parametrize("version", VERSIONS)
def test_known_gaps_are_warnings_not_silent_passes(version, tmp_path):
    for gap_version, argv in KNOWN_GAPS:
        if gap_version == version:
            parsed = judge(version, {"argv": list(argv)}, tmp_path)
            assert not parsed.problems and parsed.doubts, parsed


# --- each case of the issue, through the check both doctor and up's pre-flight run ----------------------

def doctor(version: str, extra_args: list[str], *, plugins: PluginFacts | None = NO_PLUGINS,
           config: ConfigFileFacts | None = None, tp_size: int = 1, gpus: int = 8, env: dict | None = None,
           condition_env: dict | None = None):
    cli = cli_facts(version)
    return SimpleNamespace(run=SimpleNamespace(extra_args=extra_args, tp_size=tp_size, nodes=[], env=env or {}),
                           sglang=SimpleNamespace(cli=cli, version=version, plugins=plugins, config=config,
                                                  condition_env=condition_env or {}),
                           host=SimpleNamespace(gpus=gpus))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("args,fragments", [
    (["--max-prefill-tokens", "1e3"], ["--max-prefill-tokens '1e3'", "human_readable_int"]),
    (["--max-total-tokens="], ["--max-total-tokens ''", "human_readable_int"]),
    (["--context-length", "4x"], ["--context-length '4x'", "human_readable_int"]),
    (["--context-length", "2.5Ki"], ["--context-length '2.5Ki'", "IEC"]),
    (["--sampling-backend", "torch"], ["--sampling-backend 'torch'", "did you mean pytorch?"]),
    (["--enable-metrics", "yes"], ["--enable-metrics yes: --enable-metrics takes no value", "'yes'"]),
    (["--enable-metrics=yes"], ["--enable-metrics", "'yes'", "takes no value"]),
    (["--log-level", "info", "--context-length"], ["--context-length", "expected one argument"]),
    (["--lora-target-modules", "q_prj"], ["--lora-target-modules 'q_prj'", "did you mean q_proj?"]),
])
def test_the_issues_value_errors_are_refused_naming_option_and_value(version, args, fragments):
    check = check_extra_args(doctor(version, args))
    assert check.status == "fail", check
    for fragment in fragments:
        assert fragment in check.reason, check.reason


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("args,nearest", [(["--attention-backend", "flashx"], "flashmla"),  # difflib's nearest
                                          (["--quantization", "fp9"], "fp8"),
                                          (["--load-format", "safetensor"], "safetensors")])
def test_a_typo_in_a_list_plugins_extend_is_refused_when_no_plugin_is_installed(version, args, nearest):
    check = check_extra_args(doctor(version, args))
    assert check.status == "fail", check
    assert f"{args[0]} {args[1]!r}" in check.reason and f"did you mean {nearest}?" in check.reason
    assert "sglang.srt.plugins" in check.reason and "sglang.srt.platforms" in check.reason  # the groups looked at
    installed = PluginFacts(groups=list(doctor_facts.PLUGIN_GROUPS), found=["sglang.srt.plugins: acme = acme:register"])
    check = check_extra_args(doctor(version, args, plugins=installed))
    assert check.status == "warn" and "acme" in check.reason, check
    unread = check_extra_args(doctor(version, args, plugins=None))
    assert unread.status == "warn" and "were not read" in unread.reason, unread


def test_a_choice_an_environment_variable_adds_is_judged_by_the_servers_environment():
    args = ["--sampling-backend", "token_oracle"]
    unset = check_extra_args(doctor("0.5.23", args, condition_env={"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": None}))
    assert unset.status == "fail" and "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE=(unset)" in unset.reason, unset
    on_host = check_extra_args(doctor("0.5.23", args, condition_env={"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"}))
    assert on_host.status == "pass", on_host
    off_by_run = check_extra_args(doctor("0.5.23", args, condition_env={"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "1"},
                                         env={"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": "0"}))  # the run's env file wins
    assert off_by_run.status == "fail", off_by_run
    unknown = check_extra_args(doctor("0.5.23", args))  # an older doctor program: the variable not reported
    assert unknown.status == "warn" and "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE" in unknown.reason, unknown


def test_a_value_the_doctor_cannot_judge_is_a_warning_that_says_so():
    check = check_extra_args(doctor("0.5.23", ["--cuda-graph-config", '{"decode": {"max_bs": 8}}']))
    assert check.status == "warn" and "cannot check" in check.reason, check
    check = check_extra_args(doctor("0.5.12", ["--reasoning-parser", "qwen3"]))  # a registry of the runtime
    assert check.status == "warn" and "cannot check this value" in check.reason, check


def test_an_unknown_type_function_is_a_warning_never_a_pass(tmp_path):
    srt = tmp_path / "sglang" / "srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text(
        "def human_readable_int(value):\n    return int(value) * 2\n\n"  # the name, not SGLang's code
        "class ServerArgs:\n    def add_cli_args(parser):\n"
        "        parser.add_argument('--n', type=human_readable_int)\n")
    found = sglang_cli.read_options(str(tmp_path / "sglang"))
    assert found["options"][0]["type"] == "other" and "human_readable_int" in found["options"][0]["type_function"]
    parsed = parse_extra_args(["--n", "4k"], SglangCliFacts.model_validate(found).options or [])
    assert not parsed.problems and "is not one the doctor knows" in parsed.doubts[0]


def test_the_known_type_functions_match_sglangs_behaviour():
    from deploy.doctor.sglang_options import human_readable_int, orjson_loads
    assert [human_readable_int(v) for v in ("1k", "25.6k", "1Ki", " 12 ", "1_000", "-3")] == \
        [1000, 25600, 1024, 12, 1000, -3]
    for bad in ("1e3", "", "4x", "2.5Ki", "1K", "k"):
        with pytest.raises(ValueError):
            human_readable_int(bad)
    assert orjson_loads(" [1] ") == [1]
    for bad in ("NaN", "1e400", '"\\ud800"', "[1,]", ""):
        with pytest.raises(ValueError):
            orjson_loads(bad)


# --- --config FILE ----------------------------------------------------------------------------------

def config_facts(path: Path | str) -> ConfigFileFacts:
    return ConfigFileFacts.model_validate(doctor_facts.config_file(str(path)))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_config_file_that_is_not_there_is_refused_before_the_stop(version):
    check = check_extra_args(doctor(version, ["--config", "/nonexistent/sglang.yaml"],
                                    config=config_facts("/nonexistent/sglang.yaml")))
    assert check.status == "fail" and "Config file not found: /nonexistent/sglang.yaml" in check.reason, check


def test_a_config_file_is_judged_key_by_key_reserved_keys_included(tmp_path):
    path = tmp_path / "sglang.yaml"
    for text, fragments in (
            ("context-length: 4x\n", ["--config", "--context-length '4x'"]),
            ("speculative-num-steps: 3\n", ["--speculative-num-steps", "deployctl sets itself"]),
            ("port: 30001\n", ["--port", "deployctl sets itself"]),
            ("model-path: /other\n", ["--model-path", "deployctl sets itself"]),
            ("enable-metrics: yes-please\n", ["--enable-metrics yes-please: --enable-metrics takes no value"]),
            ("lora-paths: [a, b]\n", ["lora-paths", "Unsupported config option"]),
            ("- a\n", ["dictionary at root level"]),
            ("a: [\n", ["is not YAML"])):
        path.write_text(text)
        check = check_extra_args(doctor("0.5.23", ["--config", str(path)], config=config_facts(path)))
        assert check.status == "fail", (text, check)
        for fragment in fragments:
            assert fragment in check.reason, (text, check.reason)
    path.write_text("mem-fraction-static: 0.8\nenable-metrics: true\ncontext-length: 32k\n")
    d = doctor("0.5.23", ["--config", str(path), "--log-level", "info"], config=config_facts(path))
    assert check_extra_args(d).status == "pass"
    from deploy.doctor.sglang_options import extra_arg
    assert extra_arg(d, "--mem-fraction-static") == "0.8" and extra_arg(d, "--enable-metrics") == ""


def test_a_config_that_is_a_fifo_or_a_directory_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    for path in (fifo, folder):
        check = check_extra_args(doctor("0.5.23", ["--config", str(path)], config=config_facts(path)))
        assert check.status == "fail" and "not a regular file" in check.reason, check


def test_a_config_the_host_did_not_read_is_a_warning():
    check = check_extra_args(doctor("0.5.23", ["--config", "/etc/sglang.yaml"], config=None))
    assert check.status == "warn" and "was not read on the host" in check.reason, check
    check = check_extra_args(doctor("0.5.23", ["--config", "/etc/sglang.yaml", "--config", "/b.yaml"]))
    assert check.status == "fail" and "more than once" in check.reason
    check = check_extra_args(doctor("0.5.23", ["--log-level", "info", "--config"]))
    assert check.status == "fail" and "--config without its value" in check.reason


# --- --base-gpu-id and the GPU plan -----------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_base_gpu_id_must_fit_the_gpus_of_the_plan(version):
    fits = check_parallelism(doctor(version, ["--base-gpu-id", "4"], tp_size=4, gpus=8))
    assert fits.status == "pass" and "GPUs 4 to 7" in fits.reason, fits
    over = check_parallelism(doctor(version, ["--base-gpu-id", "6"], tp_size=4, gpus=8))
    assert over.status == "fail" and "--base-gpu-id 6" in over.reason and "tp 4" in over.reason and \
        "hosts[].gpus is 8" in over.reason, over
    step = check_parallelism(doctor(version, ["--base-gpu-id", "1", "--gpu-id-step", "2"], tp_size=4, gpus=8))
    assert step.status == "pass" and "GPUs 1 to 7 (step 2)" in step.reason, step  # ranks on 1, 3, 5, 7
    step = check_parallelism(doctor(version, ["--base-gpu-id", "2", "--gpu-id-step", "2"], tp_size=4, gpus=8))
    assert step.status == "fail" and "GPU 8" in step.reason and "--gpu-id-step 2" in step.reason, step
    visible = check_parallelism(doctor(version, ["--base-gpu-id", "2"], tp_size=2, gpus=8,
                                       env={"CUDA_VISIBLE_DEVICES": "0,1,2"}))
    assert visible.status == "fail" and "CUDA_VISIBLE_DEVICES" in visible.reason, visible
    negative = check_parallelism(doctor(version, ["--base-gpu-id", "-1"], tp_size=1, gpus=8))
    assert negative.status == "fail" and "base_gpu_id >= 0" in negative.reason, negative


def test_the_doctors_own_program_reads_the_config_and_the_plugins(tmp_path):
    """The inline program's SGLang part (under a python whose sglang is 0.5.23's file set) reads the --config
    file and the plugin entry points; an installed plugin turns the typo's refusal into a warning."""
    config = tmp_path / "sglang.yaml"
    config.write_text("context-length: 4x\nenable-metrics: true\n")
    dist = tmp_path / "site" / "acme_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sglang.srt.plugins]\nacme = acme:register\n")
    env = {**os.environ, "PYTHONPATH": f"{FACTS / 'sglang_options' / '0.5.23'}:{tmp_path / 'site'}"}
    env.pop("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", None)
    proc = subprocess.run([sys.executable, "-c", doctor_program(), "sglang",
                           json.dumps({"architectures": [], "config": str(config)})],
                          capture_output=True, text=True, timeout=60, env=env)
    facts = parse_sglang_facts(CommandResult("sglang", proc.returncode, proc.stdout, proc.stderr, 0.0), "kimi-a")
    assert facts.config is not None and facts.config.error is None
    assert facts.config.items == [["context-length", "scalar", "4x"], ["enable-metrics", "bool", True]]
    assert facts.plugins is not None and facts.plugins.found == ["sglang.srt.plugins: acme = acme:register"]
    assert facts.condition_env == {"SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE": None}  # unset in the test's environment
    d = SimpleNamespace(run=SimpleNamespace(extra_args=["--config", str(config)], env={}), sglang=facts)
    check = check_extra_args(d)
    assert check.status == "fail" and f"--config {config} (on the host): --context-length '4x'" in check.reason
    d.run.extra_args = ["--quantization", "fp9"]
    check = check_extra_args(d)
    assert check.status == "warn" and "acme = acme:register" in check.reason, check


@pytest.mark.parametrize("item", [["a", "bool", "yes"], ["a", "list", [1]], ["a", "dict", {"json": "{}"}],
                                  ["a", "scalar", 3], ["a", "nested", "x"], [1, "scalar", "x"], ["a", "scalar"]])
def test_a_config_item_of_another_shape_is_refused_by_the_facts_parser(item):
    with pytest.raises(ValueError):
        ConfigFileFacts.model_validate({"path": "/c.yaml", "error": None, "items": [item]})


def test_a_config_too_big_for_the_facts_is_a_warning_not_a_truncated_judgement(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("json-model-override-args: '" + "x" * (300 << 10) + "'\n")
    facts = config_facts(path)
    assert facts.items == [] and "bytes of values" in (facts.unreadable or "")
    check = check_extra_args(doctor("0.5.23", ["--config", str(path)], config=facts))
    assert check.status == "warn" and "cannot check the options it sets" in check.reason, check


@pytest.mark.parametrize("body,choices,unknown,open_", [
    ("    return list(NAMES)\n", ["a", "b"], False, False),
    ("    module = sys.modules.get('x')\n    if module is not None:\n        return list(module.M)\n"
     "    return list(NAMES)\n", ["a", "b"], False, True),  # a registry a plugin may have extended
    ("    if os.environ.get('X'):\n        return ['c']\n    return list(NAMES)\n", None, True, False),
])
def test_choices_a_function_returns_are_read_only_when_its_one_other_return_is_a_registry(tmp_path, body, choices,
                                                                                         unknown, open_):
    srt = tmp_path / "sglang" / "srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text(
        "import os, sys\nNAMES = ['a', 'b']\n\ndef names():\n" + body +
        "\nclass ServerArgs:\n    def add_cli_args(parser):\n"
        "        parser.add_argument('--pick', choices=names())\n")
    [found] = sglang_cli.read_options(str(tmp_path / "sglang"))["options"]
    assert (found["choices"], found["choices_unknown"], found["open_choices"]) == (choices, unknown, open_)


#: (module, function) of each known type function in the captured sources
KNOWN_FUNCTIONS = [("sglang.srt.utils.common", "human_readable_int"), ("sglang.srt.utils.common", "json_list_type"),
                   ("sglang.srt.utils.common", "nullable_str"),
                   ("sglang.srt.model_executor.cuda_graph_config", "parse_cuda_graph_backend_arg"),
                   ("sglang.srt.model_executor.cuda_graph_config", "parse_cuda_graph_config_arg")]


def _pythons() -> list[str]:
    """python3.8 to python3.13 that run here (on PATH, or pyenv's installed versions)."""
    found = {}
    for minor in range(8, 14):
        candidates = sorted(str(p) for p in Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}")) + \
            [shutil.which(f"python3.{minor}")]
        for candidate in filter(None, candidates):
            if subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=30).returncode == 0:
                found[minor] = candidate
                break
    return list(found.values())


def test_the_known_type_functions_are_recognised_under_every_host_python():
    """The fingerprints are of code, not of one Python's ast: a host's python 3.8 computes the ones this
    python does (checked under the oldest and the newest python3.x found here; 3.8 and 3.13 on the
    machine this was written on, where 3.9 to 3.12 gave the same labels too)."""
    pythons = _pythons()
    if not pythons:
        pytest.skip("no python3.8 to python3.13 here")
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); import sglang_source as s; "
              "sources = [s._Source(folder) for folder in sys.argv[2:]]; "
              "found = [(source.module(m), n) for source in sources for m, n in " + repr(KNOWN_FUNCTIONS) + "]; "
              "print(json.dumps(sorted([n, s.fingerprint(m.functions[n])] for m, n in found "
              "if m is not None and n in m.functions)))")
    folders = [str(FACTS / "sglang_options" / v / "sglang") for v in VERSIONS]
    known = sorted([name, fingerprint] for name, fingerprint in sglang_cli.KNOWN_TYPE_FUNCTIONS)
    for python in sorted({pythons[0], pythons[-1]}):
        done = subprocess.run([python, "-c", script, str(Path(sglang_cli.__file__).parent)] + folders,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (python, done.stderr[-500:])
        found = sorted(set(map(tuple, json.loads(done.stdout))))
        assert found == sorted(map(tuple, known)), (python, found)


@pytest.mark.parametrize("args", [["--config=/etc/sglang.yaml"], ["--conf", "/etc/sglang.yaml"]])
def test_a_config_spelled_so_that_sglang_ignores_it_is_a_warning(args):
    check = check_extra_args(doctor("0.5.23", args))
    assert check.status == "warn" and "would be ignored" in check.reason, check
