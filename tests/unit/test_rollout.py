"""One rollout value (deploy/fleet/rollout.py, issue 25): a plan refuses exactly what its run refuses.

The run side is the real CLI down to ``engine.run.run_locked``, which is replaced by a recorder: a
refusal is decided before any host is reached, and a rollout that is not refused reaches
``run_locked`` with the runner of its shape. No SSH, no sandbox.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from deploy.cli.main import main
from deploy.config import load_config
from deploy.base.errors import UsageError
from deploy.fleet.rollout import Rollout

from tests.fixtures import fleet_config  # noqa: E402

BASE = fleet_config()

#: run shapes that decide differently: replicas behind a router (3, and 1: no smaller batch exists),
#: hosts without a router, a node group
RUNS = {
    "router-3": "    group: g\n    router: {host: a}\n",
    "router-1": "    hosts: [b]\n    router: {host: a}\n",
    "plain-3": "    group: g\n",
    "nodes-2": "    nodes: [a, b]\n",
}


def write(tmp_path, shape: str):
    path = tmp_path / f"{shape}.yaml"
    path.write_text(BASE + RUNS[shape])
    return path


@pytest.fixture
def reached(monkeypatch, tmp_path):
    """run_locked replaced: records (verb, shape of its runner, hosts) and returns an empty success."""
    calls: list[tuple] = []

    def run_locked(config_path, config, command, playbook, run, hosts, progress, *, rollback=True, force=False,
                   runner=None):
        from deploy.engine.run import RunReport

        calls.append((command, runner is not None, tuple(h.name for h in hosts)))
        if runner is None:
            return RunReport([])
        return RunReport([], SimpleNamespace(reports=[], phases=[], error=None, rotation={}, exit_code=lambda: 0))

    monkeypatch.setattr("deploy.engine.run.run_locked", run_locked)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return calls


def flags(serial, host, allow_downtime) -> list[str]:
    return ([] if serial is None else ["--serial", str(serial)]) + ([] if host is None else ["--host", host]) + \
        (["--allow-downtime"] if allow_downtime else [])


def expected_refused(shape: str, serial, host, allow_downtime) -> bool:
    """The documented rules (docs/fleets.md), written out independently of the code."""
    if shape == "nodes-2":
        return host is not None or serial is not None
    if shape == "router-3":
        replicas = 1 if host is not None else 3
        return serial is not None and serial >= replicas > 1 and not allow_downtime
    return False


COMBOS = list(itertools.product([None, 1, 2, 3], [None, "b"], [False, True]))


@pytest.mark.parametrize("shape", RUNS)
def test_plan_and_run_refuse_the_same_combinations(tmp_path, capsys, reached, shape):
    path = write(tmp_path, shape)
    config = load_config(path)
    run = config.runs[0]
    for serial, host, allow_downtime in COMBOS:
        argv = flags(serial, host, allow_downtime)
        planned = main(["-c", str(path), "up", "--dry-run", "--json", *argv])
        before = len(reached)
        ran = main(["-c", str(path), "up", *argv])
        capsys.readouterr()
        refused = expected_refused(shape, serial, host, allow_downtime)
        assert (planned, ran) == ((2, 2) if refused else (0, 0)), (shape, argv)
        assert len(reached) == before + (0 if refused else 1), (shape, argv)  # refused: no host reached
        try:
            Rollout.of(run, config.hosts_of(run), "up", (host,) if host else (), serial, allow_downtime)
        except UsageError:
            assert refused, (shape, argv)
        else:
            assert not refused, (shape, argv)


@pytest.mark.parametrize("verb", ["up", "restart", "nightly"])
def test_a_typed_serial_that_empties_the_router_is_refused_by_plan_and_run_alike(tmp_path, capsys, reached, verb):
    # issue 25: `up --dry-run --serial 2` printed batches and exited 0, `up --serial 2` exited 2
    path = tmp_path / "two.yaml"
    path.write_text(BASE + "    hosts: [a, b]\n    router: {host: c}\n")
    if verb != "nightly":
        assert main(["-c", str(path), verb, "--dry-run", "--serial", "2"]) == 2
        assert "--serial 2 takes all 2 replica(s)" in capsys.readouterr().err
    assert main(["-c", str(path), verb, "--serial", "2"]) == 2
    assert "--serial 2 takes all 2 replica(s)" in capsys.readouterr().err and reached == []


def test_a_first_up_of_a_router_run_with_one_replica_is_not_refused(tmp_path, capsys, reached):
    # issue 25: a plain `up` was refused with "--serial 1 takes all 1 replica(s)" although the user
    # typed no --serial and nothing served yet; the router's last healthy worker is checked when the
    # batch starts (fleet/rolling.py, exit 2 then)
    path = write(tmp_path, "router-1")
    assert main(["-c", str(path), "up"]) == 0
    assert reached == [("up", True, ("b",))]
    assert main(["-c", str(path), "up", "--dry-run", "--json"]) == 0


@pytest.mark.parametrize("verb,argv", [("nightly", ["--host", "b"]), ("nightly", ["--serial", "1"]),
                                       ("up", ["--host", "b"]), ("restart", ["--host", "a"]),
                                       ("bench", ["--host", "b"])])
def test_a_node_group_cannot_be_split_by_any_verb(tmp_path, capsys, reached, verb, argv):
    # issue 25: `nightly --host b` on `nodes: [a, b]` launched the group on b alone (--nnodes 1)
    path = write(tmp_path, "nodes-2")
    assert main(["-c", str(path), verb, *argv]) == 2
    assert "one server across a, b" in capsys.readouterr().err and reached == []


def test_nightly_and_bench_of_a_node_group_run_as_one_group(tmp_path, capsys, reached):
    path = write(tmp_path, "nodes-2")
    main(["-c", str(path), "nightly"])
    main(["-c", str(path), "bench"])
    assert [(verb, phased) for verb, phased, _ in reached][:2] == [("nightly", True), ("bench", True)]


def test_down_is_never_phased_and_keeps_host(tmp_path):
    config = load_config(write(tmp_path, "nodes-2"))
    run = config.runs[0]
    rollout = Rollout.of(run, config.hosts_of(run), "down", ("b",))
    assert rollout.shape == "hosts" and [h.name for h in rollout.hosts] == ["b"] and not rollout.whole
    assert Rollout.of(run, config.hosts_of(run), "plan", (), playbook="down").shape == "hosts"


def test_every_verb_spares_a_router_on_a_replica_host(tmp_path):
    from deploy.engine.playbook import load_playbook

    config = load_config(write(tmp_path, "router-3"))
    run = config.runs[0]
    for verb in ("up", "restart", "down", "bench", "nightly"):
        playbook = load_playbook("bench" if verb == "bench" else verb)
        spared = Rollout.of(run, config.hosts_of(run), verb).playbook(playbook)
        stop = next((s for s in spared.steps if s.name == "stop-stale"), None)
        assert stop is None or "sglang_router" in stop.settings.exclude, verb


# -- issue 37: what the config alone refuses, plan and run alike, before anything is reached ----------

LOOPBACK = ["127.0.0.1", "127.0.0.9", "::1", "localhost"]
NOT_LOOPBACK = [None, "0.0.0.0", "::", "10.0.0.2"]


def expected_loopback_refusal(serve_host, router_host: str, replicas: list[str]) -> bool:
    """docs/fleets.md, written out: a replica bound to a loopback address is reachable by a router on
    its own host only."""
    return serve_host in LOOPBACK and any(r != router_host for r in replicas)


@pytest.fixture
def locks_reached(monkeypatch, tmp_path):
    """The fleet's first host contact (every host's lock) replaced: reaching it means "not refused"."""
    from contextlib import contextmanager

    from deploy.base.errors import LockHeld

    reached: list[tuple[str, ...]] = []

    @contextmanager
    def hold_host_locks(config, hosts, owner, progress, jumps=None):
        reached.append(tuple(h.name for h in hosts))
        raise LockHeld("test: the lock phase was reached")
        yield  # pragma: no cover

    monkeypatch.setattr("deploy.fleet.phases.hold_host_locks", hold_host_locks)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return reached


@pytest.mark.parametrize("verb", ["up", "restart"])
@pytest.mark.parametrize("layout", [("a", ["b", "c"]), ("b", ["b"]), ("b", ["b", "c"])])
@pytest.mark.parametrize("serve_host", LOOPBACK + NOT_LOOPBACK)
def test_plan_and_run_refuse_loopback_replicas_alike_before_any_host_is_reached(
        tmp_path, capsys, locks_reached, verb, layout, serve_host):
    router_host, replicas = layout
    path = tmp_path / "loop.yaml"
    serve = "" if serve_host is None else f"    serve_host: {serve_host!r}\n".replace("'", '"')
    path.write_text(BASE + f"    hosts: [{', '.join(replicas)}]\n    router: {{host: {router_host}}}\n" + serve)
    planned = main(["-c", str(path), verb, "--dry-run", "--json"])
    plan_err = capsys.readouterr().err
    ran = main(["-c", str(path), verb])
    run_err = capsys.readouterr().err
    if expected_loopback_refusal(serve_host, router_host, replicas):
        assert (planned, ran) == (8, 8), (plan_err, run_err)
        assert "is a loopback address" in plan_err and "is a loopback address" in run_err
        assert locks_reached == []  # refused before any host was reached or locked
    else:
        assert (planned, ran) == (0, 9), (plan_err, run_err)
        assert locks_reached == [tuple(replicas)]


@pytest.mark.parametrize("argv", [["--host", "b"], ["--host", "b", "--host", "c"], []])
def test_down_behind_a_router_takes_every_lock_before_it_touches_the_router(tmp_path, capsys, monkeypatch,
                                                                            locks_reached, argv):
    # issue 37: `down --host host1` while another run held host1's lock exited 9, but host1 had already
    # been taken out of the router (cli/common.py removed it before any lock was taken)
    touched: list[str] = []
    monkeypatch.setattr("deploy.fleet.rolling.remove_from_router", lambda *a, **k: touched.append("remove") or {})
    monkeypatch.setattr("deploy.fleet.rolling.stop_router", lambda *a, **k: touched.append("stop") or {})
    path = write(tmp_path, "router-3")
    assert main(["-c", str(path), "down", *argv]) == 9
    assert touched == [] and locks_reached == [tuple(argv[1::2]) or ("a", "b", "c")]
    # the plan says the same order
    assert main(["-c", str(path), "down", "--dry-run", "--json", *argv]) == 0
    import json

    down = json.loads(capsys.readouterr().out)["fleet"]["down"]
    assert down[0].startswith("every host's lock") and "nothing changed, the router included" in down[0]
    assert ("out of the router" in down[1]) == bool(argv)
