"""nvidia-smi facts: the commands to run and strict parsers for their CSV output.

Each query runs as its own remote command. fuser (psmisc) prints the PIDs it found on stdout without
a newline and the names on stderr, so ``fuser -k /dev/nvidia*; nvidia-smi ...`` in one command (as
the hand-run restart procedure did) glues them onto the first CSV row: ``88882 88882 ... 888820, 0 MiB``. A lenient parser reads that as "GPU 0 free"; ours rejects any
row whose fields are not exactly what was asked for and quotes it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from deploy.errors import RemoteOutputError

GPU_FIELDS = ("index", "uuid", "memory.used", "memory.total", "utilization.gpu")
GPU_QUERY_COMMAND = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"

# process_name goes last: it is the only field that may itself contain ", ".
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
COMPUTE_APPS_COMMAND = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"

_NOT_AVAILABLE = ("[N/A]", "[Not Supported]", "N/A")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")


@dataclass(frozen=True)
class ComputeApp:
    gpu_uuid: str
    pid: int
    used_mib: int | None
    process_name: str


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    used_mib: int
    total_mib: int
    utilization_pct: int | None
    holders: tuple[ComputeApp, ...] = field(default=())

    def to_dict(self) -> dict:
        data = asdict(self)
        data["holders"] = [asdict(h) for h in self.holders]
        return data


def _int(value: str, what: str, line: str, source: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise RemoteOutputError(f"{source}: {what} is {value!r}, expected a non-negative integer, in line {line!r}")
    return int(value)


def _nvidia_smi_failed(output: str, exit_code: int, source: str) -> RemoteOutputError:
    text = output.strip().splitlines()
    detail = text[0] if text else "(no output)"
    return RemoteOutputError(f"{source}: nvidia-smi failed (exit code {exit_code}): {detail}")


def parse_gpu_rows(output: str, expected_gpus: int, *, source: str = "nvidia-smi") -> list[GpuRow]:
    """Parse GPU_QUERY_COMMAND output; indices must be exactly 0..expected_gpus-1."""
    rows: list[GpuRow] = []
    lines = [ln for ln in output.splitlines() if ln.strip()]
    if not lines:
        raise RemoteOutputError(f"{source}: nvidia-smi printed no GPU rows; expected {expected_gpus}")
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(GPU_FIELDS):
            raise RemoteOutputError(
                f"{source}: expected {len(GPU_FIELDS)} fields ({', '.join(GPU_FIELDS)}), "
                f"got {len(parts)} in line {line!r}"
            )
        index_s, uuid, used_s, total_s, util_s = parts
        index = _int(index_s, "index", line, source)
        if not _UUID.match(uuid):
            raise RemoteOutputError(f"{source}: uuid is {uuid!r}, expected GPU-..., in line {line!r}")
        used = _int(used_s, "memory.used", line, source)
        total = _int(total_s, "memory.total", line, source)
        if used > total:
            raise RemoteOutputError(f"{source}: memory.used {used} exceeds memory.total {total} in line {line!r}")
        util = None if util_s in _NOT_AVAILABLE else _int(util_s, "utilization.gpu", line, source)
        if util is not None and util > 100:
            raise RemoteOutputError(f"{source}: utilization.gpu {util} is over 100 in line {line!r}")
        rows.append(GpuRow(index, uuid, used, total, util))
    indices = [r.index for r in rows]
    if indices != list(range(expected_gpus)):
        raise RemoteOutputError(
            f"{source}: expected GPUs 0..{expected_gpus - 1} ({expected_gpus} configured), "
            f"nvidia-smi reported indices {indices}"
        )
    uuids = [r.uuid for r in rows]
    if len(set(uuids)) != len(uuids):
        raise RemoteOutputError(f"{source}: nvidia-smi reported the same uuid twice: {uuids}")
    return rows


def parse_compute_apps(output: str, *, source: str = "nvidia-smi") -> list[ComputeApp]:
    apps: list[ComputeApp] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", len(APP_FIELDS) - 1)]
        if len(parts) != len(APP_FIELDS):
            raise RemoteOutputError(
                f"{source}: expected {len(APP_FIELDS)} fields ({', '.join(APP_FIELDS)}) "
                f"in compute-apps line {line!r}"
            )
        uuid, pid_s, mem_s, name = parts
        if not _UUID.match(uuid):
            raise RemoteOutputError(f"{source}: gpu_uuid is {uuid!r}, expected GPU-..., in line {line!r}")
        pid = _int(pid_s, "pid", line, source)
        mem = None if mem_s in _NOT_AVAILABLE else _int(mem_s, "used_memory", line, source)
        apps.append(ComputeApp(uuid, pid, mem, name))
    return apps


def attach_holders(rows: list[GpuRow], apps: list[ComputeApp], *, source: str = "nvidia-smi") -> list[GpuRow]:
    by_uuid = {r.uuid: r for r in rows}
    for app in apps:
        if app.gpu_uuid not in by_uuid:
            raise RemoteOutputError(
                f"{source}: compute app pid {app.pid} is on GPU {app.gpu_uuid}, which the GPU query did not list"
            )
    return [
        GpuRow(r.index, r.uuid, r.used_mib, r.total_mib, r.utilization_pct,
               tuple(a for a in apps if a.gpu_uuid == r.uuid))
        for r in rows
    ]


def busy_gpus(rows: list[GpuRow], threshold_mib: int = 0) -> list[GpuRow]:
    return [r for r in rows if r.used_mib > threshold_mib]


def check_nvidia_smi(exit_code: int, stdout: str, stderr: str, source: str) -> None:
    if exit_code != 0:
        raise _nvidia_smi_failed(stdout + stderr, exit_code, source)


def read_gpus(conn, expected_gpus: int) -> list[GpuRow]:
    """Both queries, each in its own remote command, joined into rows with their holders."""
    source = conn.host.name
    gpu = conn.run(GPU_QUERY_COMMAND)
    check_nvidia_smi(gpu.exit_code, gpu.stdout, gpu.stderr, source)
    rows = parse_gpu_rows(gpu.stdout, expected_gpus, source=source)
    apps = conn.run(COMPUTE_APPS_COMMAND)
    check_nvidia_smi(apps.exit_code, apps.stdout, apps.stderr, source)
    return attach_holders(rows, parse_compute_apps(apps.stdout, source=source), source=source)
