"""Issue 42: what a first deploy prints on a fresh host reads as progress, not as an error.

A roll behind the router probes each batch's hosts before it drains them (fleet/rolling.py
``_unchanged``: the doctor's read, then the drafter's fingerprint from the host's key fixer). On a
fresh host the fixer is not uploaded yet, and the probe printed python's "can't open file
.../helpers/fixer.pyz" as "not checked: ... failed". The doctor's read already says which helpers
are there: without the fixer the host is redeployed (ensure-helper uploads it) with a plain line,
and a fixer that is there but fails still shows its error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.base.errors import RemoteOutputError
from deploy.config import load_config
from deploy.fleet import rolling

REPO = Path(__file__).resolve().parents[2]
CANT_OPEN = ("python3: can't open file '/var/lib/deployctl/helpers/fixer.pyz': "
             "[Errno 2] No such file or directory\n")


class FakeConnection:
    """Answers the probe's commands: the doctor's read (a stand-in value: facts_of is faked too) and
    the fingerprint call, which fails as python fails on a missing file."""

    def __init__(self, sent: list[str]):
        self.sent = sent
        self.endpoint = SimpleNamespace(hostname=SimpleNamespace(value="10.1.230.174"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, command: str, timeout=None):
        self.sent.append(command)
        if "--fingerprint" in command:
            return SimpleNamespace(exit_code=2, stdout="", stderr=CANT_OPEN)
        return SimpleNamespace(exit_code=0, stdout="{}", stderr="")


@pytest.fixture
def probe(monkeypatch):
    """``_unchanged`` on the example config's host, the doctor's read reporting ``helpers``."""
    config = load_config(REPO / "configs" / "kimi-k25-eagle3.yaml")
    [run] = config.runs
    [host] = config.hosts_of(run)
    sent: list[str] = []
    state = SimpleNamespace(config=config, run=run, jumps=None, stamp="20261204T000000Z")
    facts = SimpleNamespace(run_state=object(), python=SimpleNamespace(version="3.12.3"))
    sglang = SimpleNamespace(version="0.5.23")
    monkeypatch.setattr("deploy.ssh.transport.HostConnection", lambda *a, **k: FakeConnection(sent))
    monkeypatch.setattr("deploy.facts.doctor.facts_of", lambda result, host, run: (facts, sglang, None))

    def with_helpers(helpers):
        snapshot = SimpleNamespace(helpers=helpers, server=None)
        monkeypatch.setattr("deploy.facts.server.snapshot_of", lambda *a: snapshot)
        return rolling._unchanged(state, host), sent

    return with_helpers


def test_a_fresh_host_without_the_fixer_is_redeployed_with_a_plain_line(probe):
    (verdict, why), sent = probe({"host_ops.py": None, "fixer.pyz": None, "drafter_swap.py": None})
    assert verdict == "redeploy"
    assert why == "fixer not on the host yet; uploading it with the redeploy"
    assert not [c for c in sent if "--fingerprint" in c]  # nothing asked of a fixer that is not there
    assert "can't open" not in why and "fail" not in why and "error" not in why


def test_a_fixer_that_is_there_but_fails_still_shows_its_error(probe):
    with pytest.raises(RemoteOutputError) as failed:
        probe({"host_ops.py": "a" * 64, "fixer.pyz": "b" * 64, "drafter_swap.py": "c" * 64})
    assert "the drafter fingerprint failed (exit 2)" in str(failed.value) and "can't open file" in str(failed.value)


@pytest.mark.parametrize("helpers, expected", [
    ({}, "fixer not on the host yet; uploading it with the redeploy"),
    ({"fixer.pyz": None}, "fixer not on the host yet; uploading it with the redeploy"),
    ({"fixer.pyz": "0" * 64}, None),
])
def test_fixer_not_uploaded(helpers, expected):
    assert rolling.fixer_not_uploaded(helpers) == expected
