"""nvidia-smi facts: the two queries deployctl sends, and strict parsers into pydantic models.

The queries are ``--query-gpu`` (one row per GPU: index, uuid, memory, utilisation) and
``--query-compute-apps`` (one row per process holding a GPU), both ``--format=csv,noheader,nounits``.
``gpu_status_command`` runs both in ONE remote command, each answer closed by a marker line that
carries the query's exit code and a per-call random tag (a process name cannot forge it), so
``gpu-status`` costs one exec channel per host and a failure of either query is reported as that
query's failure. The host-side poll of wait-gpus-free (host_ops.py watch-gpus) runs the same two
queries; its answers go through ``read_answers`` here, like gpu-status's.

Why strict: fuser (psmisc) prints the PIDs it found on stdout without a newline and the names on
stderr, so ``fuser -k /dev/nvidia*; nvidia-smi ...`` in one command (as the hand-run restart
procedure did) glues them onto the first CSV row: ``88882 88882 ... 888820, 0 MiB``. A lenient
parser reads that as "GPU 0 free"; ours rejects any row whose fields are not exactly what was asked
for and quotes it. Likewise a row with units (``0 MiB``: ``nounits`` lost), a header row, a driver
error (``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver``), ``No
devices were found``, duplicate or missing indices and more or fewer GPUs than configured are each
an error naming the host, never "free".
"""

from __future__ import annotations

import re
import secrets

from pydantic import BaseModel, ConfigDict

from deploy.base.errors import RemoteOutputError

GPU_FIELDS = ("index", "uuid", "memory.used", "memory.total", "utilization.gpu")
GPU_QUERY_COMMAND = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"

# process_name goes last: it is the only field that may itself contain ", ".
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
COMPUTE_APPS_COMMAND = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"

#: what nvidia-smi prints (even with ``nounits``) for a value the GPU or driver does not report:
#: ``[N/A]`` (drivers since about 440), ``[Not Supported]`` (older drivers, GeForce boards).
_NOT_AVAILABLE = ("[N/A]", "[Not Supported]", "N/A")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z/-]+$")
#: nvidia-smi's own failure messages (printed on stdout), recognised so the error says what happened
_KNOWN_FAILURES = (
    "NVIDIA-SMI has failed",
    "No devices were found",
    "Failed to initialize NVML",
    "Unable to determine the device handle",
    "Driver/library version mismatch",
    "Insufficient Permissions",
)


