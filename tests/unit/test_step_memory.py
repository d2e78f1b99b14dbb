"""Typed step memory (deploy/steps/memory.py, issue 25) and the rollback memories built from it."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from deploy.config.models import Host, Run
from deploy.engine.records import HostReport
from deploy.base.errors import ServerDied
from deploy.facts.server import ServerState
from deploy.host.records import LastGood
from deploy.fleet import nodes
from deploy.engine.playbook import load_playbook
from deploy.steps.memory import StepMemory

HOSTS = [Host(name=n, address=f"10.0.0.{i}", state_dir="/var/lib/deployctl") for i, n in enumerate("ab", 1)]
RUN = Run(name="r", nodes=["a", "b"], base_model="/m", drafter="/d")


def test_a_misspelt_field_fails_on_the_first_write_never_a_silent_none():
    # issue 25: an untyped dict of ~22 string keys in 16 files; a misspelt key read back None
    memory = StepMemory()
    with pytest.raises(AttributeError):
        memory.drafter_fingerprnt = "ab"  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        memory.get("pid")  # type: ignore[attr-defined]
    assert memory.pid is None and memory.converged is False


def test_a_rollback_memory_carries_the_lock_the_baseline_and_the_record():
    held = object()
    memory = StepMemory(host_lock=held, gpu_baseline_mib={3: 512}, pid=7, converged=True, sglang_version="0.5.23")
    good = {"argv": ["python3"], "env_file": "/s/last-good.env"}
    rollback = memory.rollback_of(good)
    assert (rollback.rollback_record, rollback.host_lock, rollback.gpu_baseline_mib) == (good, held, {3: 512})
    assert rollback.journal is memory.journal  # one journal per host: the rollback's actions too
    # nothing else of the failed deployment leaks into the rollback (its pid, converge, version)
    blank = dataclasses.asdict(StepMemory())
    same = {k for k, v in dataclasses.asdict(rollback).items() if v != blank[k]}
    assert same == {"rollback_record", "host_lock", "gpu_baseline_mib"}


class FakeNode:
    """A node session as the group rollback uses it: its memory, a connection that reads the last
    good record, and run_steps recording the memory each rollback slice runs with."""

    def __init__(self, host: Host, rank: int):
        self.host, self.rank, self.run = host, rank, RUN
        self.memory = StepMemory(host_lock=object(), gpu_baseline_mib={0: 300 + rank})
        self.report = HostReport(host)
        self.conn = SimpleNamespace(run=lambda command, **kw: SimpleNamespace(stdout="{}"))
        self.seen: list[StepMemory] = []

    def run_steps(self, planned, memory, label, cancelled):
        self.seen.append(memory)
        if any(p.name == "launch" for p in planned):
            memory.pid = 1000 + self.rank
        return [], None, -1

    def died(self, failure, step, memory=None):
        return failure

    def server_state(self):
        return ServerState(1000 + self.rank, True, None, None, None)


def test_the_node_groups_rollback_memory_carries_gpu_baseline_mib_like_one_hosts(monkeypatch):
    # issue 25: fleet/nodes.py built each node's rollback memory by hand and dropped gpu_baseline_mib
    # (the memory the doctor found held before the stop): the rollback's wait-gpus-free waited for it
    sessions = [FakeNode(h, rank) for rank, h in enumerate(HOSTS)]
    goods = [LastGood.model_validate({"argv": ["python3", "--node-rank", str(r)], "env_file": None, "drafter_path": "/s/d",
                                      "node_group": {"id": "g", "rank": r, "nnodes": 2, "hosts": [h.name for h in HOSTS],
                                                     "dist_init_addr": "10.0.0.1:30001"}}) for r in range(2)]
    records = iter(goods)
    monkeypatch.setattr(nodes, "parse_record", lambda *a: next(records))
    monkeypatch.setattr(nodes, "matching_group", lambda found, names: (list(found), ""))
    phases: list = []
    nodes._roll_back_group(sessions, load_playbook("up"), ServerDied("rank 1 died"), phases, lambda *a: None, 2)
    for s, good in zip(sessions, goods, strict=True):
        assert s.seen, s.host.name
        for memory in s.seen:
            assert memory.gpu_baseline_mib == s.memory.gpu_baseline_mib and memory.rollback_record == good
            assert memory.host_lock is s.memory.host_lock
    assert "restored" in str(sessions[0].report.error)
