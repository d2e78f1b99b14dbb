"""Doctor: facts gathered by the real host helper from real-format files, judged by the pure checks.

Inputs under tests/facts/doctor/: a Kimi-K2.5 config.json, speculators and SGLang drafter configs,
SGLang model sources with and without set_eagle3_layers_to_capture. The drafter safetensors files
are sparse (a valid header with Kimi-K2.5 shapes and data offsets, the tensor bytes a hole: the
helper reads names and shapes, never tensor bytes).
"""

from __future__ import annotations

import base64
import json
import math
import zlib
import os
import shutil
import random
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config.models import Host, Run
from deploy.doctor.checks import ONE_LAYER_LIMIT, DoctorInput, run_checks
from deploy.doctor.suspects import likely_causes
from deploy.base.errors import RemoteOutputError
from deploy.facts.doctor import HELPER, base_architectures, doctor_program, HostFacts, SglangFacts, host_spec, parse_host_facts, parse_sglang_facts
from deploy.facts.inline import without_comments
from deploy.remote import doctor_facts
from deploy.remote.fixer.header import DTYPE_BITS
from sandbox.drafter import drafter_tensor_specs
from deploy.ssh.transport import CommandResult

FIXTURES = Path(__file__).resolve().parents[1] / "facts" / "doctor"
KIMI = dict(hidden_size=7168, intermediate_size=18432, num_heads=64, num_kv_heads=64, head_dim=128,
            vocab_size=163840, draft_vocab_size=32000)
# nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits
# on an 8x H200 host (captured format)
SMI_ROWS = "".join(f"{i}, GPU-6ef0c3b2-4b1a-9d3e-1c2f-00000000000{i}, 0, 143771, 0\n" for i in range(8))


def write_header_only(path: Path, specs: dict[str, tuple[str, list[int]]]) -> None:
    """A valid safetensors file whose tensor bytes are a hole (sparse: gigabytes cost nothing)."""
    header, offset = {}, 0
    for name, (dtype, shape) in specs.items():
        size = DTYPE_BITS[dtype] * math.prod(shape) // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    os.truncate(path, 8 + len(blob) + offset)


