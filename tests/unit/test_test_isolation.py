"""The tests see only their own sandbox's processes.

A newcomer runs the README's demo (its server stays up, as user dsb-demo1 on 127.0.0.20) and then
the tests; other users' SGLang processes may run on the same machine too. A process scan that
sees every user's processes (`pgrep -f sglang.launch_server`, `ps -e`) then counts servers that
are not the test's: the suite failed 4 tests that way. Every scan in the tests names its user.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
#: a process listing of every user: pgrep/pkill without -u/-U, ps -e/-A/ax/aux
MACHINE_WIDE = [
    (re.compile(r"\b(pgrep|pkill)\s(?!(?:[^\"'\n]*\s)?-[uU]\b)"), "pgrep/pkill without -u <user>"),
    (re.compile(r"\bps\s+(-[a-zA-Z]*[eA][a-zA-Z]*\b|a?ux\b|ax\b)"), "ps listing every process"),
]


def scans(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in MACHINE_WIDE:
            if pattern.search(line):
                found.append(f"{number}: {what}: {line.strip()}")
    return found


@pytest.mark.parametrize("line, machine_wide", [
    ("pgrep -a -f 'sglang.launch_server'", True),
    ("pkill -f sglang", True),
    ("ps -eo args", True),
    ("ps aux | grep sglang", True),
    ("ps -A -o pid=", True),
    ("pgrep -a -u \"$(id -u)\" -f 'sglang.launch_server'", False),
    ("pkill -KILL -u dsb-sb1", False),
    ("ps -u $(id -u) -o stat=,args=", False),
    ("ps -o stat= -p 1234", False),
])
def test_the_scan_tells_machine_wide_listings_apart(line, machine_wide):
    assert bool(scans(line)) is machine_wide


def test_no_test_lists_every_users_processes():
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve() or "benchmarks" in path.parts:
            continue
        found = scans(path.read_text())
        if found:
            offenders[str(path.relative_to(TESTS))] = found
    assert offenders == {}, offenders
