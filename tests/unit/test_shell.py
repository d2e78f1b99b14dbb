import subprocess

import pytest

from deploy.base import shell

HOSTILE = ["plain", "with space", "it's", 'dq"', "$(touch /tmp/pwned)", "`id`", "a;b", "*", "\\n", "-rf", "~", "x\ny"]


@pytest.mark.parametrize("value", HOSTILE)
def test_quoted_value_arrives_as_one_literal_argument(value):
    out = subprocess.run(["sh", "-c", f"printf '%s\\0' {shell.quote(value)}"], capture_output=True, check=True)
    assert out.stdout == value.encode() + b"\0"


def test_tilde_paths_expand_but_rest_is_literal(tmp_path):
    env = {"HOME": "/home/u", "PATH": "/usr/bin:/bin"}
    cmd = f"printf '%s\\0' {shell.quote_path('~/a b/$(id)')} {shell.quote_path('/x/~/y')} {shell.quote_path('~')}"
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, check=True, env=env)
    assert out.stdout.split(b"\0")[:3] == [b"/home/u/a b/$(id)", b"/x/~/y", b"/home/u"]


def test_glob_expands_only_wildcards(tmp_path):
    d = tmp_path / "dir $x"
    d.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "other"):
        (d / name).touch()
    pattern = shell.quote_glob(f"{d}/nvidia*")
    out = subprocess.run(["sh", "-c", f"printf '%s\\n' {pattern}"], capture_output=True, check=True, text=True)
    assert sorted(out.stdout.split("\n")[:-1]) == sorted(str(d / n) for n in ("nvidia0", "nvidia1", "nvidiactl"))
    with pytest.raises(ValueError):
        shell.quote_glob("/dev/nvidia[0-3]")
