"""The documented exit codes for paths given on the command line: ``-c`` naming a directory, a
device, a FIFO or nothing is a config error (3), never click's usage error (2) or a hang."""

from __future__ import annotations

import os
import time

import pytest

from deploy.cli.main import main


def _dir(tmp_path):
    d = tmp_path / "confdir"
    d.mkdir()
    return str(d)


def _dir_slash(tmp_path):
    return _dir(tmp_path) + "/"


def _fifo(tmp_path):
    f = tmp_path / "conf.fifo"
    os.mkfifo(f)
    return str(f)


CASES = {"directory": _dir, "directory-slash": _dir_slash, "fifo": _fifo, "dev-null": lambda t: "/dev/null",
         "dev-zero": lambda t: "/dev/zero", "proc": lambda t: "/proc", "missing": lambda t: str(t / "nope.yaml"),
         "root": lambda t: "/"}


@pytest.mark.parametrize("verb", [["plan"], ["gpu-status"], ["doctor"], ["history"]])
@pytest.mark.parametrize("case", sorted(CASES))
def test_config_path_problems_exit_3(tmp_path, capsys, case, verb):
    path = CASES[case](tmp_path)
    started = time.monotonic()
    code = main(["-c", path, *verb])
    captured = capsys.readouterr()
    assert time.monotonic() - started < 10
    text = captured.out + captured.err
    assert "Traceback" not in text
    if verb == ["history"]:
        assert code == 0  # history reads no config
        return
    assert code == 3, text
    assert path.rstrip("/") in text or path in text