class World:
    """A host's files in tmp_path: base model, drafter, an SGLang install, state dir, GPUs, nvidia-smi."""

    def __init__(self, root: Path, monkeypatch):
        self.root = root
        self.monkeypatch = monkeypatch
        self.base = root / "models" / "Kimi-K2.5"
        self.drafter = root / "drafters" / "kimi-eagle3"
        self.site = root / "site"
        self.bin = root / "bin"
        for d in (self.base, self.drafter, self.site / "sglang" / "srt" / "models", self.bin, root / "dev"):
            d.mkdir(parents=True)
        shutil.copy(FIXTURES / "kimi_k25_config.json", self.base / "config.json")
        for i in range(8):
            (root / "dev" / f"nvidia{i}").touch()
        # importing this package must never happen: the doctor reads files and metadata only
        (self.site / "sglang" / "__init__.py").write_text("raise SystemExit('doctor imported sglang')\n")
        for name in ("llama.py", "deepseek_v2.py"):
            shutil.copy(FIXTURES / "models" / name, self.site / "sglang" / "srt" / "models" / name)
        self.smi(SMI_ROWS)
        self.monkeypatch.setenv("PATH", f"{self.bin}:/usr/bin:/bin")
        self.monkeypatch.setenv("HOME", str(root))  # state_dir ~/state (a state dir under /tmp is refused)
        self.drafter_layout()
        self.sglang_version("0.5.9")
        self.port = _free_port()

    def smi(self, output: str | None, exit_code: int = 0) -> None:
        target = self.bin / "nvidia-smi"
        if output is None:
            target.unlink(missing_ok=True)
            return
        (self.root / "smi.out").write_text(output)
        target.write_text(f"#!/bin/sh\ncat {self.root / 'smi.out'}\nexit {exit_code}\n")
        target.chmod(0o755)

    def sglang_version(self, version: str | None) -> None:
        for old in self.site.glob("sglang-*.dist-info"):
            shutil.rmtree(old)
        if version is not None:
            info = self.site / f"sglang-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        hook = version is not None and tuple(int(x) for x in version.split(".")[:3]) >= (0, 5, 10)
        shutil.copy(FIXTURES / "models" / ("kimi_k25_0.5.10.py" if hook else "kimi_k25_0.5.9.py"),
                    self.site / "sglang" / "srt" / "models" / "kimi_k25.py")

    def drafter_layout(self, layout: str = "speculators", layers: int = 1, config: dict | None = None,
                       **dims) -> None:
        for old in self.drafter.glob("*.safetensors"):
            old.unlink()
        specs = drafter_tensor_specs(layout=layout, num_layers=layers, **{**KIMI, **dims})
        write_header_only(self.drafter / "model.safetensors", specs)
        name = "speculators_drafter_config.json" if layout == "speculators" else "sglang_drafter_config.json"
        base = json.loads((FIXTURES / name).read_text())
        if layout == "speculators":
            base["transformer_layer_config"]["num_hidden_layers"] = layers
        base.update(config or {})
        (self.drafter / "config.json").write_text(json.dumps(base))

    def host(self, **kw) -> Host:
        return Host(**{"name": "kimi-a", "address": "127.0.0.1", "gpu_devices": str(self.root / "dev" / "nvidia*"),
                       "state_dir": "~/state", **kw})

    def run(self, **kw) -> Run:
        fields = dict(name="kimi", hosts=["kimi-a"], base_model=str(self.base), drafter=str(self.drafter),
                      serve_host="127.0.0.1", port=self.port)
        fields.update(kw)
        return Run(**fields)

    def facts(self, host: Host, run: Run) -> tuple[HostFacts, SglangFacts]:
        out = json.dumps(doctor_facts.host_facts(host_spec(host, run)))
        facts = parse_host_facts(CommandResult("host", 0, out + "\n", "", 0.0), host.name)
        archs = base_architectures(facts)
        code, stdout, stderr = self.sglang_program(archs)
        return facts, parse_sglang_facts(CommandResult("sglang", code, stdout, stderr, 0.0), host.name)

    def sglang_program(self, archs: list[str]) -> tuple[int, str, str]:
        """The doctor's SGLang part, run by a real interpreter once per distinct install.

        Its answer depends only on the files under site/ (read, never imported) and the
        architectures asked for, so it is cached on their content: most tests of a module ask the
        same install again (a 0.5 s interpreter start each time made these files most of the unit
        tier's time). The paths under tmp_path differ per test: they are stored as a placeholder.
        """
        files = tuple(sorted((str(p.relative_to(self.site)), p.read_bytes())
                             for p in self.site.rglob("*") if p.is_file()))
        key = (json.dumps(archs), os.getcwd(), files)
        if key not in _SGLANG_RUNS:
            argv = [sys.executable, "-c", doctor_program(), "sglang", json.dumps({"architectures": archs})]
            proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(self.site)},
                                  timeout=60)
            site = str(self.site)
            _SGLANG_RUNS[key] = (proc.returncode, proc.stdout.replace(site, _SITE), proc.stderr.replace(site, _SITE))
        code, stdout, stderr = _SGLANG_RUNS[key]
        return code, stdout.replace(_SITE, str(self.site)), stderr.replace(_SITE, str(self.site))

    def checks(self, host: Host | None = None, run: Run | None = None, **kw) -> dict:
        host, run = host or self.host(), run or self.run()
        facts, sglang = self.facts(host, run)
        results = run_checks(DoctorInput(host, run, run.draft_tokens, facts, sglang, **kw))
        names = [c.name for c in results]
        assert len(names) == len(set(names)), names
        return {c.name: c for c in results}


