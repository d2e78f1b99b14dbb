#!/usr/bin/python3
"""SIMULATED nvidia-smi: a TEST DOUBLE run as ``~/bin/nvidia-smi`` on deployctl sandbox hosts (this module
is installed as ``~/.sim/lib/sim_nvidia_smi.py``, behind a launcher there that imports it: sandbox/hosts.py).
It is the model: ``sim_nvidia_smi_fast.c`` (``~/bin/nvidia-smi`` where a C compiler is at hand) answers
deployctl's two CSV queries as this module does and execs the launcher for everything else.

There is no GPU. A sandbox host has files ``~/dev/nvidia0..N-1`` (and ``~/dev/nvidiactl``) standing
in for ``/dev/nvidiaN``. The numbers this script prints come from REAL processes:

- A GPU is in use while some live process holds its device file open (found by reading the
  ``/proc/<pid>/fd/*`` symlinks, which is also what ``fuser`` does). So ``fuser -k ~/dev/nvidia*``
  or ``kill`` of a stray process really frees the GPU here.
- Each holder contributes ``~/.sim/alloc/<pid>.<gpu>`` MiB when that file exists (written by the
  holder, e.g. the stand-in SGLang's TP ranks) and is not older than the process, else 512 MiB
  (about one CUDA context). ``~/.sim/alloc/<pid>.<gpu>.util`` likewise gives utilization.gpu.
- ``~/.sim/driver_failed`` makes it fail the way it does when the driver is gone (exit 9).
- ``~/.sim/query_delay_s`` (a number of seconds) makes every call take that long first, as a driver busy
  tearing down a context does (issue 39: a watch loop inside such a query outlived deployctl by 25 s).
- ``~/.sim/phantom.json`` (``{"3": 512}``: GPU index -> MiB) adds memory that NO listed process
  holds, as a real GPU shows after a leaked CUDA context or with a process of another container:
  memory.used includes it, ``--query-compute-apps`` lists nobody for it, and no kill frees it.

Faithful: the CSV shapes of ``--query-gpu`` / ``--query-compute-apps`` (``, `` separators,
``[MiB]`` / ``[%]`` unit brackets in headers even with ``nounits``, ``0 MiB`` / ``0 %`` values with
units, no output at all for an empty ``noheader`` compute-apps query), ``-L``, ``-i``, the
"Invalid combination of input arguments" and ``Field "x" is not a valid field to query.`` errors.

Not faithful: only the fields listed in GPU_FIELDS / APP_FIELDS exist; memory.used is 0 MiB when
nothing holds a GPU (a real idle H200 shows a few MiB); processes of other users are invisible when
run unprivileged (real nvidia-smi sees them); temperatures/power in the plain table are constants;
no MIG, no ``-q``, no ``--loop``, no ``dmon``/``pmon``, no ``-r``.

Standard library only. Config: ``$NVIDIA_SMI_SIM_CONFIG``, else ``$SGLANG_SIM_CONFIG``, else
``~/.sim/config.json`` (gpu_count, gpu_dir, gpu_total_mib, gpu_name, uuids, pci_bus_ids, alloc_dir).
"""

from __future__ import annotations

import os
import sys
import time

INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
DRIVER_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                 "Make sure that the latest NVIDIA driver is installed and running.")
DEFAULT_CONTEXT_MIB = 512
DRIVER_VERSION = "570.133.20"
CUDA_VERSION = "12.8"

# canonical field -> (aliases, unit or None)
GPU_FIELDS = {
    "index": ((), None),
    "uuid": (("gpu_uuid",), None),
    "name": (("gpu_name",), None),
    "memory.used": ((), "MiB"),
    "memory.total": ((), "MiB"),
    "memory.free": ((), "MiB"),
    "utilization.gpu": ((), "%"),
    "pci.bus_id": (("gpu_bus_id",), None),
}
APP_FIELDS = {
    "pid": ((), None),
    "process_name": (("name",), None),
    "used_memory": (("used_gpu_memory",), "MiB"),
    "gpu_uuid": ((), None),
    "gpu_bus_id": ((), None),
    "gpu_name": ((), None),
}
APP_HEADER_NAMES = {"used_memory": "used_gpu_memory"}


