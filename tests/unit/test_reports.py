"""Reports say what failed: a reachable host whose nvidia-smi failed is not "unreachable"; a
successful host has exit_code 0 in JSON (not null)."""

from __future__ import annotations

import io

from deploy.render import report as render
from deploy.config.models import Host
from deploy.base.errors import ConnectionFailed, RemoteOutputError
from deploy.facts.gpus import GpuRow
from deploy.engine.fanout import HostOutcome
from deploy.engine.records import HostReport, StepRecord

A = Host(name="gpu-a", address="10.0.0.1")
B = Host(name="gpu-b", address="10.0.0.2")
C = Host(name="gpu-c", address="10.0.0.3")
OUTCOMES = [
    HostOutcome(A, value=[GpuRow(index=0, uuid="GPU-0", used_mib=0, total_mib=81559, utilization_pct=0)]),
    HostOutcome(B, error=RemoteOutputError("gpu-b: nvidia-smi failed (exit code 9): NVIDIA-SMI has failed")),
    HostOutcome(C, error=ConnectionFailed("gpu-c (root@10.0.0.3:22): cannot connect: refused")),
]


def test_gpu_status_text_names_what_failed():
    out = io.StringIO()
    render.gpu_status_tables(OUTCOMES, render.console(out))
    text = out.getvalue()
    b_line = next(ln for ln in text.splitlines() if ln.startswith("gpu-b"))
    c_line = next(ln for ln in text.splitlines() if ln.startswith("gpu-c"))
    assert "GPU QUERY FAILED (host reachable)" in b_line and "UNREACHABLE" not in b_line
    assert "nvidia-smi failed (exit code 9)" in text
    assert "UNREACHABLE" in c_line


def test_gpu_status_json_exit_codes():
    hosts = render.gpu_status_document(OUTCOMES)["hosts"]
    assert [h["exit_code"] for h in hosts] == [0, 5, 4]
    assert [h.get("reachable") for h in hosts] == [None, True, False]


def test_playbook_report_exit_code_is_0_on_success():
    ok = HostReport(A, steps=[StepRecord("launch", "ok")]).to_dict()
    failed = HostReport(B, error=RemoteOutputError("x")).to_dict()
    assert ok["exit_code"] == 0 and ok["ok"] is True
    assert failed["exit_code"] == 5
