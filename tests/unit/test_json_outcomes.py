"""Issue 42: every verb with ``--json`` prints one JSON document on stdout for every outcome, the
errors included: {"command", "ok": false, "exit_code", "error"} when it ends before its own document
(a config error, a usage error after or during parsing, a lock refusal, an internal error).

Generated: every --json verb x every error class, run in-process through ``main`` (no SSH: each
error happens before a host is reached)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.base.errors import ExitCode
from deploy.cli.main import cli, main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "kimi-k25-eagle3.yaml"

JSON_VERBS = ("doctor", "gpu-status", "status", "up", "restart", "down", "bench", "plan", "nightly", "history",
              "logs")
#: the verbs that take the local lock (engine.run.run_locked) before they reach a host
LOCKING = ("up", "restart", "down", "bench", "nightly")

#: a value the verb's own option refuses (click, before the verb runs: exit 2)
BAD_VALUE = {
    "doctor": ["--host"],  # an option without its value
    "gpu-status": ["--host"],
    "status": ["--window", "0"],
    "up": ["--draft-tokens", "many"],
    "restart": ["--draft-tokens", "many"],
    "down": ["--draft-tokens", "many"],
    "bench": ["--num-prompts", "0"],
    "plan": ["--draft-tokens", "many"],
    "nightly": ["--min-accept-fraction", "5"],
    "history": ["-n", "0"],
    "logs": ["-n", "0"],
}


def test_the_list_is_every_verb_that_takes_json():
    takes = {name for name, command in cli.commands.items() if any(p.name == "as_json" for p in command.params)}
    assert takes == set(JSON_VERBS)


def _case(kind: str, verb: str, tmp_path: Path) -> tuple[list[str], int]:
    """The command line of an error of ``kind`` for ``verb`` and the exit code it must end with."""
    no_config = verb == "history"  # history reads the local history file, never the config
    if kind == "missing config":
        return ["-c", str(tmp_path / "missing.yaml"), verb, "--json"], 0 if no_config else ExitCode.CONFIG
    if kind == "invalid YAML":
        bad = tmp_path / "bad.yaml"
        bad.write_text("hosts: [\n  - name: a\n")
        return ["-c", str(bad), verb, "--json"], 0 if no_config else ExitCode.CONFIG
    if kind == "unknown run":
        if verb == "gpu-status":  # it takes hosts, not a run
            return ["-c", str(EXAMPLE), verb, "--json", "--host", "nope"], ExitCode.USAGE
        return ["-c", str(EXAMPLE), verb, "--json", "--run", "nope"], 0 if no_config else ExitCode.USAGE
    if kind == "bad flag value":
        return ["-c", str(EXAMPLE), verb, "--json", *BAD_VALUE[verb]], ExitCode.USAGE
    if kind == "unknown option":
        return ["-c", str(EXAMPLE), verb, "--bogus", "--json"], ExitCode.USAGE
    raise AssertionError(kind)


def _one_document(out: str) -> dict:
    document = json.loads(out)  # the whole of stdout is one document
    assert isinstance(document, dict)
    return document


@pytest.mark.parametrize("kind", ["missing config", "invalid YAML", "unknown run", "bad flag value", "unknown option"])
@pytest.mark.parametrize("verb", JSON_VERBS)
def test_every_json_verb_prints_a_document_for_every_error(verb, kind, tmp_path, capsys):
    argv, expected = _case(kind, verb, tmp_path)
    assert main(argv) == expected
    captured = capsys.readouterr()
    document = _one_document(captured.out)
    assert "Traceback" not in captured.err
    if expected == 0:  # history: its own document, unchanged
        assert document["command"] == "history" and "records" in document
        return
    assert document == {"command": verb, "ok": False, "exit_code": int(expected), "error": document["error"]}
    assert document["error"] and document["error"] in captured.err  # the same message as stderr's
    assert captured.out.count("\n") == 1  # one line: it may end status --watch's one document per line


@pytest.mark.parametrize("verb", JSON_VERBS)
def test_an_internal_error_is_a_document_too(verb, monkeypatch, capsys):
    def bug(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("deploy.cli.main.Globals.load", bug)
    monkeypatch.setattr("deploy.local.history.read", bug)
    assert main(["-c", str(EXAMPLE), verb, "--json"]) == ExitCode.FAILED
    document = _one_document(capsys.readouterr().out)
    assert document == {"command": verb, "ok": False, "exit_code": 1, "error": "internal error: RuntimeError: boom"}


@pytest.mark.parametrize("verb", LOCKING)
def test_a_lock_refusal_is_a_document(verb, tmp_path, capsys):
    from deploy.config import load_config
    from deploy.engine.locks import local_lock, local_scopes, owner_info

    config = tmp_path / "deployctl.yaml"
    config.write_text(EXAMPLE.read_text())
    loaded = load_config(config)
    [run] = loaded.runs
    hosts = [h.name for h in loaded.hosts_of(run)]
    with local_lock(config, run.name, owner_info("nightly", run.name), local_scopes(hosts)):
        assert main(["-c", str(config), verb, "--json"]) == ExitCode.LOCKED
    document = _one_document(capsys.readouterr().out)
    assert document["exit_code"] == ExitCode.LOCKED and document["ok"] is False
    assert "is locked on this machine by" in document["error"] and "nightly" in document["error"]


def test_a_verb_that_printed_its_document_prints_no_second_one(monkeypatch, capsys):
    """A failure after the verb's own document (bench after a failed round): that document is the outcome."""
    from deploy.render import report as render

    printed = render.print_json

    def print_then_fail(*args, **kwargs):
        # the exit code is now decided before rendering (verbs/inspect.py): the failure comes after the print
        printed(*args, **kwargs)
        raise RuntimeError("after the document")

    monkeypatch.setattr("deploy.verbs.inspect.gpu_status", lambda config, hosts: [])
    monkeypatch.setattr("deploy.verbs.inspect.router_status", lambda config, hosts: [])
    monkeypatch.setattr(render, "print_json", print_then_fail)
    assert main(["-c", str(EXAMPLE), "gpu-status", "--json"]) == ExitCode.FAILED
    document = _one_document(capsys.readouterr().out)
    assert document["command"] == "gpu-status" and "error" not in document