class _JsonContext:
    """What the C scanner of ``json`` reads from a JSONDecoder: json.load's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def load_json(f) -> object:
    """``json.load(f)`` without importing ``json``: its decoder imports ``re`` (with ``enum``,
    ``functools`` and ``collections``), about 10 of this stand-in's 24 ms of CPU per call (Python 3.11,
    2026-12-06), and the test suite's hosts call it some 1,500 times. The C scanner is the one
    ``json.loads`` uses; a malformed document raises ``json.JSONDecodeError`` (a ValueError) as before."""
    text = f.read()
    try:
        import _json
    except ImportError:  # an interpreter without the accelerator: the module itself
        import json
        return json.loads(text)
    body = text.strip(" \t\n\r")
    try:
        value, end = _json.make_scanner(_JsonContext())(body, 0)
    except StopIteration:
        end, value = -1, None
    if end != len(body):
        import json
        return json.loads(text)  # raises the same error json.load would (only a malformed file gets here)
    return value


class UsageFailure(Exception):
    """Bad command line: message and exit code as real nvidia-smi gives them."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.message = message
        self.code = code


def load_config() -> dict:
    path = (os.environ.get("NVIDIA_SMI_SIM_CONFIG") or os.environ.get("SGLANG_SIM_CONFIG")
            or os.path.expanduser("~/.sim/config.json"))
    with open(path) as f:
        config = load_json(f)
    sim_dir = os.path.dirname(os.path.abspath(path))
    config.setdefault("alloc_dir", os.path.join(sim_dir, "alloc"))
    config.setdefault("driver_failed_flag", os.path.join(sim_dir, "driver_failed"))
    config.setdefault("phantom_file", os.path.join(sim_dir, "phantom.json"))
    config.setdefault("gpu_total_mib", 143771)
    config.setdefault("gpu_name", "NVIDIA H200")
    return config


def _boot_time() -> float:
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def _process_start(pid: int, boot: float, hz: float) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return boot + int(fields[19]) / hz  # field 22 (starttime), counted after "pid (comm)"


def scan_holders(gpu_dir: str, gpu_count: int) -> dict[int, set[int]]:
    """pid -> GPU indices whose device file the pid holds open (live processes we may inspect)."""
    wanted = {}
    for i in range(gpu_count):
        p = os.path.join(gpu_dir, f"nvidia{i}")
        wanted[p] = i
        wanted[os.path.realpath(p)] = i
    holders: dict[int, set[int]] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # PermissionError (not ours) or the process vanished
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            gpu = wanted.get(target)
            if gpu is not None:
                holders.setdefault(int(entry), set()).add(gpu)
    return holders


def _read_number(path: str, not_before: float | None) -> int | None:
    try:
        st = os.stat(path)
        # An alloc file older than the process belongs to an earlier process with the same pid.
        if not_before is not None and st.st_mtime + 1.0 < not_before:
            return None
        with open(path) as f:
            return int(f.read().strip() or "0")
    except (OSError, ValueError):
        return None


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    if argv0:
        return argv0
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "[Not Found]"


def _phantom(path: str | None, count: int) -> dict[int, int]:
    """GPU index -> MiB held by no process (the phantom.json knob); absent or unreadable: none."""
    if not path:
        return {}
    try:
        with open(path) as f:
            document = load_json(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict):
        return {}
    out = {}
    for key, value in document.items():
        if str(key).isdigit() and int(key) < count and isinstance(value, int) and value > 0:
            out[int(key)] = value
    return out


