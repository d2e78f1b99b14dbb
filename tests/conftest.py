"""Shared pytest fixtures.

``sandbox``: three SIMULATED GPU hosts (sb1, sb2, sb3; a test double, see sandbox) for the
whole session: real sshd on 127.0.0.10-12, one Unix user each, 8 simulated H200s each. Skipped
with the reason when this machine cannot run it (not root, no /usr/sbin/sshd, no fuser...).

``clean_sandbox``: the same sandbox, every host reset first (its user's processes killed, HOME
rebuilt), for tests that start servers or change host state.

Several engineers run the suite on one machine: sessions take a machine-wide lock around the
sandbox (the hosts' addresses and user names are fixed), so a second session waits for the first
instead of colliding with it. The root is fixed too, so a session that crashed is cleaned up by
the next one (start_sandbox first stops what sandbox.json under the root records).

Parallel runs (pytest-xdist, ``-n auto`` in pyproject.toml): every xdist worker is a pytest
session of its own, and the sandbox has fixed addresses, users and a machine-wide lock, so every
test in tests/integration/ runs on one worker, as one work unit (``pytest_xdist_make_scheduler``
below); a test elsewhere that asks for a sandbox fixture fails, in serial runs too, naming the
directory it belongs in. The other tiers spread over the remaining workers one module at a time,
so a module-scoped fixture (a wheel build, a browser) is built once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SANDBOX_ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))
SANDBOX_HOSTS = ("sb1", "sb2", "sb3")
LOCK_WAIT_S = float(os.environ.get("DEPLOYCTL_TEST_SANDBOX_LOCK_WAIT_S", "600"))
#: .ci/run sets it: a machine that cannot run the sandbox fails the sandbox tests instead of
#: skipping them (a green CI that never ran the integration tests proves nothing)
REQUIRE_SANDBOX = os.environ.get("DEPLOYCTL_TEST_REQUIRE_SANDBOX") == "1"


#: the fixtures that reach the sandbox's fixed addresses, users or machine lock
SANDBOX_FIXTURES = frozenset({"sandbox_machine_lock", "sandbox", "clean_sandbox", "jump_sandbox"})
#: node ids start with the path from the rootdir (the clone), where pyproject.toml is
SANDBOX_DIR = "tests/integration/"


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs as a whole: the sandbox tier, or one test module."""
    return "sandbox" if nodeid.startswith(SANDBOX_DIR) else nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    # pytest-xdist's own --dist loadgroup reads a group written into item._nodeid, which pytest 9.2
    # no longer reads the node id from: the grouping is made here from the node id instead
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") == "each":
        return None

    class SandboxOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SandboxOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())) and work_unit(item.nodeid) != "sandbox":
            item.add_marker(pytest.mark.misplaced_sandbox_test)


@pytest.hookimpl(tryfirst=True)  # before any fixture is set up: never a second sandbox session
def pytest_runtest_setup(item):
    if item.get_closest_marker("misplaced_sandbox_test"):
        pytest.fail(f"a test that uses the sandbox belongs in {SANDBOX_DIR} (parallel runs keep that directory on "
                    "one worker: the sandbox's addresses, users and machine lock allow one session)", pytrace=False)


@pytest.fixture(scope="session")
def sandbox_machine_lock():
    """Held for the rest of the session by any test that creates sandbox users or addresses."""
    from sandbox.hosts import sandbox_unavailable_reason

    reason = sandbox_unavailable_reason()
    if reason and REQUIRE_SANDBOX:
        pytest.fail(f"sandbox unavailable: {reason} (DEPLOYCTL_TEST_REQUIRE_SANDBOX=1: CI must run these tests)")
    if reason:
        pytest.skip(f"sandbox unavailable: {reason}")
    from sandbox.machine_lock import MachineLockTimeout, machine_lock

    try:
        with machine_lock(LOCK_WAIT_S):
            yield
    except MachineLockTimeout as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def sandbox(sandbox_machine_lock):
    from sandbox.hosts import start_sandbox, stop_sandbox

    sb = start_sandbox(SANDBOX_ROOT, SANDBOX_HOSTS, gpus=8, stop_at_exit=True)
    try:
        yield sb
    finally:
        stop_sandbox(SANDBOX_ROOT)


JUMP_SANDBOX_ROOT = Path(os.environ.get("DEPLOYCTL_TEST_JUMP_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox-jump"))
#: a bastion and two GPU hosts behind it, on 127.0.0.30-32 (sb1-3 use .10-12, the demo .20+)
JUMP_SANDBOX_HOSTS = ("jump", "jt1", "jt2")
JUMP_ADDRESS_BASE = 30


@pytest.fixture(scope="session")
def jump_sandbox(sandbox_machine_lock):
    """A jump host and two targets behind it, 2 simulated GPUs each.

    sshd runs at LogLevel DEBUG: OpenSSH 9.2 at VERBOSE does not log forwarded direct-tcpip
    channels; DEBUG logs one ``server_request_direct_tcpip`` line per channel, which tests count.
    """
    from sandbox.hosts import start_sandbox, stop_sandbox

    sb = start_sandbox(JUMP_SANDBOX_ROOT, JUMP_SANDBOX_HOSTS, gpus=2, address_base=JUMP_ADDRESS_BASE,
                       stop_at_exit=True, log_level="DEBUG")
    try:
        yield sb
    finally:
        stop_sandbox(JUMP_SANDBOX_ROOT)


@pytest.fixture
def clean_sandbox(sandbox):
    sandbox.reset()
    return sandbox


@pytest.fixture(autouse=True)
def private_state_home(tmp_path_factory, monkeypatch):
    """deployctl's local state (history, local locks, nightly logs) per test, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
