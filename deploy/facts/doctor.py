"""The doctor's facts: one host command and strict parsers.

``doctor_command`` sends ``deploy/remote/doctor_facts.py`` (with the fixer's header reader and
host_ops' server-state code, bundled by deploy/facts/inline.py) inline (``python3 -c``), so a doctor
run writes nothing on the host. It runs under the host's python and starts itself again under the
run's sglang_python for SGLang's facts, in the same exec channel; a playbook's doctor also reads the
run's state (helpers' sha256, the running server, the last good record) for the later steps. It
prints one JSON document; anything else (a traceback, a missing field, a wrong type) is a
RemoteOutputError that quotes it, never "fine". ``host_command`` is the host part alone (the
multi-node check of every node's GPUs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError, field_validator

from deploy.base.limits import parse_json
from deploy.config.models import Host, Run
from deploy.base.errors import RemoteOutputError
from deploy.facts.helpers import host_ops_modules
from deploy.base.once import built_once
from deploy.facts.inline import inline_program
from deploy.base.shell import quote
from deploy.host.state_layout import StatePaths
from deploy.host.sglang_argv import serve_address

HELPER = Path(__file__).resolve().parents[1] / "remote" / "doctor_facts.py"
#: the key fixer's modules the doctor's program embeds (its safetensors header reader)
FIXER_MODULES = ("errors", "header")


@built_once  # every host of a run sends the same program
def doctor_program() -> str:
    """doctor_facts.py with the fixer's header reader, as one ``python3 -c`` program."""
    fixer = HELPER.parent / "fixer"
    modules = [(f"fixer.{name}", (fixer / f"{name}.py").read_text()) for name in FIXER_MODULES]
    modules += host_ops_modules()  # its server-state code
    modules.append(("sglang_source", (HELPER.parent / "sglang_source.py").read_text()))  # its static reader
    modules.append(("sglang_cli", (HELPER.parent / "sglang_cli.py").read_text()))  # SGLang's options
    modules.append(("package_metadata", (HELPER.parent / "package_metadata.py").read_text()))  # its version, plugins
    modules.append(("listeners", (HELPER.parent / "listeners.py").read_text()))  # the port listeners' reader
    return inline_program(modules + [("doctor_facts", HELPER.read_text())], "doctor_facts")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PythonFacts(_Strict):
    executable: str
    version: str


class NvidiaSmiFacts(_Strict):
    found: bool
    exit_code: Optional[int]
    stdout: str
    stderr: str
    error: Optional[str]


class GpuDeviceFacts(_Strict):
    pattern: str
    expanded: str
    matches: list[str]


class PortHolder(_Strict):
    pid: int
    session: Optional[int]
    cmdline: Optional[str]


class Listener(_Strict):
    address: str
    inode: int
    holders: list[PortHolder]
    #: the socket's owner (/proc/net/tcp)
    uid: Optional[int] = None


class ServerPid(_Strict):
    pid: Optional[int]
    alive: bool
    error: Optional[str]


class PortFacts(_Strict):
    port: int
    listeners: list[Listener]
    errors: list[str]
    server: ServerPid
    #: the doctor's own uid (the deploy user)
    uid: Optional[int] = None


class BindFacts(_Strict):
    address: Optional[str]
    bindable: bool
    error: Optional[str]
    #: a bind of the serve port on it would succeed now (None: not decided, or an older helper)
    port_free: Optional[bool] = None


class DirFacts(_Strict):
    path: str
    expanded: str
    exists: bool
    is_dir: bool
    writable: bool
    free_mib: Optional[int]
    checked: str
    error: Optional[str]


class ModelDirFacts(_Strict):
    path: str
    expanded: str
    exists: bool
    readable: bool
    config: Optional[dict[str, Any]]
    config_error: Optional[str]
    #: quantization files present besides config.json (doctor_facts.QUANT_FILES)
    quant_files: list[str]
    #: safetensors file -> tensor name -> shape (None: that file's header could not be read)
    files: Optional[dict[str, Optional[dict[str, list[int]]]]] = None
    files_error: Optional[str] = None


class QuarantineRead(_Strict):
    #: the file's text (None: absent)
    text: Optional[str]


class RunStateFacts(_Strict):
    """Read in the doctor's command for the run's later steps (one exec channel instead of four)."""

    #: helper file name -> sha256 (None: missing)
    helpers: dict[str, Optional[str]]
    #: ``host_ops.py server-state``'s document (the same code), parsed by facts.server
    server: dict[str, Any]
    #: last-good.json as text (None: absent)
    last_good: Optional[str]
    #: quarantine.json (deploy/facts/quarantine.py), when asked for
    quarantine: Optional[QuarantineRead] = None



class AppsAnswer(_Strict):
    exit_code: Optional[int]
    stdout: str
    stderr: str
    error: Optional[str]