class GpuState:
    """What the simulated driver knows: per-GPU usage and the compute processes."""

    def __init__(self, config: dict):
        self.config = config
        self.count = int(config["gpu_count"])
        self.total = int(config["gpu_total_mib"])
        self.name = config["gpu_name"]
        self.uuids = list(config.get("uuids") or [f"GPU-{i:08x}-0000-0000-0000-000000000000"
                                                  for i in range(self.count)])
        self.bus_ids = list(config.get("pci_bus_ids") or [f"00000000:{0x18 + i:02X}:00.0"
                                                          for i in range(self.count)])
        self.used = [0] * self.count
        self.util = [0] * self.count
        self.apps: list[tuple[int, int, str, int]] = []  # (gpu, pid, name, MiB)
        self._scan()

    def _scan(self) -> None:
        holders = scan_holders(self.config["gpu_dir"], self.count)
        boot = _boot_time()
        hz = os.sysconf("SC_CLK_TCK")
        alloc_dir = self.config["alloc_dir"]
        for pid in sorted(holders):
            start = _process_start(pid, boot, hz)
            if start is None:
                continue  # vanished while we looked
            name = _process_name(pid)
            for gpu in sorted(holders[pid]):
                mib = _read_number(os.path.join(alloc_dir, f"{pid}.{gpu}"), start)
                mib = DEFAULT_CONTEXT_MIB if mib is None else max(0, mib)
                util = _read_number(os.path.join(alloc_dir, f"{pid}.{gpu}.util"), start) or 0
                self.used[gpu] += mib
                self.util[gpu] = max(self.util[gpu], min(100, max(0, util)))
                self.apps.append((gpu, pid, name, mib))
        for gpu, mib in _phantom(self.config.get("phantom_file"), self.count).items():
            self.used[gpu] += mib
        self.used = [min(u, self.total) for u in self.used]
        self.apps.sort()

    def gpu_value(self, field: str, i: int, units: bool) -> str:
        if field == "index":
            return str(i)
        if field == "uuid":
            return self.uuids[i]
        if field == "name":
            return self.name
        if field == "pci.bus_id":
            return self.bus_ids[i]
        if field == "utilization.gpu":
            return f"{self.util[i]} %" if units else str(self.util[i])
        mib = {"memory.used": self.used[i], "memory.total": self.total,
               "memory.free": self.total - self.used[i]}[field]
        return f"{mib} MiB" if units else str(mib)

    def app_value(self, field: str, app: tuple[int, int, str, int], units: bool) -> str:
        gpu, pid, name, mib = app
        if field == "pid":
            return str(pid)
        if field == "process_name":
            return name
        if field == "used_memory":
            return f"{mib} MiB" if units else str(mib)
        if field == "gpu_uuid":
            return self.uuids[gpu]
        if field == "gpu_bus_id":
            return self.bus_ids[gpu]
        return self.name


def _canonical(fields_arg: str, table: dict) -> list[str]:
    out = []
    for raw in fields_arg.split(","):
        name = raw.strip()
        for canonical, (aliases, _unit) in table.items():
            if name == canonical or name in aliases:
                out.append(canonical)
                break
        else:
            raise UsageFailure(f'Field "{name}" is not a valid field to query.', 2)
    if not out:
        raise UsageFailure(INVALID_ARGS)
    return out


def _parse_format(spec: str | None) -> tuple[bool, bool]:
    """--format value -> (header, units). Only csv exists, as in real nvidia-smi."""
    if spec is None:
        raise UsageFailure(INVALID_ARGS)
    parts = [p.strip() for p in spec.split(",")]
    if parts[0] != "csv" or any(p not in ("noheader", "nounits") for p in parts[1:]):
        raise UsageFailure(INVALID_ARGS)
    return "noheader" not in parts, "nounits" not in parts


def parse_args(argv: list[str]) -> dict:
    opts: dict[str, str | bool] = {}
    takes_value = {"--query-gpu": "query_gpu", "--query-compute-apps": "query_apps",
                   "--format": "format", "-i": "id", "--id": "id"}
    flags = {"-L": "list", "--list-gpus": "list", "-h": "help", "--help": "help"}
    k = 0
    while k < len(argv):
        arg = argv[k]
        key, eq, value = arg.partition("=")
        if key in takes_value and key != "-i":
            if not eq:
                k += 1
                if k >= len(argv):
                    raise UsageFailure(INVALID_ARGS)
                value = argv[k]
            opts[takes_value[key]] = value
        elif arg == "-i" or (arg.startswith("-i") and arg[2:].replace(",", "").isdigit()):
            if arg == "-i":
                k += 1
                if k >= len(argv):
                    raise UsageFailure(INVALID_ARGS)
                opts["id"] = argv[k]
            else:
                opts["id"] = arg[2:]
        elif arg in flags:
            opts[flags[arg]] = True
        else:
            raise UsageFailure(INVALID_ARGS)
        k += 1
    modes = [m for m in ("query_gpu", "query_apps", "list") if m in opts]
    if len(modes) > 1:
        raise UsageFailure(INVALID_ARGS)
    if "format" in opts and not {"query_gpu", "query_apps"} & set(modes):
        raise UsageFailure(INVALID_ARGS)
    return opts


def _selected(state: GpuState, id_arg: str | None) -> list[int]:
    if id_arg is None:
        return list(range(state.count))
    chosen = []
    for part in id_arg.split(","):
        part = part.strip()
        if part.isdigit() and int(part) < state.count:
            chosen.append(int(part))
        elif part in state.uuids:
            chosen.append(state.uuids.index(part))
        else:
            raise UsageFailure("No devices were found", 6)
    return chosen


