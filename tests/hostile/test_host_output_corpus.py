"""Hostile host output: nested, huge or malformed JSON from the host-side helpers, and a fixer that
crashed, end in a clean RemoteOutputError (exit 5) naming the host, never a traceback or its text."""

from __future__ import annotations

import pytest

from deploy.base.errors import ExitCode, RemoteOutputError
from deploy.facts.fixer import exit_code_of
from deploy.facts.host_helper import parse_accept_check, parse_probe, parse_stop_report
from deploy.steps import fix_keys
from deploy.ssh.transport import CommandResult

PARSERS = {"verify-acceptance": parse_accept_check, "wait-ready": parse_probe,
           "stop-stale": parse_stop_report,
           "fix-keys": lambda out, source: fix_keys.parse_fixer_json(CommandResult("x", 0, out, "", 0.1), source)}

OUTPUTS = [("deep-array", "[" * 100000 + "]" * 100000), ("deep-object", '{"a":' * 50000 + "1" + "}" * 50000),
           ("empty", ""), ("text", "hello"), ("list", "[]"), ("null", "null"), ("binary", "\x00\xff\x01"),
           ("truncated", '{"ok": tr'), ("nan", '{"ok": NaN}')]


@pytest.mark.parametrize("output_name,output", OUTPUTS, ids=[o[0] for o in OUTPUTS])
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_bad_helper_output_is_exit_5(parser, output_name, output):
    with pytest.raises(RemoteOutputError) as err:
        PARSERS[parser](output, "gpu-a")
    assert err.value.exit_code == ExitCode.REMOTE_OUTPUT
    assert "gpu-a" in str(err.value) and "Traceback" not in str(err.value)


def test_a_crashed_fixer_is_reported_without_its_traceback():
    stderr = ('Traceback (most recent call last):\n  File "/x/fix_eagle3_keys.py", line 1, in <module>\n'
              "    main()\nRecursionError: maximum recursion depth exceeded\n")
    with pytest.raises(RemoteOutputError) as err:
        fix_keys.parse_fixer_json(CommandResult("x", 1, "", stderr, 0.1), "gpu-a")
    message = str(err.value)
    assert "Traceback" not in message and 'File "' not in message
    assert "the fixer crashed: RecursionError" in message


@pytest.mark.parametrize("code", [99, None, [6], -1, "x"])
def test_fixer_error_with_an_exit_code_deployctl_does_not_have(code):
    with pytest.raises(RemoteOutputError) as err:
        exit_code_of(code, "gpu-a")
    assert "gpu-a" in str(err.value)


def test_fixer_error_exit_code_is_kept():
    assert exit_code_of(6, "gpu-a") == ExitCode.CHECKPOINT
