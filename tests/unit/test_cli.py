"""The CLI: documented exit codes, no tracebacks for user errors, a fast --help."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cli.main import main
from deploy.base.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "configs" / "kimi-k25-eagle3.yaml")


def test_help_does_not_import_ssh_libraries():
    code = "import sys; from deploy.cli.main import main; main(['--help']); print(sorted(m for m in ('fabric', 'paramiko', 'pydantic') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.stdout.strip().endswith("[]"), out.stdout


@pytest.mark.parametrize(
    "argv, code, fragment",
    [
        (["-c", "/nonexistent.yaml", "gpu-status"], ExitCode.CONFIG, "/nonexistent.yaml: file not found"),
        (["gpu-status", "--bogus"], ExitCode.USAGE, "No such option"),
        (["-c", EXAMPLE, "gpu-status", "--host", "nope"], ExitCode.USAGE, "--host 'nope'"),
        (["-c", EXAMPLE, "up", "--run", "nope", "--dry-run"], ExitCode.USAGE, "--run 'nope'"),
        (["-c", EXAMPLE, "up", "--draft-tokens", "1", "--dry-run"], ExitCode.USAGE, "--draft-tokens"),
        (["-c", EXAMPLE, "plan", "no-such-playbook"], ExitCode.CONFIG, "playbook 'no-such-playbook' not found"),
        (["nonsense-verb"], ExitCode.USAGE, "No such command"),
    ],
)
def test_user_errors_exit_with_documented_codes_and_no_traceback(capsys, argv, code, fragment):
    assert main(argv) == code
    captured = capsys.readouterr()
    assert fragment in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_bad_config_line_reaches_the_user(tmp_path, capsys):
    path = tmp_path / "deployctl.yaml"
    path.write_text("hosts:\n  - name: a\n    adress: 1.2.3.4\n")
    assert main(["-c", str(path), "gpu-status"]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert f"{path}:3" in err and "adress" in err and "address" in err


def test_plan_json_carries_launch_argv_and_changes_nothing(capsys):
    assert main(["-c", EXAMPLE, "plan", "--json", "--draft-tokens", "10"]) == 0
    doc = json.loads(capsys.readouterr().out)
    [host] = doc["hosts"]
    launch = next(s for s in host["steps"] if s["step"] == "launch")
    [argv] = [c["argv"] for c in launch["commands"] if "argv" in c]
    assert "SGLANG_ENABLE_TORCH_COMPILE" in launch["commands"][0]["description"]
    assert all("SGLANG_ENABLE_TORCH_COMPILE=" not in str(c) for c in launch["commands"])
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "10"
    assert argv[argv.index("--speculative-num-steps") + 1] == "9"
    assert doc["dry_run"] is True


def test_config_from_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DEPLOYCTL_CONFIG", EXAMPLE)
    assert main(["plan", "down"]) == 0
    assert "stop stale python3 processes (scope pidfile)" in capsys.readouterr().out


def test_logs_refuses_a_host_outside_the_run(capsys):
    assert main(["-c", EXAMPLE, "logs", "--host", "nope"]) == ExitCode.USAGE
    assert "--host 'nope' is not a host of run" in capsys.readouterr().err


def _bug(*_args, **_kwargs):
    raise RuntimeError("simulated bug")


def test_a_bug_is_one_line_without_traceback_flag(monkeypatch, capsys):
    monkeypatch.setattr("deploy.config.load_config", _bug)
    assert main(["-c", EXAMPLE, "gpu-status"]) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert err.strip() == "internal error: RuntimeError: simulated bug (run with --traceback)"


def test_traceback_flag_prints_the_traceback(monkeypatch, capsys):
    monkeypatch.setattr("deploy.config.load_config", _bug)
    assert main(["--traceback", "-c", EXAMPLE, "gpu-status"]) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "_bug" in err
    assert err.rstrip().endswith("internal error: RuntimeError: simulated bug")


@pytest.mark.parametrize("flag", [False, True])
def test_a_bug_on_one_host_keeps_the_others_and_its_traceback(flag, capsys):
    from deploy.base import errors
    from deploy.config import load_config
    from deploy.engine.fanout import exit_code, for_each_host

    first = load_config(Path(EXAMPLE)).hosts[0]
    hosts = [first.model_copy(update={"name": f"h{i}"}) for i in range(3)]

    def work(host):
        if host.name == hosts[0].name:
            raise KeyError("boom")
        return host.name

    errors.show_tracebacks = flag
    try:
        outcomes = for_each_host(hosts, work, max_parallel=4)
    finally:
        errors.show_tracebacks = False
    assert [o.value for o in outcomes[1:]] == [h.name for h in hosts[1:]]
    error = outcomes[0].error
    assert isinstance(error.__cause__, KeyError) and error.exit_code == ExitCode.FAILED
    assert exit_code(outcomes) == ExitCode.FAILED
    err = capsys.readouterr().err
    assert ("(run with --traceback)" in str(error)) is not flag
    assert ("Traceback (most recent call last)" in err) is flag


def test_the_cli_never_talks_ssh_itself():
    """deploy/cli parses, calls one verb and renders: no transport, shell, steps or facts, and (issue 37)
    no engine or fleet runner either (a verb in deploy/verbs/ resolves and runs; the CLI takes only the
    fleet's printers, deploy.fleet.plan)."""
    import ast

    forbidden = ("deploy.ssh", "deploy.base.shell", "deploy.steps", "deploy.engine", "deploy.facts",
                 "deploy.fleet.rolling", "deploy.fleet.rollout", "deploy.fleet.phases", "deploy.fleet.nodes",
                 "deploy.fleet.router", "deploy.fleet.canary")
    cli_dir = REPO / "deploy" / "cli"
    offenders = []
    for path in sorted(cli_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(forbidden)]
    assert offenders == []
    verbs = {p.stem for p in cli_dir.glob("*.py")} - {"__init__", "main", "common", "options"}
    from deploy.cli.main import VERBS

    assert sorted(VERBS) == sorted(verbs), "one module per verb, each registered once"


def _config_with_steps(tmp_path, steps: int) -> str:
    import yaml

    doc = yaml.safe_load(Path(EXAMPLE).read_text())
    doc["runs"][0]["speculative_num_steps"] = steps
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("verb", [["plan"], ["up", "--dry-run"], ["restart", "--dry-run"], ["bench", "--dry-run"]])
def test_draft_tokens_override_is_validated_like_the_config(tmp_path, capsys, verb):
    """speculative_num_steps 15 with topk 1 fixes T = 16; --draft-tokens 10 must be refused as the YAML would."""
    config = _config_with_steps(tmp_path, 15)
    assert main(["-c", config, *verb, "--draft-tokens", "16"]) == 0
    capsys.readouterr()
    assert main(["-c", config, *verb, "--draft-tokens", "10"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "--draft-tokens 10" in err and "speculative_num_steps must be draft_tokens - 1 = 9" in err


@pytest.mark.parametrize("tokens", ["1", "65", "-3"])
@pytest.mark.parametrize("verb", [["plan"], ["up", "--dry-run"], ["bench", "--dry-run"]])
def test_draft_tokens_bounds_come_from_the_model(capsys, verb, tokens):
    assert main(["-c", EXAMPLE, *verb, "--draft-tokens", tokens]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"--draft-tokens {tokens}" in err and ("greater than or equal to 2" in err or "less than or equal to 64" in err)


def test_the_deploy_verbs_parse_into_one_request_and_make_one_engine_call(monkeypatch, tmp_path):
    """issue 37: the command line becomes one DeployRequest; one call (verbs.deploy.execute) answers it."""
    from deploy.verbs import deploy
    from deploy.verbs.deploy import DeployRequest, DeployResult

    seen: list[DeployRequest] = []

    def execute(request, config, progress):
        seen.append(request)
        return DeployResult(request, config.runs[0], 7, plans={}, endpoints={})

    monkeypatch.setattr(deploy, "execute", execute)
    monkeypatch.setattr("deploy.render.report.plan_text", lambda *a, **k: None)
    config = str(REPO / "configs" / "kimi-k25-eagle3.yaml")
    assert main(["-c", config, "restart", "--dry-run", "--host", "kimi-a", "--swap-drafter", "--serial", "1",
                 "--ignore-doctor"]) == 7
    assert main(["-c", config, "down", "--free-gpus"]) == 7
    assert main(["-c", config, "plan", "down", "--draft-tokens", "5"]) == 7
    restart, down, plan = seen
    assert (restart.verb, restart.playbook, restart.host_names, restart.dry_run, restart.serial) == \
        ("restart", "restart", ("kimi-a",), True, 1)
    assert restart.drafter_update == "swap" and restart.ignore_doctor and not restart.canary
    assert (down.verb, down.playbook, down.free_gpus, down.dry_run) == ("down", "down", True, False)
    assert (plan.verb, plan.playbook, plan.draft_tokens, plan.plans_only) == ("plan", "down", 5, True)
    assert deploy.step_settings(restart) == {"doctor": {"ignore": True}, "swap-drafter": {"mode": "swap"}}
    assert deploy.step_settings(down) == {"free-gpus": {"enabled": True}, "wait-gpus-free": {"enabled": True}}