#: World.sglang_program's answers, per (architectures, cwd, the install's files)
_SGLANG_RUNS: dict[tuple, tuple[int, str, str]] = {}
_SITE = "\x00SITE\x00"


def _free_port() -> int:
    """A port free on every address, below the kernel's ephemeral range: a port the kernel handed out
    (bind to 0) is also what any test's outgoing connection may get next, and that connection's local
    port made a later 0.0.0.0 bind fail on a loaded machine (a fresh-clone run, 2026-12-06)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        ephemeral_low = int(handle.read().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, min(ephemeral_low, 30000)))
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in 10000-29999 after 200 tries")


@pytest.fixture
def world(tmp_path, monkeypatch):
    return World(tmp_path, monkeypatch)


def statuses(checks: dict) -> dict:
    return {name: c.status for name, c in checks.items()}


def test_healthy_host_passes_everything(world):
    world.sglang_version("0.5.11")
    # without it, max-running-requests warns: SGLang caps speculation at 48 (sglang#34290)
    checks = world.checks(run=world.run(extra_args=["--max-running-requests", "64"]))
    assert {n: s for n, s in statuses(checks).items() if s != "pass"} == {}, {n: c.reason for n, c in checks.items()}
    assert "SGLang 0.5.11 (package metadata)" in checks["sglang-version"].reason


def test_sglang_facts_never_import_sglang(world):
    facts, sglang = world.facts(world.host(), world.run())
    assert sglang.imported_sglang is False and sglang.found and sglang.version == "0.5.9"


@pytest.mark.parametrize("version,status", [("0.5.9", "fail"), ("0.5.10", "pass"), ("0.5.12", "pass")])
def test_kimi_target_capture_follows_the_installed_model_source(world, version, status):
    world.sglang_version(version)
    check = world.checks()["target-capture"]
    assert check.status == status, check.reason
    assert "KimiK25ForConditionalGeneration (kimi_k25.py)" in check.reason


def test_capture_inherited_from_a_base_class_counts(world):
    config = json.loads((world.base / "config.json").read_text())
    config["architectures"] = ["Phi3ForCausalLM"]
    (world.base / "config.json").write_text(json.dumps(config))
    check = world.checks()["target-capture"]
    assert check.status == "pass" and "via LlamaForCausalLM" in check.reason


def test_unknown_architecture_cannot_decide(world):
    config = json.loads((world.base / "config.json").read_text())
    config["architectures"] = ["BrandNewForCausalLM"]
    (world.base / "config.json").write_text(json.dumps(config))
    assert world.checks()["target-capture"].status == "warn"


def test_version_unknown_is_a_warning_never_a_pass(world):
    world.sglang_version(None)
    checks = world.checks()
    for name in ("sglang-version", "drafter-weights"):
        assert checks[name].status == "warn" and "cannot decide" in checks[name].reason


def test_two_layer_drafter_on_old_sglang_names_the_limit_first(world):
    world.sglang_version("0.5.11")
    world.drafter_layout(layers=2)
    checks = world.checks()
    assert checks["drafter-layers"].status == "fail"
    assert checks["drafter-layers"].reason.startswith(ONE_LAYER_LIMIT)
    assert checks["drafter-weights"].status == "fail"
    assert checks["drafter-weights"].reason.splitlines()[0].startswith(ONE_LAYER_LIMIT)
    world.sglang_version("0.5.12")
    checks = world.checks()
    assert checks["drafter-layers"].status == "pass" and checks["drafter-weights"].status == "pass", \
        checks["drafter-weights"].reason


def test_speculators_config_passes_in_a_playbook_and_warns_alone(world):
    world.sglang_version("0.5.11")
    assert world.checks()["drafter-config"].status == "pass"
    check = world.checks(fix_keys_will_run=False)["drafter-config"]
    assert check.status == "warn" and "fix-keys" in check.fix


def test_dropped_weight_is_named(world):
    world.sglang_version("0.5.11")
    world.drafter_layout(layout="sglang")
    specs = drafter_tensor_specs(layout="sglang", **KIMI)
    specs["midlayer.self_attn.q_proj.weight.extra"] = ("BF16", [1])
    write_header_only(world.drafter / "model.safetensors", specs)
    check = world.checks()["drafter-weights"]
    assert check.status == "fail" and "midlayer.self_attn.q_proj.weight.extra" in check.reason


CUSTOM = {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}
DEFAULT = {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}


@pytest.mark.parametrize("version,ids,extra,status", [
    ("0.5.10", CUSTOM, [], "fail"),
    ("0.5.9", CUSTOM, [], "fail"),
    ("0.5.10", CUSTOM, ["--disable-cuda-graph"], "pass"),
    ("0.5.11", CUSTOM, [], "pass"),
    ("0.5.10", DEFAULT, [], "pass"),
])
def test_cuda_graph_capture_bug(world, version, ids, extra, status):
    world.sglang_version(version)
    world.drafter_layout(config=ids)
    check = world.checks(run=world.run(extra_args=extra))["cuda-graph-capture"]
    assert check.status == status, check.reason
    if status == "fail":
        assert "0.5.11" in check.fix and "--disable-cuda-graph" in check.fix


def test_aux_ids_beyond_the_target_layers_and_fc_width(world):
    world.sglang_version("0.5.11")
    world.drafter_layout(config={"eagle_aux_hidden_state_layer_ids": [2, 30, 61]})
    check = world.checks()["aux-hidden-states"]
    assert check.status == "fail" and "[61]" in check.reason and "61" in check.reason
    world.drafter_layout(layout="sglang")
    specs = drafter_tensor_specs(layout="sglang", **KIMI, num_aux=2)
    write_header_only(world.drafter / "model.safetensors", specs)
    check = world.checks()["aux-hidden-states"]
    assert check.status == "fail" and "fc.weight input width 14336" in check.reason


def test_hidden_and_vocab_sizes_against_the_base_model(world):
    world.sglang_version("0.5.11")
    world.drafter_layout(layout="sglang", draft_vocab_size=32000)
    assert world.checks()["hidden-and-vocab"].status == "pass"
    specs = drafter_tensor_specs(layout="sglang", **{**KIMI, "draft_vocab_size": 16000})
    write_header_only(world.drafter / "model.safetensors", specs)
    check = world.checks()["hidden-and-vocab"]
    assert check.status == "fail" and "d2t has shape [16000]" in check.reason
    world.drafter_layout(layout="sglang", config={"hidden_size": 4096})
    check = world.checks()["hidden-and-vocab"]
    assert check.status == "fail" and "hidden_size 4096" in check.reason


def test_nvidia_smi_missing_failing_or_wrong_count(world):
    world.smi(None)
    assert world.checks()["nvidia-smi"].status == "fail"
    world.smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", exit_code=9)
    check = world.checks()["nvidia-smi"]
    assert check.status == "fail" and "couldn't communicate" in check.reason
    world.smi(SMI_ROWS)
    check = world.checks(host=world.host(gpus=4))["nvidia-smi"]
    assert check.status == "fail" and "4 configured" in check.reason


def test_gpu_glob_matching_nothing_and_tp_size(world):
    checks = world.checks(host=world.host(gpu_devices=str(world.root / "nodev" / "nvidia*")))
    assert checks["gpu-devices"].status == "fail"
    assert world.checks(run=world.run(tp_size=16))["tp-size"].status == "fail"


@pytest.mark.parametrize("nodes, tp_size, status, fragment", [
    (2, 16, "pass", "8 of this host's 8 GPUs"), (2, 8, "pass", "4 of this host's 8 GPUs"),
    (4, 32, "pass", "8 of this host's 8 GPUs"), (2, 24, "fail", "needs 12 GPUs per node"),
    (2, 15, "fail", "not a multiple of the run's 2 nodes"), (3, 16, "fail", "not a multiple"),
    (4, 64, "fail", "needs 16 GPUs per node")])
def test_tp_size_of_a_multi_node_server_is_per_node(world, nodes, tp_size, status, fragment):
    """One server over N nodes splits tp_size evenly: 16 over 2 nodes of 8 GPUs fits."""
    names = [f"node-{i}" for i in range(nodes)]
    check = world.checks(host=world.host(gpus=8), run=world.run(hosts=[], nodes=names, tp_size=tp_size))["tp-size"]
    assert check.status == status and fragment in check.reason, check


def test_port_held_by_a_foreign_process_is_named(world):
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", world.port))
        listener.listen()
        check = world.checks()["serve-port"]
        assert check.status == "fail" and f"pid {os.getpid()}" in check.reason
        # the same process recorded as deployctl's server: the deploy replaces it
        (world.root / "state").mkdir()
        (world.root / "state" / "server.pid").write_text(f"{os.getpid()}\n")
        assert world.checks()["serve-port"].status == "pass"
        # a listener on another address with the same port does not clash
        check = world.checks(run=world.run(serve_host="127.0.0.2"))["serve-port"]
        assert check.status == "pass", check.reason


@pytest.mark.parametrize("address", ["10.255.255.77", "no-such-host.invalid", "300.1.1.1"])
def test_serve_host_not_an_address_of_the_host(world, address):
    check = world.checks(run=world.run(serve_host=address))["serve-host"]
    assert check.status == "fail" and address in check.reason


def test_state_dir_under_the_free_space_minimum(world):
    check = world.checks(host=world.host(min_free_mib=10 ** 12))["state-dir"]
    assert check.status == "fail" and "min_free_mib" in check.reason
    (world.root / "blocker").write_text("")
    check = world.checks(host=world.host(state_dir="~/blocker"))["state-dir"]
    assert check.status == "fail" and "not a directory" in check.reason


def test_missing_base_model_and_drafter(world):
    checks = world.checks(run=world.run(base_model=str(world.root / "none"), drafter=str(world.root / "gone")))
    assert checks["base-model"].status == "fail" and checks["drafter"].status == "fail"
    assert checks["target-capture"].status == "warn" and checks["drafter-weights"].status == "warn"


def test_likely_causes_follow_the_doctor():
    plain = likely_causes(None)
    assert plain[0].startswith("the target does not capture")
    checks = [{"name": "drafter-weights", "status": "fail"}, {"name": "target-capture", "status": "pass"},
              {"name": "speculative-flags", "status": "warn"}]
    ordered = likely_causes(checks)
    assert ordered[0].startswith("drafter weights dropped") and "FAILED" in ordered[0]
    assert ordered[1].startswith("EAGLE instead") and ordered[-1].startswith("the target does not capture")


# --- strict parsing of the helper's output ------------------------------------------------------

def _document(world) -> dict:
    return doctor_facts.host_facts(host_spec(world.host(), world.run()))


def _mutations(document: dict):
    for key in sorted(document):
        broken = dict(document)
        del broken[key]
        yield pytest.param(broken, id=f"missing-{key}")
        wrong = dict(document)
        wrong[key] = [] if not isinstance(document[key], list) else "x"
        yield pytest.param(wrong, id=f"wrong-type-{key}")
    extra = dict(document, surprise=1)
    yield pytest.param(extra, id="unknown-key")


def test_every_missing_or_mistyped_field_is_refused(world):
    document = _document(world)
    cases = list(_mutations(document))
    assert len(cases) > 10
    for case in cases:
        text = json.dumps(case.values[0])
        with pytest.raises(RemoteOutputError):
            parse_host_facts(CommandResult("c", 0, text + "\n", "", 0.0), "kimi-a")


@pytest.mark.parametrize("stdout,exit_code", [
    ("", 0), ("Traceback (most recent call last):\n  File ...\n", 1), ("{}\n{}\n", 0), ("[1, 2]\n", 0),
    ('{"schema": 1}\n', 0), ("not json\n", 0),
])
def test_unexpected_helper_output_is_an_error(stdout, exit_code):
    with pytest.raises(RemoteOutputError):
        parse_host_facts(CommandResult("c", exit_code, stdout, "boom", 0.0), "kimi-a")
    with pytest.raises(RemoteOutputError):
        parse_sglang_facts(CommandResult("c", exit_code, stdout, "boom", 0.0), "kimi-a")


def test_helper_is_python38_standard_library_only_and_never_imports_sglang():
    import ast

    tree = ast.parse(HELPER.read_text(), feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # the fixer's header reader: ".fixer.header" locally, "fixer.header" in the inline program;
            # host_ops' server-state, sglang_cli and the port listeners' reader (issue 27):
            # "from . import ..." / ".listeners" locally, "import ..." inline
            imported.add((node.module.split(".")[0] if node.module else "host_ops") if node.level == 1
                         else node.module.split(".")[0])
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            assert node.value.id not in ("list", "dict", "tuple", "set", "type"), node.value.id
    ours = {"fixer", "host_ops", "sglang_cli", "listeners", "state_files", "package_metadata"}
    # PyYAML: the one exception, imported inside config_file only, under sglang_python, where SGLang's own
    # --config merger needs it too (an ImportError there is "cannot decide", issue 40)
    lazy = {node.names[0].name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "config_file"
            for node in ast.walk(f) if isinstance(node, ast.Import)}
    assert lazy <= {"yaml"}
    assert imported - ours - lazy <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
    assert not imported & {"sglang", "torch", "deploy"}


def test_the_doctor_reads_headers_with_the_fixers_reader_and_has_no_copy_of_its_own():
    """One safetensors header reader in the product: the doctor's program embeds fixer/header.py."""
    source = HELPER.read_text()
    assert "struct.unpack(\"<Q\"" not in source and "MAX_HEADER" not in source
    program = doctor_program()
    payload = program.split('b64decode("')[1].split('"')[0]
    modules, entry = json.loads(zlib.decompress(base64.b64decode(payload)))
    assert entry == "doctor_facts"
    assert dict(modules)["fixer.header"] == without_comments((HELPER.parent / "fixer" / "header.py").read_text())


