"""Issue 21: `status --watch` on a real terminal (tmux), without the sandbox: a host on a loopback
address where nothing listens is read every round (unreachable, exit 4 per read), and the table
must be redrawn in place, never scrolled; Ctrl-C ends the watch with exit 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def config(tmp_path: Path) -> Path:
    key = tmp_path / "id_ed25519"
    key.write_text("not a key\n")
    key.chmod(0o600)
    (tmp_path / "known_hosts").write_text("")
    doc = {"ssh": {"known_hosts": str(tmp_path / "known_hosts"), "connect_timeout_s": 2, "connect_retries": 0,
                   "config_file": "none"},
           "hosts": [{"name": "dead-1", "address": "127.0.0.99", "port": 1, "user": "nobody",
                      "identity_file": str(key), "gpus": 8, "state_dir": "/var/lib/deployctl"}],
           "runs": [{"name": "r", "hosts": ["dead-1"], "base_model": "/m", "drafter": "/d"}]}
    path = tmp_path / "deployctl.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (tests/bootstrap.sh installs it)")
def test_watch_redraws_one_table_in_place_on_a_terminal_and_ctrl_c_exits_0(tmp_path):
    path = config(tmp_path)
    socket = str(tmp_path / "tmux.sock")
    tmux = ["tmux", "-S", socket]
    # pytest-xdist's workers have COLUMNS=80 and LINES=24 in their environment: the terminal's own
    # size must decide the table's width, as on a user's terminal
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(XDG_STATE_HOME=str(tmp_path / "state"), TERM="xterm-256color")
    command = f"{sys.executable} -m deploy -c {path} status --watch 1; echo EXIT=$?; sleep 60"
    subprocess.run(tmux + ["new-session", "-d", "-s", "w", "-x", "220", "-y", "30", command],
                   check=True, env=env, cwd=REPO)
    try:
        def pane() -> str:
            return subprocess.run(tmux + ["capture-pane", "-p", "-t", "w"], capture_output=True, text=True).stdout

        titles: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(set(titles)) < 3:  # bounded: three redraws or a minute
            screen = pane()
            found = [ln for ln in screen.splitlines() if "run r, " in ln and "live / last good" in ln]
            assert len(found) <= 1, screen  # never two tables on the screen: redrawn, not appended
            if found and "dead-1" in screen and "unreachable" in screen:
                titles.append(found[0])
            time.sleep(0.2)
        assert len(set(titles)) >= 3, pane()  # its time stamp changed: the table was redrawn
        subprocess.run(tmux + ["send-keys", "-t", "w", "C-c"], check=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "EXIT=" not in pane():
            time.sleep(0.1)
        screen = pane()
        assert "EXIT=0" in screen and "status --watch: stopped (Ctrl-C)" in screen, screen
        assert screen.count("live / last good, min") == 1 and "Traceback" not in screen, screen
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def test_watch_without_a_terminal_prints_plain_lines_each_round(tmp_path):
    path = config(tmp_path)
    done = subprocess.run([sys.executable, "-m", "deploy", "-c", str(path), "status", "--watch", "0.5",
                           "--rounds", "3"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state")))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(" dead-1 unreachable " in ln for ln in lines), lines
    assert "\x1b" not in done.stdout


def test_check_on_an_unreachable_host_exits_4_naming_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "deploy", "-c", str(config(tmp_path)), "status", "--check"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state")))
    assert done.returncode == 4, done.stderr
    assert "dead-1: unreachable: " in done.stderr and "Traceback" not in done.stderr
