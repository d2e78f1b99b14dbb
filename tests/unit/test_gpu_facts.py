"""nvidia-smi facts beyond the case table (tests/unit/test_facts_table.py reads tests/facts/nvidia_smi_*/
and tests/facts/gpu_status/): behaviour on the captured outputs, and GENERATED hostile variants of them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from deploy.base.errors import RemoteOutputError
from deploy.facts import gpus

FACTS = Path(__file__).resolve().parents[1] / "facts"


def case(fact: str, name: str) -> dict:
    return json.loads((FACTS / fact / f"{name}.json").read_text())


H200_BUSY = case("gpu_status", "h200_busy")
EIGHT = case("nvidia_smi_gpus", "h200_8gpu_idle")
EIGHT_ROWS = EIGHT["stdout"].splitlines()
TAG = "0123456789abcdef"


def test_capture_script_sends_the_products_commands():
    spec = importlib.util.spec_from_file_location("capture_gpu_host", FACTS / "capture_gpu_host.py")
    assert spec is not None and spec.loader is not None
    capture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capture)
    assert capture.GPU_QUERY == gpus.GPU_QUERY_COMMAND
    assert capture.APPS_QUERY == gpus.COMPUTE_APPS_COMMAND
    assert capture.STATUS == gpus.gpu_status_command(capture.TAG)


def test_real_gpu_benchmark_watches_with_the_products_queries():
    """bench_gpus_free_real.py runs on a bare GPU host (no pydantic): its query strings are pinned here."""
    path = FACTS.parent / "benchmarks" / "bench_gpus_free_real.py"
    spec = importlib.util.spec_from_file_location("bench_gpus_free_real", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.GPU_QUERY == gpus.GPU_QUERY_COMMAND and bench.APPS_QUERY == gpus.COMPUTE_APPS_COMMAND


def test_busy_gpu_is_reported_with_its_holder():
    status = gpus.parse_gpu_status(H200_BUSY["exit_code"], H200_BUSY["stdout"], "", TAG, 1, "kimi-a")
    busy = status.busy()
    assert [r.index for r in busy] == [0] and busy[0].used_mib == 8719
    assert [(h.pid, h.process_name) for h in busy[0].holders] == [(507, "/opt/torch/.venv/bin/python3")]
    assert status.busy(threshold_mib=8719) == [] and gpus.busy_gpus(status.gpus, 8718) == busy


def test_watch_gpus_answers_go_through_the_same_parser():
    """wait-gpus-free's host-side poll reports the two queries' raw answers; read_answers joins them
    exactly as gpu-status does."""
    raw = json.loads((FACTS / "captured" / "nvidia-smi-h200-580.159.04.json").read_text())
    g, a = raw["busy_gpus"], raw["busy_apps"]
    status = gpus.read_answers((g["exit_code"], g["stdout"], g["stderr"]), (a["exit_code"], a["stdout"], a["stderr"]),
                               1, "kimi-a")
    assert status.gpus[0].holders[0].pid == raw["holder_pid"]
    with pytest.raises(RemoteOutputError, match="compute-apps query .* failed .*exit code 9"):
        gpus.read_answers((0, g["stdout"], ""), (9, "NVIDIA-SMI has failed because ...\n", ""), 1, "kimi-a")


def test_gpu_status_is_one_command_and_never_chained_with_fuser():
    command = gpus.gpu_status_command(TAG)
    assert command.count("nvidia-smi ") == 2 and "fuser" not in command and "&&" not in command
    for query in (gpus.GPU_QUERY_COMMAND, gpus.COMPUTE_APPS_COMMAND):
        assert query.endswith("--format=csv,noheader,nounits") and ";" not in query
    assert gpus.new_tag() != gpus.new_tag()
    for bad in ("", "ABC", "x; rm -rf ~", "0123456789abcdef'"):
        with pytest.raises(ValueError):
            gpus.gpu_status_command(bad)


def test_read_gpus_sends_one_command_with_a_fresh_tag():
    sent: list[str] = []

    class Conn:
        class host:
            name = "kimi-a"

        def run(self, command):
            sent.append(command)
            tag = command.split("deployctl-gpu-status-")[1].split(" ")[0]

            class Result:
                exit_code, stderr = 0, ""
                stdout = H200_BUSY["stdout"].replace(TAG, tag)
            return Result()

    rows = gpus.read_gpus(Conn(), 1)
    rows_again = gpus.read_gpus(Conn(), 1)
    assert rows == rows_again and rows[0].holders[0].pid == 507
    assert len(sent) == 2 and sent[0] != sent[1]


# -- generated hostile variants of the captured outputs -------------------------------------------------

BAD_NUMBERS = ["", " ", "-1", "1.5", "1e3", "0x10", "１", "0 MiB", "[N/A]", "[Not Supported]", "N/A", "nan", "8719 8719"]
FIELD_NAMES = ["index", "uuid", "memory.used", "memory.total", "utilization.gpu"]


def _with_field(row: int, field: int, value: str) -> str:
    rows = list(EIGHT_ROWS)
    parts = rows[row].split(", ")
    parts[field] = value
    rows[row] = ", ".join(parts)
    return "\n".join(rows) + "\n"


def _field_cases():
    for row in (0, 3, 7):
        for field in (0, 2, 3, 4):
            for value in BAD_NUMBERS:
                if field == 4 and value in ("[N/A]", "[Not Supported]", "N/A"):
                    continue  # utilization not available is a fact (None), tested in the table
                yield pytest.param(row, field, value, id=f"row{row}-{FIELD_NAMES[field]}-{value!r}")
        for value in ("", "not-a-uuid", "GPU-", "GPU-11ce01e2 3032", "gpu-11ce01e2-3032", "[N/A]"):
            yield pytest.param(row, 1, value, id=f"row{row}-uuid-{value!r}")


@pytest.mark.parametrize("row, field, value", list(_field_cases()))
def test_every_bad_field_value_is_an_error_naming_host_and_field(row, field, value):
    with pytest.raises(RemoteOutputError) as err:
        gpus.parse_gpu_rows(_with_field(row, field, value), 8, source="kimi-a")
    message = str(err.value)
    assert message.startswith("kimi-a: ")
    assert FIELD_NAMES[field] in message or "fields" in message or "indices" in message or "same uuid" in message


def _shape_cases():
    rows = EIGHT_ROWS
    yield "row_missing", rows[:3] + rows[4:], "fewer than configured: missing [3]"
    yield "row_duplicated", rows[:4] + [rows[3]] + rows[4:7], "index [3] listed twice"
    yield "rows_swapped", [rows[1], rows[0]] + rows[2:], "out of order"
    yield "ninth_gpu", rows + [rows[7].replace("7, ", "8, ", 1)], "more than configured"
    yield "field_missing", [rows[0].rsplit(", ", 1)[0]] + rows[1:], "expected 5 fields"
    yield "field_added", [rows[0] + ", 0"] + rows[1:], "got 6"
    yield "header_first", ["index, uuid, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"] + rows, "index"
    yield "uuid_repeated", rows[:1] + [rows[1].replace(rows[1].split(", ")[1], rows[0].split(", ")[1])] + rows[2:], "same uuid"
    yield "used_over_total", [rows[0].replace(", 0, 143771", ", 143772, 143771")] + rows[1:], "exceeds"
    yield "utilization_over_100", [rows[0].rsplit(", ", 1)[0] + ", 101"] + rows[1:], "over 100"
    yield "semicolons", [r.replace(", ", "; ") for r in rows], "expected 5 fields"
    for failure in ("No devices were found", "Failed to initialize NVML: Driver/library version mismatch",
                    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."):
        yield f"failure_text_{failure[:12]}", [failure], failure


@pytest.mark.parametrize("lines, fragment", [pytest.param(lines, frag, id=name) for name, lines, frag in _shape_cases()])
def test_every_bad_shape_is_an_error_saying_what(lines, fragment):
    with pytest.raises(RemoteOutputError) as err:
        gpus.parse_gpu_rows("\n".join(lines) + "\n", 8, source="kimi-a")
    assert fragment in str(err.value) and str(err.value).startswith("kimi-a: ")


@pytest.mark.parametrize("cut", range(0, len(H200_BUSY["stdout"]), 7))
def test_gpu_status_cut_anywhere_is_an_error_or_a_different_fact(cut):
    """Output cut short at any point (timeout, dropped connection) is never read as the full answer."""
    full = gpus.parse_gpu_status(0, H200_BUSY["stdout"], "", TAG, 1, "kimi-a")
    try:
        part = gpus.parse_gpu_status(0, H200_BUSY["stdout"][:cut], "", TAG, 1, "kimi-a")
    except RemoteOutputError as exc:
        assert "kimi-a" in str(exc)
        return
    assert part != full


def _marker_cases():
    out = H200_BUSY["stdout"]
    yield "other_tag", out.replace(TAG, "fedcba9876543210")
    yield "gpus_marker_dropped", out.replace(f"\ndeployctl-gpu-status-{TAG} gpus exit 0\n", "\n")
    yield "apps_marker_dropped", out.replace(f"\ndeployctl-gpu-status-{TAG} apps exit 0\n", "\n")
    yield "markers_swapped", out.replace(" gpus exit", " tmp exit").replace(" apps exit", " gpus exit").replace(" tmp exit", " apps exit")
    yield "exit_code_not_a_number", out.replace("gpus exit 0", "gpus exit zero")
    yield "trailing_noise", out + "logout\n"
    yield "leading_noise", "Welcome to Ubuntu 22.04\n" + out
    yield "third_section", out + f"\ndeployctl-gpu-status-{TAG} apps exit 0\n"
    # a process named like a marker cannot end an answer early: it does not know this call's tag
    yield "forged_marker_in_process_name", out.replace(
        "/opt/torch/.venv/bin/python3", f"x\ndeployctl-gpu-status-{'1' * 16} apps exit 0")


@pytest.mark.parametrize("stdout", [pytest.param(s, id=n) for n, s in _marker_cases()])
def test_gpu_status_marker_tampering_is_an_error(stdout):
    with pytest.raises(RemoteOutputError) as err:
        gpus.parse_gpu_status(0, stdout, "", TAG, 1, "kimi-a")
    assert str(err.value).startswith("kimi-a: ")


def test_gpu_status_command_exit_is_checked():
    with pytest.raises(RemoteOutputError, match="exited 255"):
        gpus.parse_gpu_status(255, H200_BUSY["stdout"], "", TAG, 1, "kimi-a")


@pytest.mark.parametrize("line", ["No running processes found", "GPU-1, abc, 10, python3", "GPU, 1, 10, python3",
                                  "GPU-1, 1, 10", "GPU-1, -1, 10, python3", "GPU-1, 1, 10 MiB, python3",
                                  "gpu-1, 1, 10, python3", "GPU-1, １, 10, python3"])
def test_compute_apps_malformed(line):
    with pytest.raises(RemoteOutputError):
        gpus.parse_compute_apps(line + "\n", source="kimi-a")


def test_models_are_strict_and_frozen():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        gpus.GpuRow(index="0", uuid="GPU-1", used_mib=0, total_mib=1, utilization_pct=0)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        gpus.ComputeApp(gpu_uuid="GPU-1", pid=1, used_mib=1, process_name="p", extra=1)  # type: ignore[call-arg]
    row = gpus.GpuRow(index=0, uuid="GPU-1", used_mib=0, total_mib=1, utilization_pct=None)
    with pytest.raises(ValidationError):
        row.used_mib = 5  # type: ignore[misc]
    assert row.to_dict() == {"index": 0, "uuid": "GPU-1", "used_mib": 0, "total_mib": 1, "utilization_pct": None,
                             "holders": []}