def test_the_inline_doctor_reports_a_bad_header_the_fixers_way(tmp_path):
    world_drafter = tmp_path / "d"
    world_drafter.mkdir()
    (world_drafter / "model.safetensors").write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    spec = {"gpu_devices": str(tmp_path / "nvidia*"), "port": 1, "pidfile": str(tmp_path / "pid"),
            "serve_host": "127.0.0.1", "dirs": {"state": str(tmp_path)}, "base_model": str(tmp_path),
            "drafter": str(world_drafter), "nvidia_smi": "no-such-nvidia-smi"}
    proc = subprocess.run([sys.executable, "-I", "-c", doctor_program(), "host", json.dumps(spec)],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    drafter = json.loads(proc.stdout)["drafter"]
    assert drafter["files"] == {"model.safetensors": None}
    assert "over safetensors' 100 MB limit" in drafter["files_error"], drafter["files_error"]


def test_a_wildcard_serve_host_still_clashes_with_a_listener_on_one_address(world):
    """Issue 27: the doctor asks the kernel (a bind of serve_host:port) before blaming a listener
    another address shows; on a real host a 0.0.0.0 bind beside 127.0.0.1:PORT fails, so it still
    fails here, naming the holder. The free case is checked first, right after the port was found
    free: checked last, a listener of a test beside this one took the port in between (a fresh-clone
    run, 2026-12-06)."""
    free = world.checks(run=world.run(serve_host="0.0.0.0"))["serve-port"]
    assert free.status == "pass", free.reason
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", world.port))
        listener.listen()
        check = world.checks(run=world.run(serve_host="0.0.0.0"))["serve-port"]
        assert check.status == "fail" and f"pid {os.getpid()}" in check.reason, check.reason