class HolderProcess(_Strict):
    #: False: nvidia-smi lists a pid this host's /proc does not show (another container's PID namespace)
    visible: bool
    uid: Optional[int]
    session: Optional[int]
    cmdline: Optional[str]


class RecordedServer(_Strict):
    pid: Optional[int]
    alive: bool
    cmdline: Optional[str]
    #: the run its deployment.json names
    run: Optional[str]


class DeviceHolder(_Strict):
    """A process holding a GPU device file open (what free-gpus' fuser finds), as the doctor saw it."""

    pid: int
    uid: Optional[int]
    user: Optional[str]
    session: Optional[int]
    cmdline: Optional[str]


class GpuHolderFacts(_Strict):
    """The compute-apps answer (parsed by facts.gpus) and each listed process, read before the stop."""

    apps: AppsAnswer
    #: pid (as text: JSON keys) -> the process
    processes: dict[str, HolderProcess]
    #: the doctor's own uid: who stop-stale and free-gpus run as
    uid: int
    server: RecordedServer
    #: every process holding a GPU device file (issue 39; absent from an older doctor program)
    device_holders: list[DeviceHolder] = []


class SglangOption(_Strict):
    """One option of SGLang's parser (deploy/remote/sglang_cli.py)."""

    #: the option strings, canonical first (``["--tp-size", "--tensor-parallel-size"]``)
    names: list[str]
    #: argparse nargs as text: "0" (a flag), "1", "2".., "?", "*", "+", "..." or "unknown"
    nargs: str
    #: the values argparse accepts; None: any (or computed at run time, not read)
    choices: Optional[list[Union[StrictStr, StrictBool, StrictInt, StrictFloat]]]
    #: a list SGLang lets plugins extend (add_*_choices): a value outside it may still be accepted
    open_choices: bool
    #: the ``type=`` a value is converted by before the choices are checked: str, int, float, json
    #: (json.loads), orjson (SGLang's json_list_type), human_readable_int, cuda_graph_backend (SGLang's
    #: own functions, known by their code: deploy/remote/sglang_cli.py KNOWN_TYPE_FUNCTIONS), other (not judged)
    type: Literal["str", "int", "float", "json", "orjson", "human_readable_int", "cuda_graph_backend",
                  "cuda_graph_config", "other"]
    #: the function's name and file when it is not a builtin (for messages)
    type_function: Optional[str] = None
    #: what the type function checks against, read from its module (cuda_graph_config: Phase.ALL)
    type_detail: Optional[list[StrictStr]] = None
    #: values a run-time condition adds to ``choices`` (0.5.23 --sampling-backend token_oracle under an
    #: environment variable): not refused, not passed either
    conditional_choices: Optional[list[Union[StrictStr, StrictBool, StrictInt, StrictFloat]]] = None
    #: the SGLang environment variable (an EnvBool) that adds them, when the source says so
    conditional_env: Optional[str] = None
    #: the source gives choices, computed at run time in a way the reader does not follow (its values
    #: are not judged: a warning says so)
    choices_unknown: bool = False
    #: how SGLang's --config merger treats the option's key (sglang_cli._config_kind)
    config_kind: Literal["flag", "value", "one", "unsupported"] = "value"

    @field_validator("names")
    @classmethod
    def _option_strings(cls, names: list[str]) -> list[str]:
        if not names or not all(n.startswith("-") for n in names):
            raise ValueError(f"option strings must start with '-', got {names[:4]}")
        return names

    @field_validator("nargs")
    @classmethod
    def _nargs(cls, nargs: str) -> str:
        if not (nargs.isdigit() or nargs in ("?", "*", "+", "...", "unknown")):
            raise ValueError(f"nargs {nargs!r} is none of argparse's")
        return nargs


class SglangCliFacts(_Strict):
    """SGLang's options, read from its srt/server_args.py (never imported)."""

    file: str
    #: None when unreadable (``error`` says why)
    options: Optional[list[SglangOption]]
    error: Optional[str]
    #: how the read version builds its parser: "literal" (add_argument calls, 0.5.12 and older) or
    #: "dataclass" (add_cli_args_from_dataclass plus literal calls, 0.5.15+)
    layout: Optional[Literal["literal", "dataclass"]]


