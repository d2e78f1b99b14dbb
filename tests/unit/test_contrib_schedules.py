"""The shipped crontab line and systemd service + timer: parsed, and verified by systemd when present."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "contrib" / "systemd"
CRONTAB = REPO / "contrib" / "cron" / "deployctl-nightly.crontab"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax: [Section], Key=Value, '#'/';' comments, keys may repeat."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path}:{number}: a setting before any [Section]"
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key), f"{path}:{number}: not Key=Value: {raw!r}"
        current.setdefault(key, []).append(value)
    return sections


def nightly_argv(command: str) -> list[str]:
    words = shlex.split(command)
    start = next(i for i, w in enumerate(words) if w.endswith("/deployctl"))
    end = next((i for i, w in enumerate(words) if w in (">", "||", "2>&1", ">>")), len(words))
    return words[start + 1:end]


def check_nightly_flags(argv: list[str]) -> None:
    assert argv[0] == "nightly"
    command = cli.get_command(None, "nightly")
    # click parses the flags exactly as the CLI would (no run: resilient_parsing)
    ctx = command.make_context("nightly", argv[1:], resilient_parsing=True)
    assert ctx.params["run_name"] == "kimi-k25-eagle3"


def test_service_runs_nightly_once_per_start():
    unit = parse_unit(SYSTEMD / "deployctl-nightly.service")
    service = unit["Service"]
    assert service["Type"] == ["oneshot"] and service["KillSignal"] == ["SIGINT"]
    [exec_start] = service["ExecStart"]
    check_nightly_flags(nightly_argv(exec_start))
    assert any(v.startswith("XDG_STATE_HOME=/") for v in service["Environment"])
    assert "network-online.target" in unit["Unit"]["After"]


def test_timer_starts_the_service_nightly():
    timer = parse_unit(SYSTEMD / "deployctl-nightly.timer")
    [calendar] = timer["Timer"]["OnCalendar"]
    assert re.fullmatch(r"\*-\*-\* \d\d:\d\d:\d\d", calendar)
    assert timer["Timer"]["Persistent"] == ["true"] and timer["Install"]["WantedBy"] == ["timers.target"]
    assert "Unit" not in timer["Timer"]  # the default: the service of the same name, which exists
    assert (SYSTEMD / "deployctl-nightly.service").is_file()


FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))


def test_crontab_line_is_valid_cron():
    lines = [ln for ln in CRONTAB.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    [line] = lines
    fields = line.split(None, 5)
    for value, (low, high) in zip(fields[:5], FIELD_RANGES):
        assert value == "*" or low <= int(value) <= high, value
    command = fields[5]
    assert "%" not in command  # cron turns an unescaped % into a newline
    check_nightly_flags(nightly_argv(command))
    subprocess.run(["sh", "-n", "-c", command], check=True)  # well-formed shell


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify(tmp_path):
    for name in ("deployctl-nightly.service", "deployctl-nightly.timer"):
        text = (SYSTEMD / name).read_text()
        # verify checks that ExecStart's program exists: point it at this checkout's deployctl
        deployctl = shutil.which("deployctl") or str(Path(__import__("sys").executable).with_name("deployctl"))
        (tmp_path / name).write_text(text.replace("/usr/local/bin/deployctl", deployctl))
    result = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "deployctl-nightly.service"),
                             str(tmp_path / "deployctl-nightly.timer")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "deployctl-nightly" not in result.stderr, result.stderr  # no warnings about our units


#: what the service must keep: a tool that reads ~/.ssh and writes only its state directory
SANDBOX = {"ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes", "NoNewPrivileges": "yes",
           "CapabilityBoundingSet": "", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
           "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes", "ProtectKernelLogs": "yes",
           "ProtectControlGroups": "yes", "StateDirectory": "deployctl", "UMask": "0077"}


@pytest.mark.parametrize("key", sorted(SANDBOX))
def test_service_is_sandboxed(key):
    service = parse_unit(SYSTEMD / "deployctl-nightly.service")["Service"]
    assert SANDBOX[key] in service.get(key, []), f"{key}={SANDBOX[key]} missing: {service.get(key)}"
    assert "@system-service" in service["SystemCallFilter"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_security_rates_the_service_ok(tmp_path):
    """9.2 UNSAFE before the sandboxing directives; 1.3 OK with them (systemd 252)."""
    unit = tmp_path / "deployctl-nightly.service"
    unit.write_text((SYSTEMD / "deployctl-nightly.service").read_text())
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True,
                            text=True, timeout=60)
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250)")
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.0, result.stdout[-3000:]


def test_the_crontab_comment_lists_every_exit_code_nightly_ends_with_unattended():
    """Issue 28: exit 13 (quarantined, nothing stopped) was missing, so cron mail showed a code nobody named."""
    comment = " ".join(line.lstrip("# ") for line in CRONTAB.read_text().splitlines() if line.startswith("#"))
    for code in (1, 9, 11, 12, 13):
        assert re.search(rf"\b{code}: ", comment), f"exit {code} is not explained in {CRONTAB.name}"


STATUS_CRONTAB = REPO / "contrib" / "cron" / "deployctl-status.crontab"


@pytest.mark.parametrize("code,stderr,mails", [
    (0, "", False),
    (0, "sb1: accept length unknown (no decode since the server started)\n", False),   # issue 27: was mailed
    (0, "warning: textfile directory /var/lib/node_exporter/textfile is missing\n", False),
    (12, "sb1: accept length 1.20 < 0.8 x 3.10 (last good)\n", True),
    (4, "sb2: cannot connect\n", True),
])
def test_status_crontab_is_quiet_unless_the_check_fails(tmp_path, code, stderr, mails):
    """What cron would mail: the line's output, run with a stand-in deployctl at its path."""
    [line] = [ln for ln in STATUS_CRONTAB.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    command = line.split(None, 5)[5]
    assert "%" not in command
    fake = tmp_path / "deployctl"
    fake.write_text(f"#!/bin/sh\nprintf 'a status table on stdout\\n'\nprintf '{stderr}' >&2\nexit {code}\n")
    fake.chmod(0o755)
    out = subprocess.run(["sh", "-c", command.replace("/usr/local/bin/deployctl", str(fake))],
                         capture_output=True, text=True, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    mailed = out.stdout + out.stderr
    assert bool(mailed) == mails, mailed
    if mails:
        assert f"exit {code}" in mailed and stderr.strip() in mailed and "status table" not in mailed
