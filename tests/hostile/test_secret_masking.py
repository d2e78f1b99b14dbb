"""Round 4 (issue 38): SGLang's API keys in deployctl's output and on the host's command lines.

Before: ``--admin-api-key KEY`` / ``--api-key KEY`` (a run's ``extra_args``) were printed by ``plan``,
``up --dry-run``, ``restart --json`` and the reload reason ("drops --admin-api-key KEY"), and every
deployment-record write printf'd the record (the argv, the key in it) on a command line another
user of the host reads in /proc/*/cmdline; a record over 128 KiB (10,000 throughput baselines)
failed as "connection lost" every night. Now one masking function (deploy/base/secrets.py) serves
every printed argv, plan, reason and JSON document, and records travel on the command's stdin,
bounded (1 MiB) with a clear error. Generated over many secrets (spaces, quotes, shell and JSON
metacharacters, unicode, long) in every form SGLang takes them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from deploy.host.records import DeploymentRecord, LastGood, Metrics
from deploy.base.errors import DeployError, ExitCode
from deploy.base.secrets import MASK, mask_argv, mask_secrets, mask_text
from deploy.base.terminal import safe_line, safe_text
from deploy.cli.main import main
from deploy.config.models import Host, Run
from deploy.engine.plan import plan_playbook
from deploy.engine.playbook import load_playbook
from deploy.facts.server import MAX_RECORD_BYTES, record_stdin
from deploy.local import history
from deploy.render.report import print_json
from deploy.steps import record_good
from deploy.steps.base import Command, StepContext
from deploy.steps.swap_decision import RunningServer, swap_decision
from deploy.host.deployment import DesiredDeployment
from deploy.steps.memory import StepMemory
from tests.recording import RecordingTransport, Reply

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "kimi-k25-eagle3.yaml"

SECRETS = {
    "plain": "Zq8sEcReTvAlUe42",
    "hex": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "spaces": "zq k3y w1th spacez",
    "single-quote": "it's-a-key",
    "double-quote": 'say "key"',
    "shell-meta": "k$(id);`x`|&>",
    "json-meta": 'k\\"}],{"a":"',
    "equals": "a=b=c",
    "comma": "k1,k2",
    "semicolon-inside": "abc;defghi",
    "unicode": "ключ-秘密-🔑",
    "long": "L" * 300,
    "dashes-inside": "sk-ant-api-key-123",
}
#: how a run passes them (extra_args)
FORMS = {
    "admin-separate": lambda k: ["--admin-api-key", k],
    "admin-equals": lambda k: [f"--admin-api-key={k}"],
    "api-separate": lambda k: ["--api-key", k],
    "api-equals": lambda k: [f"--api-key={k}"],
    "both": lambda k: ["--api-key", k + "-api", "--admin-api-key", k],
}


def _leaks(text: str, secret: str) -> bool:
    """Any piece of the secret that could identify it (its longest run without a separator)."""
    pieces = [p for p in secret.replace('"', " ").replace("'", " ").replace(",", " ").replace(";", " ").split() if len(p) >= 6]
    return any(p in text for p in pieces) or secret in text


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", sorted(SECRETS))
def test_every_text_form_of_an_argv_is_masked(name, form):
    secret = SECRETS[name]
    argv = ["python3", "-m", "sglang.launch_server", "--port", "30000", *FORMS[form](secret), "--tp", "8"]
    shown = {
        "argv": mask_argv(argv),
        "json": mask_text(json.dumps(argv)),
        "repr": mask_text(repr(argv)),
        "shell": mask_text(" ".join(shlex.quote(a) for a in argv)),
        "joined": mask_text(" ".join(argv)) if " " not in secret else None,
        "document": mask_secrets({"argv": argv, "nested": [{"argv": argv}], "text": " ".join(argv) if " " not in secret else ""}),
        "terminal": safe_text(json.dumps(argv)),
        "line": safe_line(shlex.join(argv)),
    }
    for how, value in shown.items():
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        assert not _leaks(text, secret), (how, text)
        assert MASK in text and ("--admin-api-key" in text or "--api-key" in text), (how, text)
    assert mask_argv(argv)[:5] == argv[:5] and mask_argv(argv)[-2:] == ["--tp", "8"]  # the rest as it was


@pytest.mark.parametrize("text", ["--api-keys are documented in docs/", "no key here", "--admin-api-key",
                                  "x --api-key", '["--api-key"]', "--my-api-key value"])
def test_text_without_a_secret_value_is_left_alone(text):
    assert mask_text(text) == text


def _config(tmp_path: Path, extra: list[str]) -> str:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["runs"][0]["extra_args"] = list(doc["runs"][0].get("extra_args") or []) + extra
    doc["runs"][0]["drafter_update"] = "swap"
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return str(path)


SECRETS_FOR_CLI = ["plain", "spaces", "single-quote", "shell-meta", "unicode", "semicolon-inside"]


@pytest.mark.parametrize("verb", [["plan"], ["plan", "--json"], ["up", "--dry-run"], ["up", "--dry-run", "--json"],
                                  ["restart", "--dry-run"], ["restart", "--dry-run", "--json"], ["plan", "down"],
                                  ["plan", "nightly", "--json"]])
@pytest.mark.parametrize("form", ["admin-separate", "api-equals", "both"])
@pytest.mark.parametrize("name", SECRETS_FOR_CLI)
def test_plan_and_dry_runs_never_print_a_key(tmp_path, capsys, verb, form, name):
    secret = SECRETS[name]
    config = _config(tmp_path, FORMS[form](secret))
    assert main(["-c", config, *verb]) == 0
    out = capsys.readouterr()
    assert not _leaks(out.out + out.err, secret), out.out[-2000:]
    if "down" not in verb:
        assert MASK in out.out
    if "--json" in verb:
        json.loads(out.out)  # still a JSON document


HOST = Host(name="gpu-a", address="10.0.0.1", gpus=8, state_dir="/var/lib/deployctl")


def _run(extra: list[str]) -> Run:
    return Run(name="r", hosts=["gpu-a"], base_model="/m", drafter="/d", drafter_update="swap", tp_size=8,
               extra_args=extra)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("name", ["plain", "spaces", "shell-meta", "long"])
@pytest.mark.parametrize("playbook", ["up", "restart", "nightly", "down"])
def test_no_command_line_deployctl_sends_carries_a_key_but_the_servers_own(name, form, playbook):
    """What another user of the host sees in /proc/*/cmdline: every command deployctl plans (host
    lock, record writes, swap, benchmark, ...) is free of the key, the one exception being SGLang's own
    launch argv (SGLang reads the key from its command line only). Records go on stdin."""
    secret = SECRETS[name]
    run = _run(FORMS[form](secret))
    plans = plan_playbook(load_playbook(playbook), run, [HOST], lock=True)
    for step, actions in plans["gpu-a"]:
        for action in actions:
            if not isinstance(action, Command):
                continue
            line = action.command
            if step == "launch":
                # the server's own argv, once; nothing else of the script (its record is on stdin)
                server = line[line.index("setsid nohup "):line.index(" > ")]
                line = line.replace(server, "")
            assert not _leaks(line, secret), (step, action.description, line[:300])
            if action.stdin is not None:
                assert b"{" in action.stdin  # a record, on stdin
            # and the plan as shown (text and JSON)
            assert not _leaks(safe_text(action.shown), secret) and not _leaks(json.dumps(mask_secrets(action.to_dict())), secret)


@pytest.mark.parametrize("name", ["plain", "shell-meta", "unicode"])
def test_the_reload_reason_that_drops_a_key_is_masked_everywhere(name, capsys, tmp_path, monkeypatch):
    secret = SECRETS[name]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    argv = ["python3", "-m", "sglang.launch_server", "--speculative-draft-model-path", "/store/a", "--admin-api-key",
            secret]
    record = DeploymentRecord(run="r", argv=argv, drafter_fingerprint="a" * 64, drafter_path="/store/a", env_hash=None,
                              sglang_version="0.5.23", draft_tokens=4, env_file=None)
    want = DesiredDeployment.of_record(record.but(argv=argv[:-2])).with_drafter("/store/b", "b" * 64)
    decision = swap_decision(_run([]), want, RunningServer(record, True, 200, 42))
    assert decision.path == "reload" and "drops --admin-api-key" in decision.reason and secret in decision.reason
    print_json({"reason": decision.reason, "steps": [{"detail": decision.reason, "data": {"argv": argv}}]})
    print(safe_text(decision.reason))
    history.append([{"host": "gpu-a", "detail": decision.reason, "argv": argv}])
    out = capsys.readouterr().out
    assert not _leaks(out, secret) and "drops --admin-api-key ***" in out
    assert not _leaks(history.history_path().read_text(encoding="utf-8"), secret)


def _record_good_ctx(conn) -> StepContext:
    return StepContext(host=HOST, run=_run([]), settings=record_good.Settings(step=record_good.NAME), conn=conn,
                       launch_stamp="x", memory=StepMemory())


@pytest.mark.parametrize("name", ["plain", "shell-meta", "long"])
def test_the_last_good_record_travels_on_stdin(name):
    secret = SECRETS[name]
    conn = RecordingTransport(HOST, [Reply("write-file")])
    ctx = _record_good_ctx(conn)
    record = LastGood.model_validate({"run": "r", "argv": ["python3", "--admin-api-key", secret], "metrics": {},
                                      "env_file": None})
    ctx.execute(record_good.write_action(ctx, record, None))
    [command], [stdin] = conn.commands, conn.stdins
    assert secret not in command and "printf" not in command
    assert json.loads(stdin) == record.document()


@pytest.mark.parametrize("baselines", [100, 1000, 10_000])
def test_ten_thousand_baselines_fit_stdin_and_are_trimmed_when_written(baselines):
    entry = {"output_tok_s": 1000.0, "output_tok_s_rounds": [1000.0] * 12, "dataset": "builtin",
             "dataset_sha256": "b" * 64, "drafter_fingerprint": "c" * 64}
    previous = {"throughput_baselines": [entry | {"bench_settings": {"num_prompts": i}} for i in range(baselines)]}
    merged = record_good.merge_baselines(Metrics.model_validate(previous), Metrics(output_tok_s=None), keep=True)
    assert len(merged) == record_good.MAX_BASELINES
    assert merged[-1].bench_settings == {"num_prompts": baselines - 1}  # the newest kept
    # the whole hostile record still goes over stdin (the command line stays small)
    conn = RecordingTransport(HOST, [Reply("write-file")])
    ctx = _record_good_ctx(conn)
    record = LastGood.model_validate({"run": "r", "argv": ["x"], "metrics": previous})
    data = json.dumps(record.document(), sort_keys=True).encode()
    if len(data) + 1 > MAX_RECORD_BYTES:
        with pytest.raises(DeployError) as refused:
            record_good.write_action(ctx, record, None)
        assert refused.value.exit_code == ExitCode.IO and "the last good record" in str(refused.value)
        assert "gpu-a" in str(refused.value) and "not written" in str(refused.value)
        return
    ctx.execute(record_good.write_action(ctx, record, None))
    assert len(conn.commands[0]) < 4096 and len(conn.stdins[0]) == len(data) + 1


@pytest.mark.parametrize("size", [MAX_RECORD_BYTES - 100, MAX_RECORD_BYTES + 1, 4 * MAX_RECORD_BYTES])
def test_a_record_is_bounded_with_a_clear_error(size):
    record = {"pad": "x" * size}
    if size + 12 <= MAX_RECORD_BYTES:
        assert len(record_stdin(record, "gpu-a", "the deployment record")) <= MAX_RECORD_BYTES
        return
    with pytest.raises(DeployError) as refused:
        record_stdin(record, "gpu-a", "the deployment record")
    assert refused.value.exit_code == ExitCode.IO
    assert str(refused.value).startswith("gpu-a: the deployment record would be ") and "nothing changed" in str(refused.value)


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_sglangs_own_spelling_in_its_log_and_server_info_is_masked(name):
    """SGLang logs its ServerArgs at start-up (``deployctl logs`` prints it) and /server_info carries
    the fields: ``api_key='KEY'`` and ``"admin_api_key": "KEY"`` are masked like the flags."""
    secret = SECRETS[name]
    log_line = (f"[2026-12-04 12:00:00] server_args=ServerArgs(model_path='/m', api_key={secret!r}, "
                f"admin_api_key={secret + 'x'!r}, tp_size=8, api_key_header=None)")
    info = {"version": "0.5.23", "api_key": secret, "admin_api_key": secret, "tp_size": 8, "nested": {"api_key": secret}}
    for shown in (safe_text(log_line), safe_line(log_line), safe_text(json.dumps(info)),
                  json.dumps(mask_secrets(info), ensure_ascii=False), mask_text(json.dumps(info, ensure_ascii=False))):
        assert not _leaks(shown, secret), shown
    assert mask_secrets(info)["tp_size"] == 8 and "api_key_header=None" in safe_text(log_line)
