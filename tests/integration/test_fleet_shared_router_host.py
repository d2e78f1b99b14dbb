"""Issue 44 over the real-sshd sandbox: two fleets whose routers run on one router host.

Team A (replica sb2) and team B (replica sb3) put their routers on sb1, the same Unix user and
state dir, on two ports. Before, ``<state_dir>/router/router.pid`` was one file, whoever wrote it
last: team B's `down` SIGTERMed team A's router, exit 0, and team A's `status --check` still said
"healthy" because status never looked at the router. Now each router has ``router/PORT/``, `down`
stops only its own run's router, and `status` reports the run's router: `--check` fails (exit 1)
when it is down, naming it.
"""

from __future__ import annotations

import pytest
import yaml

from tests.integration.helpers import FAST, cli_json, write_config
from tests.integration.test_fleet import ROUTER_PORT, ROUTER_PYTHON, summary

pytestmark = pytest.mark.sandbox


def _pid(sb, port: int) -> int:
    return int(sb.run("sb1", f"cat ~/.deployctl/router/{port}/router.pid").stdout)


def _alive(sb, pid: int) -> bool:
    return sb.run("sb1", f"ps -o stat= -p {pid} || true").stdout.strip()[:1] in ("S", "R")


def test_two_fleets_routers_on_one_host_each_down_and_status_sees_only_its_own(clean_sandbox, tmp_path, capsys):
    sb = clean_sandbox
    path = write_config(sb, tmp_path)
    config = yaml.safe_load(path.read_text())
    base = config["runs"][0]
    runs = []
    # smg also binds a metrics port (29000 by default): each team its own
    for name, replica, port, metrics in (("team-a", "sb2", ROUTER_PORT, 29000), ("team-b", "sb3", ROUTER_PORT + 1, 29001)):
        run = dict(base, name=name, hosts=[replica], env=base["env"] | FAST)
        run.pop("group", None)
        run["router"] = {"host": "sb1", "port": port, "python": str(ROUTER_PYTHON), "startup_timeout_s": 60,
                         "drain_timeout_s": 30, "extra_args": ["--prometheus-port", str(metrics)]}
        runs.append(run)
    config["runs"] = runs
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    for name in ("team-a", "team-b"):
        code, doc = cli_json(capsys, "-c", str(path), "up", "--run", name, "--json")
        assert code == 0, summary(doc)
    team_a, team_b = _pid(sb, ROUTER_PORT), _pid(sb, ROUTER_PORT + 1)
    assert team_a != team_b and _alive(sb, team_a) and _alive(sb, team_b)

    # status of a fleet reports its router: alive, listing the replica that serves
    code, doc = cli_json(capsys, "-c", str(path), "status", "--run", "team-a", "--check", "--json")
    assert code == 0, doc
    assert doc["router"]["verdict"] == "healthy" and doc["router"]["pid"] == team_a, doc["router"]
    assert [w["url"] for w in doc["router"]["workers"]] == [f"http://{sb.host('sb2').address}:30000"]

    # team B's down stops team B's router only
    code, doc = cli_json(capsys, "-c", str(path), "down", "--run", "team-b", "--json")
    assert code == 0, summary(doc)
    assert doc["router"]["stopped"] is True and doc["router"]["pid"] == team_b, doc["router"]
    assert _alive(sb, team_a) and not _alive(sb, team_b)

    # team A's router gone while its replica serves: status --check fails naming the router
    sb.run("sb1", f"kill -9 {team_a}")
    code, doc = cli_json(capsys, "-c", str(path), "status", "--run", "team-a", "--check", "--json")
    assert code == 1, doc
    assert doc["router"]["verdict"] == "down", doc["router"]
    assert doc["hosts"][0]["verdict"] in ("healthy", "unknown"), doc["hosts"]  # the replica itself serves
    code, doc = cli_json(capsys, "-c", str(path), "down", "--run", "team-a", "--json")
    assert code == 0, summary(doc)