class ConfigFileFacts(_Strict):
    """The file of ``--config FILE`` in extra_args, read on the host the way SGLang's ConfigArgumentMerger
    reads it (deploy/remote/doctor_facts.py config_file)."""

    path: str
    #: why SGLang would stop on it (not found, not a regular file, not YAML, not a mapping ...), else None
    error: Optional[str]
    #: the doctor could not read it (PyYAML missing under sglang_python, no permission): cannot decide
    unreadable: Optional[str] = None
    #: [key, kind, value]: kind bool (value a bool), list (value the items as str), dict (value
    #: {"json": json.dumps, "str": str}), scalar (value str(value)), badkey (a key that is not text)
    items: list[list[Any]] = []

    @field_validator("items")
    @classmethod
    def _items(cls, items: list[list[Any]]) -> list[list[Any]]:
        for item in items:
            ok = len(item) == 3 and isinstance(item[0], str) and item[1] in ("bool", "list", "dict", "scalar", "badkey")
            if ok and item[1] == "bool":
                ok = isinstance(item[2], bool)
            elif ok and item[1] == "list":
                ok = isinstance(item[2], list) and all(isinstance(v, str) for v in item[2])
            elif ok and item[1] == "dict":
                ok = isinstance(item[2], dict) and set(item[2]) == {"json", "str"} and \
                    all(isinstance(v, str) for v in item[2].values())
            elif ok:
                ok = isinstance(item[2], str)
            if not ok:
                raise ValueError(f"a config item must be [key, kind, value] of matching types, got {str(item)[:120]}")
        return items


class PluginFacts(_Strict):
    """SGLang's plugin entry points installed for sglang_python (the groups srt/plugins/__init__.py loads)."""

    groups: list[str]
    #: "group: name = value" per entry point found
    found: list[str]
    error: Optional[str] = None


class SglangRun(_Strict):
    exit_code: int
    stdout: str
    stderr: str


class LaunchEnvFacts(_Strict):
    #: the run's env variables the check applied (names only: values may be secrets)
    names: list[str]
    #: the launch's commands ``command -v`` did not find under that environment
    missing: list[str]
    error: Optional[str] = None


class HostFacts(_Strict):
    schema_: int
    mode: str
    python: PythonFacts
    nvidia_smi: NvidiaSmiFacts
    gpu_devices: GpuDeviceFacts
    port: PortFacts
    serve_host: BindFacts
    dirs: dict[str, DirFacts]
    base_model: ModelDirFacts
    drafter: ModelDirFacts
    #: SGLang variables in the environment deployctl's commands (and so the server) get on the host
    server_env: dict[str, str]
    run_state: Optional[RunStateFacts] = None
    sglang_run: Optional[SglangRun] = None
    gpu_holders: GpuHolderFacts
    #: the launch's preamble run with the run's env (its command lookup variables): what it cannot find
    launch_env: Optional[LaunchEnvFacts]


class ArchitectureFacts(_Strict):
    class_found: bool
    file: Optional[str]
    has_hook: bool
    via: Optional[str]
    chain: list[str]


class SglangFacts(_Strict):
    schema_: int
    mode: str
    python: PythonFacts
    found: bool
    package_dir: Optional[str]
    version: Optional[str]
    version_error: Optional[str]
    models_dir: Optional[str]
    architectures: dict[str, ArchitectureFacts]
    imported_sglang: bool
    cli: Optional[SglangCliFacts]
    #: --config FILE of extra_args, when it has one (issue 40)
    config: Optional[ConfigFileFacts] = None
    plugins: Optional[PluginFacts] = None
    #: the options' conditional_env variables as the SGLang part's environment has them (None: unset)
    condition_env: dict[str, Optional[str]] = {}


#: the run's env variables that decide which programs the launch finds (their values are paths,
#: never secrets: only these travel in the doctor's command line)
LOOKUP_ENV = ("PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME", "LD_LIBRARY_PATH")


def launch_env_spec(run: Run) -> dict[str, Any]:
    """What the launch script's preamble needs (deploy/steps/launch.py: ``setsid nohup SGLANG_PYTHON``)
    and the run's lookup variables it runs with, for the doctor to try before anything is stopped."""
    return {"env": {name: run.env[name] for name in LOOKUP_ENV if name in run.env},
            "commands": ["setsid", "nohup", run.sglang_python]}


def host_spec(host: Host, run: Run) -> dict[str, Any]:
    paths = StatePaths(host.state_dir)
    return {"launch_env": launch_env_spec(run), 
        "gpu_devices": host.gpu_devices, "port": run.port, "pidfile": paths.pidfile,
        "serve_host": serve_address(run, host), "dirs": {"state": paths.root, "logs": paths.logs},
        "base_model": run.base_model, "drafter": run.drafter,
    }


#: the program text travels as argv[1], so the host part can start the SGLang part with the same text
from deploy.remote.doctor_facts import BOOT  # noqa: E402  (the remote side reuses it for the SGLang part)
from deploy.facts.helpers import helper_python


def run_state_spec(host: Host, helpers: list[str], health_url: str) -> dict[str, Any]:
    from deploy.host.state_layout import deployment_path, last_good_path

    paths = StatePaths(host.state_dir)
    from deploy.facts.quarantine import quarantine_path

    return {"helpers": {name: paths.helper(name) for name in helpers},
            "server": {"pidfile": paths.pidfile, "record": deployment_path(paths.root), "health_url": health_url},
            "last_good": last_good_path(paths.root), "quarantine": quarantine_path(paths.root)}