class _Fact(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ComputeApp(_Fact):
    """One ``--query-compute-apps`` row: a process holding GPU memory."""

    gpu_uuid: str
    pid: int
    #: ``[N/A]`` when the driver cannot attribute memory to the process (containers without the
    #: host PID namespace, WDDM)
    used_mib: int | None
    process_name: str


class GpuRow(_Fact):
    """One ``--query-gpu`` row, with the compute processes on that GPU once both queries are read."""

    index: int
    uuid: str
    used_mib: int
    total_mib: int
    utilization_pct: int | None
    holders: tuple[ComputeApp, ...] = ()

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


class GpuStatus(_Fact):
    """Both queries of one host, joined: every configured GPU with its holders."""

    gpus: list[GpuRow]

    def busy(self, threshold_mib: int = 0) -> list[GpuRow]:
        return busy_gpus(self.gpus, threshold_mib)


# -- the GPU rows ------------------------------------------------------------------------------------


def _int(value: str, what: str, line: str, source: str) -> int:
    if not re.fullmatch(r"[0-9]+", value):  # not \d: it matches non-ASCII digits int() accepts
        if value in _NOT_AVAILABLE:
            raise RemoteOutputError(f"{source}: nvidia-smi reports {what} as {value!r} (not available), "
                                    f"expected a whole number, in line {line!r}")
        raise RemoteOutputError(f"{source}: {what} is {value!r}, expected a non-negative integer, in line {line!r}")
    return int(value)


def _known_failure(lines: list[str]) -> str | None:
    return next((ln.strip() for ln in lines if any(ln.strip().startswith(f) for f in _KNOWN_FAILURES)), None)


def parse_gpu_rows(output: str, expected_gpus: int, *, source: str = "nvidia-smi") -> list[GpuRow]:
    """Parse GPU_QUERY_COMMAND output; indices must be exactly 0..expected_gpus-1, uuids distinct."""
    lines = [ln for ln in output.splitlines() if ln.strip()]
    if not lines:
        raise RemoteOutputError(f"{source}: nvidia-smi printed no GPU rows; expected {expected_gpus}")
    failure = _known_failure(lines)
    if failure is not None:
        raise RemoteOutputError(f"{source}: nvidia-smi failed: {failure} (expected {expected_gpus} GPU rows)")
    rows: list[GpuRow] = []
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
        rows.append(GpuRow(index=index, uuid=uuid, used_mib=used, total_mib=total, utilization_pct=util))
    _check_indices([r.index for r in rows], expected_gpus, source)
    uuids = [r.uuid for r in rows]
    if len(set(uuids)) != len(uuids):
        raise RemoteOutputError(f"{source}: nvidia-smi reported the same uuid twice: {uuids}")
    return rows


def _check_indices(indices: list[int], expected_gpus: int, source: str) -> None:
    if indices == list(range(expected_gpus)):
        return
    configured = f"expected GPUs 0..{expected_gpus - 1} ({expected_gpus} configured)"
    duplicates = sorted({i for i in indices if indices.count(i) > 1})
    missing = sorted(set(range(expected_gpus)) - set(indices))
    extra = sorted(set(indices) - set(range(expected_gpus)))
    if duplicates:
        why = f"index {duplicates} listed twice"
    elif len(indices) > expected_gpus or extra:
        why = f"{len(indices)} GPUs, more than configured (hosts[].gpus), extra indices {extra}"
    elif missing:
        why = f"{len(indices)} GPUs, fewer than configured: missing {missing}"
    else:
        why = "indices out of order"
    raise RemoteOutputError(f"{source}: {configured}, nvidia-smi reported indices {indices}: {why}")


# -- the compute processes ---------------------------------------------------------------------------


def parse_compute_apps(output: str, *, source: str = "nvidia-smi") -> list[ComputeApp]:
    """Parse COMPUTE_APPS_COMMAND output; no process at all is empty output (``noheader``)."""
    apps: list[ComputeApp] = []
    lines = [ln for ln in output.splitlines() if ln.strip()]
    failure = _known_failure(lines)
    if failure is not None:
        raise RemoteOutputError(f"{source}: nvidia-smi failed: {failure} (in the compute-apps query)")
    for line in lines:
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
        apps.append(ComputeApp(gpu_uuid=uuid, pid=pid, used_mib=mem, process_name=name))
    return apps


def attach_holders(rows: list[GpuRow], apps: list[ComputeApp], *, source: str = "nvidia-smi") -> list[GpuRow]:
    by_uuid = {r.uuid: r for r in rows}
    for app in apps:
        if app.gpu_uuid not in by_uuid:
            raise RemoteOutputError(
                f"{source}: compute app pid {app.pid} is on GPU {app.gpu_uuid}, which the GPU query did not list"
            )
    return [r.model_copy(update={"holders": tuple(a for a in apps if a.gpu_uuid == r.uuid)}) for r in rows]


def busy_gpus(rows: list[GpuRow], threshold_mib: int = 0) -> list[GpuRow]:
    return [r for r in rows if r.used_mib > threshold_mib]


# -- both queries ------------------------------------------------------------------------------------


def _nvidia_smi_failed(output: str, exit_code: int, source: str, what: str = "") -> RemoteOutputError:
    lines = [ln.strip() for ln in output.strip().splitlines() if ln.strip()]
    detail = _known_failure(lines) or (lines[0] if lines else "(no output)")
    hint = " (nvidia-smi is not installed or not on PATH)" if exit_code == 127 else ""
    return RemoteOutputError(f"{source}: nvidia-smi{what} failed (exit code {exit_code}){hint}: {detail[:300]}")


def check_nvidia_smi(exit_code: int, stdout: str, stderr: str, source: str, what: str = "") -> None:
    if exit_code != 0:
        raise _nvidia_smi_failed(stdout + stderr, exit_code, source, what)


#: one query's answer: (exit code, stdout, stderr)
Answer = tuple[int, str, str]


def read_answers(gpus: Answer, apps: Answer, expected_gpus: int, source: str) -> GpuStatus:
    """Both queries' answers -> every GPU with its holders, strictly (a failed query is reported as such)."""
    check_nvidia_smi(*gpus, source, " GPU query (--query-gpu)")
    rows = parse_gpu_rows(gpus[1], expected_gpus, source=source)
    check_nvidia_smi(*apps, source, " compute-apps query (--query-compute-apps)")
    apps_found = parse_compute_apps(apps[1], source=source)
    return GpuStatus(gpus=attach_holders(rows, apps_found, source=source))


def new_tag() -> str:
    """The per-call random part of gpu_status_command's marker lines."""
    return secrets.token_hex(8)


def _marker(tag: str, query: str) -> str:
    return f"deployctl-gpu-status-{tag} {query} exit"


def gpu_status_command(tag: str) -> str:
    """Both queries in one remote command. Each query's stderr joins its stdout (nvidia-smi prints its
    own failures on stdout; the shell's "not found" goes to stderr), and each answer is closed by
    ``\\n<marker> <exit code>\\n``: the leading newline keeps the marker on its own line even when
    the answer does not end in one, and is removed again by the parser."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", tag):
        raise ValueError(f"gpu-status tag must be lowercase hex, got {tag!r}")
    return (f"{GPU_QUERY_COMMAND} 2>&1; printf '\\n{_marker(tag, 'gpus')} %s\\n' \"$?\"; "
            f"{COMPUTE_APPS_COMMAND} 2>&1; printf '\\n{_marker(tag, 'apps')} %s\\n' \"$?\"")


def parse_gpu_status(exit_code: int, stdout: str, stderr: str, tag: str, expected_gpus: int,
                     source: str) -> GpuStatus:
    """The whole answer of ``gpu_status_command(tag)``: exactly two answers, each closed by its marker."""
    gpus_marker, apps_marker = re.escape(_marker(tag, "gpus")), re.escape(_marker(tag, "apps"))
    match = re.fullmatch(rf"(?s)(?P<gpus>.*)\n{gpus_marker} (?P<gpus_exit>\d+)\n"
                         rf"(?P<apps>.*)\n{apps_marker} (?P<apps_exit>\d+)\n", stdout)
    if match is None:
        seen = "the GPU query's end" if re.search(rf"\n{gpus_marker} \d+\n", stdout) else "no query's end"
        detail = (stderr.strip() or stdout.strip())[-300:]
        raise RemoteOutputError(
            f"{source}: gpu-status expected both nvidia-smi answers, each closed by its marker line; "
            f"saw {seen} (exit code {exit_code}): {detail!r}"
        )
    if exit_code != 0:
        raise RemoteOutputError(f"{source}: gpu-status command exited {exit_code}: {stderr.strip()[-300:]!r}")
    return read_answers((int(match["gpus_exit"]), match["gpus"], ""), (int(match["apps_exit"]), match["apps"], ""),
                        expected_gpus, source)


def read_gpus(conn, expected_gpus: int) -> list[GpuRow]:
    """Both queries in one remote command (one exec channel), joined into rows with their holders."""
    tag = new_tag()
    result = conn.run(gpu_status_command(tag))
    return parse_gpu_status(result.exit_code, result.stdout, result.stderr, tag, expected_gpus,
                            conn.host.name).gpus
