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

Parallel runs (pytest-xdist, ``-n auto`` in pyproject.toml; issue 26): every xdist worker is a
pytest session of its own. A sandbox has fixed addresses, users and a root, so there are four
**slots** (``SLOTS``: other addresses, user prefix, roots and lock each), and a session takes the
first free one (``any_slot_lock``). tests/integration/ is split into four work units
(``SANDBOX_UNITS``), each run on one worker as a whole (``pytest_xdist_make_scheduler`` below), so
the units run side by side on their own slots; a test elsewhere that asks for a sandbox fixture
fails, in serial runs too, naming the directory it belongs in. The other tiers spread over the
workers one module at a time, so a module-scoped fixture (a wheel build, a browser) is built once.
``pytest_xdist_auto_num_workers`` gives every unit a worker and the pure tiers the cores but one
(at least one): the sandbox units spend most of their time waiting on their hosts (a roll waits
out smg's drain settle, a server its load), so four of them share two cores well.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

#: where the suite's processes cache bytecode when the environment says not to write it beside the
#: sources (PYTHONDONTWRITEBYTECODE=1, common in containers and set on this project's machines)
PYCACHE_PREFIX = Path(__file__).resolve().parents[1] / ".pycache"


def _cache_bytecode_outside_the_sources() -> None:
    """Under PYTHONDONTWRITEBYTECODE every process compiles every module it imports, every time: the
    five xdist workers rewrite and compile all test modules (6.8 s each, 2.6 s from the cache), each
    deployctl, sandbox or helper child compiles the deploy package again (70 ms per start). The user's
    wish is kept where it matters, nothing is written beside the sources: the cache goes to one
    ignored directory of the clone (PYTHONPYCACHEPREFIX, Python 3.8+; pytest's assertion rewriter
    honours it too). The children inherit it: the xdist workers are started after this conftest is
    imported. Measured: the unit and hostile tiers, 212 s of CPU without a cache, 170 s with it
    (docs/testing.md)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE_PREFIX)
    sys.pycache_prefix = str(PYCACHE_PREFIX)
    sys.dont_write_bytecode = False


_cache_bytecode_outside_the_sources()

SANDBOX_ROOT = Path(os.environ.get("DEPLOYCTL_TEST_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox"))
JUMP_SANDBOX_ROOT = Path(os.environ.get("DEPLOYCTL_TEST_JUMP_SANDBOX_ROOT", "/var/tmp/deployctl-test-sandbox-jump"))
SANDBOX_HOSTS = ("sb1", "sb2", "sb3")
LOCK_WAIT_S = float(os.environ.get("DEPLOYCTL_TEST_SANDBOX_LOCK_WAIT_S", "600"))
#: .ci/run sets it: a machine that cannot run the sandbox fails the sandbox tests instead of
#: skipping them (a green CI that never ran the integration tests proves nothing)
REQUIRE_SANDBOX = os.environ.get("DEPLOYCTL_TEST_REQUIRE_SANDBOX") == "1"


#: the fixtures that reach the sandbox's fixed addresses, users or machine lock
SANDBOX_FIXTURES = frozenset({"sandbox_machine_lock", "sandbox_slot", "sandbox", "clean_sandbox", "jump_sandbox"})
#: node ids start with the path from the rootdir (the clone), where pyproject.toml is
SANDBOX_DIR = "tests/integration/"


#: every command on the tests' hosts imports the stand-in SGLang in 0.2 s, not a real install's 2.5 s
#: (issue 26): nightly's gate runs bench_serving 12 times per host, each a fresh `import sglang`,
#: and 2.3 s of those were a third of a nightly test. The launches had it already (helpers.py
#: TEST_LAUNCH_ENV); the demo and the benchmarks (docs/benchmarks.md) keep the stand-in's 2.5 s.
HOST_SIM_ENV = {"SGLANG_SIM_IMPORT_SECONDS": "0.2"}

#: the integration tier's work units, one xdist worker and one sandbox slot each: a unit lists
#: files, tests ("file.py::test_name") or parametrized cases ("...::test_name[smg]"), the longest
#: selector naming a test deciding; a file nobody lists lands in unit 0. Chosen by the tests'
#: measured durations (docs/testing.md: the units take about as long; re-balance when one grows).
SANDBOX_UNITS: tuple[tuple[str, ...], ...] = (
    ("test_fleet.py", "test_reliability.py"),
    ("test_fleet.py::test_up_with_router_reaches_every_replica_rolls_with_no_failed_request_and_down_stops_all"
     "[sglang-router]",
     "test_fleet.py::test_an_unchanged_replica_stays_in_the_router_and_nightly_rolls_one_at_a_time_and_converges",
     "test_safe_redeploy.py", "test_lifecycle.py", "test_status.py",
     "test_drafter_swap.py::test_behind_a_router_a_swap_is_drained_first_and_swapped_in_place"),
    ("test_fleet_network.py", "test_drafter_swap.py", "test_proxyjump.py",
     "test_canary.py::test_a_canary_worse_on_live_traffic_is_rolled_back_and_a_better_one_promoted[smg]",
     "test_safe_redeploy.py::test_bad_new_drafter_rolls_back_to_the_last_good_one"),
    ("test_canary.py::test_a_canary_worse_on_live_traffic_is_rolled_back_and_a_better_one_promoted[sglang-router]",
     "test_plan_is_run.py", "test_nightly_truth.py", "test_doctor.py", "test_doctor_silent.py",
     "test_sandbox.py", "test_hostile_round3.py", "test_remote_fix.py", "test_ssh_trust.py",
     "test_fleet_shared_router_host.py", "test_gpu_status.py"),
)


def sandbox_unit(test: str) -> int:
    """The unit of ``test`` (its node id after tests/integration/): its longest selector's."""
    named = [(len(selector), index) for index, selectors in enumerate(SANDBOX_UNITS) for selector in selectors
             if test == selector or test.startswith((selector + "::", selector + "["))]
    return max(named)[1] if named else 0


@dataclass(frozen=True)
class Slot:
    """One sandbox's addresses, users, roots and lock: slots run side by side without meeting."""

    index: int
    address_base: int        # sb1-3 on 127.0.0.(base)..(base+2)
    jump_address_base: int   # jump, jt1, jt2
    user_prefix: str
    root: Path
    jump_root: Path

    @property
    def stop_test_address_base(self) -> int:
        """A throw-away one-host sandbox (test_sandbox.py's stop test)."""
        return 60 + self.index


#: slot 0: the addresses, users and roots the suite always had (the demo is on .20+, user dsb-demo1)
SLOTS = (
    Slot(0, 10, 30, "dsb-", SANDBOX_ROOT, JUMP_SANDBOX_ROOT),
    *(Slot(i, base, base + 10, f"dsb{i}-", SANDBOX_ROOT.with_name(f"{SANDBOX_ROOT.name}-s{i}"),
           JUMP_SANDBOX_ROOT.with_name(f"{JUMP_SANDBOX_ROOT.name}-s{i}"))
      for i, base in ((1, 40), (2, 70), (3, 90))),
)


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs as a whole: a unit of the sandbox tier, or one test module."""
    if nodeid.startswith(SANDBOX_DIR):
        return f"sandbox-{sandbox_unit(nodeid[len(SANDBOX_DIR):])}"
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return len(SANDBOX_UNITS) + max(1, (os.cpu_count() or 1) - 1)


def collection_roles(config) -> bool:
    """In the plain run (the README's command, CI: the testpaths, no selection), does each worker collect
    only what it will run? Worker gwK runs sandbox unit K (K < len(SANDBOX_UNITS)) and collects
    tests/integration alone, except gw0: unit 0 (the catch-all) ended first in the measured runs, and
    its worker then takes pure modules off the queue, so it collects everything. The others collect
    the rest. A worker collecting all 7,800 cases took about 2 s of CPU, tests/integration alone 0.55 s
    (2026-12-07). Any selection (paths, -k, -m, --lf, --deselect) or fewer workers: every worker
    collects everything, as pytest-xdist expects."""
    option = config.option
    workers = getattr(option, "numprocesses", None)
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and isinstance(workers, int)
            and workers > len(SANDBOX_UNITS) and getattr(option, "dist", "no") != "no"
            and not option.keyword and not option.markexpr and not getattr(option, "deselect", None)
            and not getattr(option, "lf", False) and not getattr(option, "failedfirst", False)
            and not getattr(option, "stepwise", False) and not getattr(option, "collectonly", False))


def worker_index(node) -> int:
    """K of pytest-xdist's worker gwK."""
    return int(node.gateway.id.removeprefix("gw"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    if collection_roles(node.config):
        index = worker_index(node)
        node.workerinput["deployctl_collects"] = ("all" if index == 0 else "sandbox" if index < len(SANDBOX_UNITS)
                                                  else "rest")


def pytest_ignore_collect(collection_path, config):
    role = getattr(config, "workerinput", {}).get("deployctl_collects")
    if role in (None, "all"):
        return None
    tests = Path(__file__).resolve().parent
    path = Path(collection_path).resolve()
    inside = path == tests / "integration" or tests / "integration" in path.parents
    if role == "sandbox" and not inside and path != tests:
        return True
    if role == "rest" and inside:
        return True
    return None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    # pytest-xdist's own --dist loadgroup reads a group written into item._nodeid, which pytest 9.2
    # no longer reads the node id from: the grouping is made here from the node id instead
    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") == "each":
        return None
    # the collection order (sandbox units first, pytest_collection_modifyitems) is the queue's:
    # the long units start at once, one worker each, and the pure modules fill the rest
    config.option.loadscopereorder = False
    roles = collection_roles(config)

    class SandboxOnOneWorker(LoadScopeScheduling):
        """With collection roles (``collection_roles``) the workers' collections differ: the queue is
        their union, in each one's order, and a worker takes the first unit it collected."""

        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            self._indexes: dict = {}  # worker -> {node id: its index in that worker's collection}

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def add_node_collection(self, node, collection) -> None:
            if not roles:
                return super().add_node_collection(node, collection)
            assert node in self.assigned_work
            self.registered_collections[node] = list(collection)
            # pytest-xdist has just set the session's count to this worker's: the progress ("[ 50%]") and the
            # summary count the whole run's
            session = self.config.pluginmanager.get_plugin("session")
            if session is not None:
                session.testscollected = len(set().union(*self.registered_collections.values()))

        def _index(self, node) -> dict[str, int]:
            if node not in self._indexes:
                self._indexes[node] = {nodeid: i for i, nodeid in enumerate(self.registered_collections[node])}
            return self._indexes[node]

        def _takes(self, node) -> list[str]:
            """The queued scopes this worker collected, queue order."""
            index = self._index(node)
            return [scope for scope, unit in self.workqueue.items() if next(iter(unit)) in index]

        def schedule(self) -> None:
            if not roles or self.collection is not None:
                return super().schedule()
            union = list(dict.fromkeys(nodeid for collection in self.registered_collections.values()
                                       for nodeid in collection))
            union.sort(key=lambda nodeid: not nodeid.startswith(SANDBOX_DIR))  # stable: each tier's order
            self.collection = union
            for nodeid in union:
                self.workqueue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            # gwK takes unit K (the queue's order), whichever worker came up first
            nodes = sorted(self.nodes, key=worker_index)
            for node in nodes:
                self._assign_work_unit(node)
            for node in nodes:
                self._reschedule(node)

        def _assign_work_unit(self, node) -> None:
            if not roles:
                return super()._assign_work_unit(node)
            takes = self._takes(node)
            if not takes:
                return
            unit = self.workqueue.pop(takes[0])
            self.assigned_work.setdefault(node, {})[takes[0]] = unit
            index = self._index(node)
            node.send_runtest_some([index[nodeid] for nodeid, completed in unit.items() if not completed])

        def _reschedule(self, node) -> None:
            if not roles:
                return super()._reschedule(node)
            if node.shutting_down or self._pending_of(self.assigned_work[node]) > 2:
                return  # (called after every test: the queue is looked at only when the worker runs low)
            if not self._takes(node):
                node.shutdown()
                return
            self._assign_work_unit(node)

        def remove_node(self, node):
            self._indexes.pop(node, None)
            return super().remove_node(node)

    return SandboxOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())) and not work_unit(item.nodeid).startswith("sandbox"):
            item.add_marker(pytest.mark.misplaced_sandbox_test)
    # sandbox units first (a stable sort keeps each file's order): the scheduler hands them out first
    items.sort(key=lambda item: sandbox_unit(item.nodeid[len(SANDBOX_DIR):]) if item.nodeid.startswith(SANDBOX_DIR)
               else len(SANDBOX_UNITS))


@pytest.hookimpl(tryfirst=True)  # before any fixture is set up: never a second sandbox session
def pytest_runtest_setup(item):
    if item.get_closest_marker("misplaced_sandbox_test"):
        pytest.fail(f"a test that uses the sandbox belongs in {SANDBOX_DIR} (parallel runs keep that directory on "
                    "one worker: the sandbox's addresses, users and machine lock allow one session)", pytrace=False)


@pytest.fixture(scope="session")
def sandbox_machine_lock():
    """Held for the rest of the session by any test that creates sandbox users or addresses; its
    value is the Slot taken (the first free one, or DEPLOYCTL_TEST_SANDBOX_SLOT's)."""
    from sandbox.hosts import sandbox_unavailable_reason

    reason = sandbox_unavailable_reason()
    if reason and REQUIRE_SANDBOX:
        pytest.fail(f"sandbox unavailable: {reason} (DEPLOYCTL_TEST_REQUIRE_SANDBOX=1: CI must run these tests)")
    if reason:
        pytest.skip(f"sandbox unavailable: {reason}")
    from sandbox.machine_lock import MachineLockTimeout, any_slot_lock

    forced = os.environ.get("DEPLOYCTL_TEST_SANDBOX_SLOT")
    if forced is not None and forced not in {str(s.index) for s in SLOTS}:
        pytest.fail(f"DEPLOYCTL_TEST_SANDBOX_SLOT={forced!r}: expected one of {[s.index for s in SLOTS]}")
    slots = [int(forced)] if forced is not None else [s.index for s in SLOTS]
    try:
        with any_slot_lock(slots, LOCK_WAIT_S) as index:
            yield SLOTS[index]
    except MachineLockTimeout as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def sandbox_slot(sandbox_machine_lock) -> Slot:
    return sandbox_machine_lock


@pytest.fixture(scope="session")
def sandbox(sandbox_machine_lock):
    from sandbox.hosts import start_sandbox, stop_sandbox

    slot: Slot = sandbox_machine_lock
    sb = start_sandbox(slot.root, SANDBOX_HOSTS, gpus=8, address_base=slot.address_base,
                       user_prefix=slot.user_prefix, stop_at_exit=True, sim_env=HOST_SIM_ENV)
    try:
        yield sb
    finally:
        stop_sandbox(slot.root)


#: a bastion and two GPU hosts behind it, on 127.0.0.30-32 in slot 0 (sb1-3 use .10-12, the demo .20+)
JUMP_SANDBOX_HOSTS = ("jump", "jt1", "jt2")


@pytest.fixture(scope="session")
def jump_sandbox(sandbox_machine_lock):
    """A jump host and two targets behind it, 2 simulated GPUs each.

    sshd runs at LogLevel DEBUG: OpenSSH 9.2 at VERBOSE does not log forwarded direct-tcpip
    channels; DEBUG logs one ``server_request_direct_tcpip`` line per channel, which tests count.
    """
    from sandbox.hosts import start_sandbox, stop_sandbox

    slot: Slot = sandbox_machine_lock
    sb = start_sandbox(slot.jump_root, JUMP_SANDBOX_HOSTS, gpus=2, address_base=slot.jump_address_base,
                       user_prefix=slot.user_prefix, stop_at_exit=True, log_level="DEBUG", sim_env=HOST_SIM_ENV)
    try:
        yield sb
    finally:
        stop_sandbox(slot.jump_root)


@pytest.fixture
def clean_sandbox(sandbox):
    sandbox.reset()
    return sandbox


@pytest.fixture(autouse=True)
def private_state_home(tmp_path_factory, monkeypatch):
    """deployctl's local state (history, local locks, nightly logs) per test, never the user's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("xdg-state")))