def doctor_command(host: Host, run: Run, *, run_state: dict[str, Any] | None = None, timeout: float = 60,
                   script: str | None = None) -> str:
    """ONE command: the host facts under the host's python, which runs the SGLang part under
    sglang_python itself (base model architectures read there), plus the run's state when asked."""
    # the SGLang part starts the way the launch would: under the run's lookup variables
    spec = host_spec(host, run) | {"sglang": {"python": run.sglang_python, "timeout_s": timeout,
                                              "env": launch_env_spec(run)["env"],
                                              "spec": sglang_spec(run)}}
    if run_state is not None:
        spec["run_state"] = run_state
    program = doctor_program() if script is None else script
    return (f"{helper_python(host.python)} -c {quote(BOOT)} {quote(program)} host "
            f"{quote(json.dumps(spec, sort_keys=True))}")


def _inline(python: str, mode: str, spec: dict[str, Any], script: str | None) -> str:
    program = doctor_program() if script is None else script
    return f"{quote(python)} -c {quote(program)} {mode} {quote(json.dumps(spec, sort_keys=True))}"


def host_command(host: Host, run: Run, *, script: str | None = None) -> str:
    return _inline(host.python, "host", host_spec(host, run), script)


def sglang_command(run: Run, architectures: list[str], *, script: str | None = None) -> str:
    return _inline(run.sglang_python, "sglang", {"architectures": architectures} | _config_spec(run), script)


def _config_spec(run: Run) -> dict[str, Any]:
    """The file SGLang's prepare_server_args would merge: the value after the exact token ``--config``
    (only that spelling triggers the merge, in 0.5.12 to 0.5.23)."""
    args = list(run.extra_args)
    if "--config" in args and args.index("--config") + 1 < len(args):
        return {"config": args[args.index("--config") + 1]}
    return {}


def sglang_spec(run: Run) -> dict[str, Any]:
    return {"base_model": run.base_model} | _config_spec(run)


def _parse(model: type[BaseModel], result, source: str, what: str):
    text = result.stdout.strip()
    lines = text.splitlines()
    if result.exit_code != 0 or len(lines) != 1:
        detail = (result.stderr.strip().splitlines() or [text or "(no output)"])[-1][:300]
        raise RemoteOutputError(f"{source}: {what} did not print its facts (exit {result.exit_code}): {detail}")
    try:
        raw = parse_json(lines[0])
        if isinstance(raw, dict) and "schema" in raw:
            raw["schema_"] = raw.pop("schema")
        return model.model_validate_json(json.dumps(raw), strict=True)
    except (ValueError, ValidationError) as exc:
        first = str(exc).splitlines()[:3]
        raise RemoteOutputError(f"{source}: {what} printed facts of an unexpected shape: {' '.join(first)[:400]}") from None


def parse_host_facts(result, source: str) -> HostFacts:
    facts = _parse(HostFacts, result, source, "the host fact gathering")
    if facts.mode != "host" or facts.schema_ != 1:
        raise RemoteOutputError(f"{source}: host facts have mode {facts.mode!r} schema {facts.schema_}, expected host 1")
    return facts


def parse_sglang_facts(result, source: str) -> SglangFacts:
    facts = _parse(SglangFacts, result, source, "the SGLang fact gathering")
    if facts.mode != "sglang" or facts.schema_ != 1:
        raise RemoteOutputError(f"{source}: SGLang facts have mode {facts.mode!r} schema {facts.schema_}")
    return facts


def base_architectures(facts: HostFacts) -> list[str]:
    config = facts.base_model.config or {}
    archs = config.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def read_doctor_facts(conn, host: Host, run: Run, timeout: float = 60) -> tuple[HostFacts, SglangFacts | None, str | None]:
    """One remote command: host facts under the host's python, SGLang's under sglang_python.

    Returns (host facts, SGLang facts or None, why SGLang's facts are missing).
    """
    return facts_of(conn.run(doctor_command(host, run, timeout=timeout), timeout=timeout + 15), host, run)


def facts_of(result, host: Host, run: Run) -> tuple[HostFacts, SglangFacts | None, str | None]:
    """(host facts, SGLang facts or None, why SGLang's are missing) from the one doctor command."""
    facts = parse_host_facts(result, host.name)
    sglang = facts.sglang_run
    if sglang is None:
        raise RemoteOutputError(f"{host.name}: the host fact gathering did not run the SGLang part")
    if sglang.exit_code == 127 or (sglang.exit_code != 0 and "not found" in sglang.stderr):
        return facts, None, f"{run.sglang_python!r} cannot be run on the host: {sglang.stderr.strip()[-200:]}"
    return facts, parse_sglang_facts(sglang, host.name), None
