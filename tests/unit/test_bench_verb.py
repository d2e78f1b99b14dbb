"""deployctl bench as one request and one verb call (deploy/verbs/bench.py, issue 37): its rounds and
exit code are decided there, not in the CLI. ``engine.run.run_locked`` is replaced by a recorder; no SSH."""

from __future__ import annotations

from types import SimpleNamespace

from deploy.base.errors import DeployError, ExitCode
from deploy.config import load_config
from deploy.engine.records import HostReport
from deploy.engine.run import RunReport
from deploy.verbs import bench
from tests.fixtures import fleet_config


def _config(tmp_path, run_lines: str):
    path = tmp_path / "deployctl.yaml"
    path.write_text(fleet_config(run_lines))
    return path, load_config(path)


def test_a_run_level_failure_fails_the_hosts_it_left_untouched(tmp_path, monkeypatch):
    # the router's pre-flight refused the round: no host ran, each is reported with the run's error
    path, config = _config(tmp_path, "    hosts: [a, b]\n    router: {host: c}\n")
    refused = DeployError("router c: pre-flight refused", exit_code=ExitCode.VERIFY)
    rounds: list[tuple[int, bool]] = []

    def run_locked(config_path, config, command, playbook, run, hosts, progress, *, rollback=True, force=False,
                   runner=None):
        rounds.append((run.draft_tokens, runner is not None))
        reports = [HostReport(h) for h in hosts]
        return RunReport(reports, SimpleNamespace(reports=reports, error=refused, exit_code=lambda: refused.exit_code))

    monkeypatch.setattr("deploy.engine.run.run_locked", run_locked)
    result = bench.execute(bench.prepare(bench.BenchRequest(config_path=path), config), lambda *a: None)
    # the round failed on every host (the run's error), so the configured deployment is restored after it
    assert rounds == [(16, True), (16, True)]
    assert result.sweep is not None and result.sweep.restore is not None and result.exit_code == ExitCode.VERIFY
    [(_, reports)] = result.sweep.rounds
    assert [r.error for r in reports] == [refused, refused]


def test_a_dry_run_plans_each_round_and_the_restore_without_a_lock(tmp_path, monkeypatch):
    path, config = _config(tmp_path, "    group: g\n")
    monkeypatch.setattr("deploy.engine.run.run_locked", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    request = bench.BenchRequest(config_path=path, draft_tokens=(10, 5), dry_run=True)
    result = bench.execute(bench.prepare(request, config), lambda *a: None)
    assert result.sweep is None and result.exit_code == 0 and result.rounds is not None
    assert [(r.label, r.run.draft_tokens) for r in result.rounds] == [
        ("draft tokens 10", 10), ("draft tokens 5", 5),
        ("restore the configured deployment (draft tokens 16)", 16)]
    assert all(set(r.plans) == {"a", "b", "c"} and r.fleet_plan is None for r in result.rounds)


def test_a_refused_bench_prints_no_ignore_doctor_warning(tmp_path, capsys):
    # as before the verb moved: the warning is for a sweep that will run, after every refusal was asked
    from deploy.cli.main import main

    path, _ = _config(tmp_path, "    group: g\n")
    assert main(["-c", str(path), "bench", "--ignore-doctor", "--run", "nope"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--run 'nope'" in err and "--ignore-doctor:" not in err