@pytest.mark.parametrize("argv", [["-c", "/nonexistent.yaml", "plan"], ["plan", "--bogus"],
                                  ["plan", "--", "--json"], ["nonsense-verb", "--json"]])
def test_without_json_an_error_prints_nothing_on_stdout(argv, capsys):
    assert main(argv) != 0
    assert capsys.readouterr().out == ""


def test_the_issue_example_in_a_fresh_process(tmp_path):
    """The issue's report: `deployctl -c missing.yaml plan --json` exited 3 with nothing on stdout."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "deploy", "-c", str(tmp_path / "missing.yaml"), "plan", "--json"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == ExitCode.CONFIG
    assert json.loads(out.stdout) == {"command": "plan", "ok": False, "exit_code": 3,
                                      "error": f"{tmp_path / 'missing.yaml'}: file not found"}


def test_logs_json_has_each_hosts_path_and_lines_or_error(tmp_path, monkeypatch, capsys):
    """Issue 42: `logs --json`, one document for the run: per host its log path, the lines (terminal
    sequences stripped) or the error with its exit code; the verb's exit code is the first failing host's."""
    from deploy.base.errors import ConnectionFailed
    from deploy.config import load_config
    from deploy.engine.fanout import HostOutcome

    config = tmp_path / "two.yaml"
    config.write_text((REPO / "configs" / "two-hosts.yaml").read_text())
    a, b = load_config(config).hosts
    log = "\x1b[32mINFO\x1b[0m loaded\nThe server is fired up and ready to roll!\n"

    def read_logs(_config, hosts, lines):
        assert [h.name for h in hosts] == [a.name, b.name] and lines == 7
        return [HostOutcome(a, value=log), HostOutcome(b, error=ConnectionFailed(f"{b.name}: connection refused"))]

    monkeypatch.setattr("deploy.verbs.inspect.read_logs", read_logs)
    assert main(["-c", str(config), "logs", "--json", "-n", "7"]) == ExitCode.CONNECTION
    document = _one_document(capsys.readouterr().out)
    assert document["command"] == "logs" and document["ok"] is False and document["exit_code"] == 4
    first, second = document["hosts"]
    from deploy.host.state_layout import StatePaths

    assert first == {"host": a.name, "path": StatePaths(a.state_dir).latest_log, "ok": True, "exit_code": 0,
                     "lines": ["INFO loaded", "The server is fired up and ready to roll!"]}
    assert second == {"host": b.name, "path": StatePaths(b.state_dir).latest_log, "ok": False, "exit_code": 4,
                      "error": f"{b.name}: connection refused"}


def test_logs_json_refuses_follow_with_a_document(capsys):
    assert main(["-c", str(EXAMPLE), "logs", "--json", "--follow"]) == ExitCode.USAGE
    document = _one_document(capsys.readouterr().out)
    assert document["exit_code"] == 2 and "--follow" in document["error"]


def test_status_watch_json_ends_with_its_error_document_on_a_line_of_its_own(monkeypatch, capsys):
    """`status --watch --json` prints one document per round, one line each; an error that ends the
    watch (here the second round's read) is the last line: the error document."""
    from deploy.base.errors import ConnectionFailed
    from deploy.verbs import status

    reads = iter([[], ConnectionFailed("kimi-a: connection refused")])

    def gather(*_args, **_kwargs):
        value = next(reads)
        if isinstance(value, Exception):
            raise value
        return value

    monkeypatch.setattr(status, "gather", gather)
    monkeypatch.setattr(status, "document", lambda *_args, **_kwargs: {"command": "status", "hosts": []})
    assert main(["-c", str(EXAMPLE), "status", "--json", "--watch", "0.5", "--rounds", "3"]) == ExitCode.CONNECTION
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == [
        {"command": "status", "hosts": []},
        {"command": "status", "ok": False, "exit_code": 4, "error": "kimi-a: connection refused"}]
