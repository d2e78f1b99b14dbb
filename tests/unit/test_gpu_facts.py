"""Table tests for the nvidia-smi parsers, from outputs captured on 8x H200 / RTX PRO 6000 hosts."""

import pytest

from deploy.errors import RemoteOutputError
from deploy.facts import gpus

UUIDS = [f"GPU-4f2c5c36-7f1e-2d4a-9a6b-1c2d3e4f5a{i:02d}" for i in range(8)]

HEALTHY = "\n".join(f"{i}, {UUIDS[i]}, 0, 143771, 0" for i in range(8)) + "\n"

BUSY = "\n".join(
    f"{i}, {UUIDS[i]}, {120387 if i == 3 else 0}, 143771, {97 if i == 3 else 0}" for i in range(8)
) + "\n"

BUSY_APPS = f"{UUIDS[3]}, 88882, 120380, /usr/bin/python3\n"

# The hand-run procedure: `fuser -k /dev/nvidia*` (psmisc prints PIDs on stdout, no newline) chained
# before nvidia-smi in one command.
SEED_GLUED = "88882 88882 88882 88882 88882 88882 88882 88882 88882 888820, 0 MiB\n1, 0 MiB\n"

DRIVER_FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def test_healthy_host_parses_all_free():
    rows = gpus.parse_gpu_rows(HEALTHY, 8)
    assert [r.index for r in rows] == list(range(8))
    assert all(r.used_mib == 0 and r.total_mib == 143771 for r in rows)
    assert gpus.busy_gpus(rows) == []


def test_busy_gpu_is_reported_with_its_holder():
    rows = gpus.attach_holders(gpus.parse_gpu_rows(BUSY, 8), gpus.parse_compute_apps(BUSY_APPS))
    busy = gpus.busy_gpus(rows)
    assert [r.index for r in busy] == [3]
    assert busy[0].utilization_pct == 97
    assert busy[0].holders[0].pid == 88882
    assert busy[0].holders[0].process_name == "/usr/bin/python3"
    assert gpus.busy_gpus(rows, threshold_mib=200000) == []


def test_seed_glued_line_is_an_error_not_free():
    with pytest.raises(RemoteOutputError) as err:
        gpus.parse_gpu_rows(SEED_GLUED, 8, source="kimi-a")
    assert "kimi-a" in str(err.value)
    assert "888820" in str(err.value)


@pytest.mark.parametrize(
    "output, expected, fragment",
    [
        ("\n".join(f"{i}, {UUIDS[i]}, 0, 143771, 0" for i in range(7)), 8, "indices [0, 1, 2, 3, 4, 5, 6]"),
        ("\n".join(f"{i}, {UUIDS[i]}, 0, 143771, 0" for i in range(8)), 4, "expected GPUs 0..3"),
        ("\n".join(f"{i}, {UUIDS[i]}, 0, 143771, 0" for i in (0, 1, 2, 3, 5, 4, 6, 7)), 8, "indices"),
        (f"0, {UUIDS[0]}, 0 MiB, 143771 MiB, 0 %", 1, "'0 MiB'"),  # units were not switched off
        (f"0, {UUIDS[0]}, 0, 143771", 1, "expected 5 fields"),
        (f"0, {UUIDS[0]}, 0, 143771, 0, 7", 1, "got 6"),
        (f"0, not-a-uuid, 0, 143771, 0", 1, "uuid"),
        (f"0, {UUIDS[0]}, 200000, 143771, 0", 1, "exceeds"),
        (f"0, {UUIDS[0]}, -1, 143771, 0", 1, "memory.used"),
        ("", 8, "no GPU rows"),
        ("No devices were found\n", 8, "got 1"),
        (f"0, {UUIDS[0]}, 0, 143771, 0\n1, {UUIDS[0]}, 0, 143771, 0", 2, "same uuid"),
    ],
)
def test_malformed_gpu_rows_are_errors_quoting_the_problem(output, expected, fragment):
    with pytest.raises(RemoteOutputError) as err:
        gpus.parse_gpu_rows(output, expected)
    assert fragment in str(err.value)


def test_utilization_not_available_is_accepted_as_unknown():
    rows = gpus.parse_gpu_rows(f"0, {UUIDS[0]}, 0, 143771, [N/A]\n", 1)
    assert rows[0].utilization_pct is None


def test_compute_apps_empty_and_process_names_with_commas():
    assert gpus.parse_compute_apps("") == []
    apps = gpus.parse_compute_apps(f"{UUIDS[0]}, 12, [N/A], /opt/my, odd/python3\n")
    assert apps[0].process_name == "/opt/my, odd/python3"
    assert apps[0].used_mib is None


@pytest.mark.parametrize(
    "line", ["No running processes found", f"{UUIDS[0]}, abc, 10, python3", f"GPU, 1, 10, python3"]
)
def test_compute_apps_malformed(line):
    with pytest.raises(RemoteOutputError):
        gpus.parse_compute_apps(line + "\n")


def test_holder_on_unknown_gpu_is_an_error():
    rows = gpus.parse_gpu_rows(HEALTHY, 8)
    with pytest.raises(RemoteOutputError, match="did not list"):
        gpus.attach_holders(rows, gpus.parse_compute_apps(f"GPU-ffff, 1, 10, python3\n"))


def test_nvidia_smi_failure_is_reported_with_its_message():
    with pytest.raises(RemoteOutputError) as err:
        gpus.check_nvidia_smi(9, DRIVER_FAILED, "", "kimi-a")
    assert "exit code 9" in str(err.value) and "couldn't communicate" in str(err.value)
    gpus.check_nvidia_smi(0, HEALTHY, "", "kimi-a")


def test_queries_are_separate_commands_never_chained():
    for command in (gpus.GPU_QUERY_COMMAND, gpus.COMPUTE_APPS_COMMAND):
        assert ";" not in command and "&&" not in command and "fuser" not in command
        assert command.endswith("--format=csv,noheader,nounits")