def render_query_gpu(state: GpuState, fields: list[str], header: bool, units: bool,
                     gpus: list[int]) -> str:
    lines = []
    if header:
        lines.append(", ".join(f"{f} [{GPU_FIELDS[f][1]}]" if GPU_FIELDS[f][1] else f for f in fields))
    for i in gpus:
        lines.append(", ".join(state.gpu_value(f, i, units) for f in fields))
    return "".join(line + "\n" for line in lines)


def render_query_apps(state: GpuState, fields: list[str], header: bool, units: bool,
                      gpus: list[int]) -> str:
    lines = []
    if header:
        names = []
        for f in fields:
            label = APP_HEADER_NAMES.get(f, f)
            names.append(f"{label} [{APP_FIELDS[f][1]}]" if APP_FIELDS[f][1] else label)
        lines.append(", ".join(names))
    for app in state.apps:
        if app[0] in gpus:
            lines.append(", ".join(state.app_value(f, app, units) for f in fields))
    return "".join(line + "\n" for line in lines)


def render_list(state: GpuState, gpus: list[int]) -> str:
    return "".join(f"GPU {i}: {state.name} (UUID: {state.uuids[i]})\n" for i in gpus)


def render_table(state: GpuState, gpus: list[int]) -> str:
    bar = "+-----------------------------------------+------------------------+----------------------+"
    out = [time.strftime("%a %b %d %H:%M:%S %Y") + "       ",
           "+" + "-" * 89 + "+",
           f"| NVIDIA-SMI {DRIVER_VERSION:<22} Driver Version: {DRIVER_VERSION:<14} "
           f"CUDA Version: {CUDA_VERSION:<9}|",
           bar,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|=========================================+========================+======================|"]
    for i in gpus:
        busy = state.used[i] > 0
        mem = f"{state.used[i]}MiB / {state.total}MiB"
        out.append(f"| {i:>3}  {state.name:<31}On  | {state.bus_ids[i]:>18} Off |{'0':>21} |")
        out.append(f"| N/A   {'38C' if busy else '31C'}    P0 {'120W' if busy else '76W':>15} /  700W |"
                   f" {mem:>22} | {state.util[i]:>6}%      Default |")
        out.append("|                                         |                        |             Disabled |")
        out.append(bar)
    out += ["", "+" + "-" * 89 + "+",
            "| Processes:" + " " * 78 + "|",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|"]
    apps = [a for a in state.apps if a[0] in gpus]
    if not apps:
        out.append("|  No running processes found" + " " * 61 + "|")
    for gpu, pid, name, mib in apps:
        name = name if len(name) <= 35 else "..." + name[-32:]
        out.append(f"| {gpu:>4}   N/A  N/A {pid:>15}      C   {name:<35} {str(mib) + 'MiB':>10} |")
    out.append("+" + "-" * 89 + "+")
    return "\n".join(out) + "\n"


HELP = """NVIDIA System Management Interface -- v{driver} (SIMULATED: deployctl sandbox test double)

Supported here:
    nvidia-smi
    nvidia-smi -L
    nvidia-smi [-i ID] --query-gpu=index,uuid,name,memory.used,memory.total,memory.free,utilization.gpu,pci.bus_id --format=csv[,noheader][,nounits]
    nvidia-smi [-i ID] --query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id,gpu_name --format=csv[,noheader][,nounits]
"""


def _delay() -> None:
    try:
        with open(os.path.expanduser("~/.sim/query_delay_s")) as f:
            seconds = float(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if 0 < seconds <= 600:
        time.sleep(seconds)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_args(argv)
        if opts.get("help"):
            sys.stdout.write(HELP.format(driver=DRIVER_VERSION))
            return 0
        config = load_config()
        _delay()
        if os.path.exists(config["driver_failed_flag"]):
            sys.stdout.write(DRIVER_FAILED + "\n\n")
            return 9
        state = GpuState(config)
        gpus = _selected(state, opts.get("id"))
        if "query_gpu" in opts:
            header, units = _parse_format(opts.get("format"))
            fields = _canonical(opts["query_gpu"], GPU_FIELDS)
            sys.stdout.write(render_query_gpu(state, fields, header, units, gpus))
        elif "query_apps" in opts:
            header, units = _parse_format(opts.get("format"))
            fields = _canonical(opts["query_apps"], APP_FIELDS)
            sys.stdout.write(render_query_apps(state, fields, header, units, gpus))
        elif opts.get("list"):
            sys.stdout.write(render_list(state, gpus))
        else:
            sys.stdout.write(render_table(state, gpus))
        return 0
    except UsageFailure as exc:
        sys.stdout.write(exc.message + "\n")
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
