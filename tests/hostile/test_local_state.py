"""deployctl's own local state (XDG state dir, history, local locks) made hostile: each case a clean
error (exit 10 naming the path) or a skipped line with a warning; never a hang, a traceback or
gigabytes read. Generated: every kind of non-regular file in every place a state file lives.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from deploy.local import history
from deploy.cli.main import main
from deploy.base.errors import ExitCode
from deploy.local.state import LocalStateError, state_home


def bounded(fn, seconds: float = 10.0):
    """Run ``fn`` in a thread; a call still running after ``seconds`` is the hang this guards against."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s (a blocking read or open)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- things that are not a regular file, made at a path --------------------------------------
def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_dir(path: Path) -> None:
    path.mkdir()


def make_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def make_dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


def make_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def make_urandom(path: Path) -> None:
    path.symlink_to("/dev/urandom")


NON_REGULAR = {"fifo": make_fifo, "directory": make_dir, "dev-zero": make_dev_zero, "dev-null": make_dev_null,
               "socket": make_socket, "dev-urandom": make_urandom}


def _run_cli(capsys, args):
    code = bounded(lambda: main(args))
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "Traceback" not in text and "internal error" not in text, text
    return code, captured


@pytest.mark.parametrize("kind", sorted(NON_REGULAR))
def test_history_verb_non_regular(capsys, kind):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    NON_REGULAR[kind](path)
    code, captured = _run_cli(capsys, ["history"])
    assert code == ExitCode.IO, captured.err
    assert str(path) in captured.err and "regular file" in captured.err


@pytest.mark.parametrize("kind", sorted(NON_REGULAR))
def test_history_append_non_regular_refused_at_once(kind):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    NON_REGULAR[kind](path)
    with pytest.raises(LocalStateError) as caught:
        bounded(lambda: history.append([{"host": "a", "outcome": "ok"}]))
    assert caught.value.exit_code == ExitCode.IO and str(path) in str(caught.value)


# not a FIFO or a socket: filelock opens such a lock file without blocking, which is harmless
@pytest.mark.parametrize("kind", sorted(set(NON_REGULAR) - {"fifo", "socket"}))
def test_history_lock_file_non_regular(kind):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = Path(str(path) + ".lock")
    NON_REGULAR[kind](lock)
    with pytest.raises(LocalStateError) as caught:
        bounded(lambda: history.append([{"host": "a"}]))
    assert str(lock) in str(caught.value)


def test_history_too_large(capsys):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(history.MAX_HISTORY_BYTES + 1)  # sparse: no disk used
    code, captured = _run_cli(capsys, ["history"])
    assert code == ExitCode.IO and str(path) in captured.err and "limit" in captured.err


GOOD = {"time": "2026-12-01T00:00:00+00:00", "verb": "up", "run": "r1", "host": "gpu-a", "outcome": "ok",
        "exit_code": 0, "duration_s": 1.0}
BAD_LINES = {
    "not-utf8": b"\xff\xfe{\"host\": \"x\"}",
    "latin1": json.dumps({"host": "caf\xe9"}).encode("latin-1").replace(b"\\u00e9", b"\xe9"),
    "deep-list-100k": b"[" * 100_000 + b"]" * 100_000,
    "deep-object-100k": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "deep-unclosed": b"[" * 200_000,
    "json-list": b"[1, 2]",
    "json-string": b'"up"',
    "json-number": b"42",
    "truncated": json.dumps(GOOD).encode()[:40],
    "nul-bytes": b"\x00" * 100,
    "huge-line": b'{"host": "' + b"a" * (history.MAX_RECORD_BYTES + 10) + b'"}',
    "lone-surrogate": b'{"host": "\xed\xa0\x80"}',
    "garbage": b"not json at all",
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_corrupt_history_line_skipped_with_warning(capsys, name, as_json):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    good = json.dumps(GOOD).encode()
    path.write_bytes(good + b"\n" + BAD_LINES[name] + b"\n" + good + b"\n")
    code, captured = _run_cli(capsys, ["history"] + (["--json"] if as_json else []))
    assert code == 0, captured.err
    assert f"{path}:2: skipped" in captured.err
    if as_json:
        assert len(json.loads(captured.out)["records"]) == 2
    else:
        assert captured.out.count("gpu-a") == 2


ESCAPES = {
    "osc-title": "\x1b]0;pwned\x07",
    "osc-clipboard": "\x1b]52;c;cm0gLXJmIH4=\x07",
    "csi-clear-line": "\x1b[2K\r",
    "carriage-return": "\rfake line",
    "c1-csi": "\x9b31m",
    "bell": "\x07",
    "backspace": "ok\x08\x08\x08",
    "bidi-override": "\u202egnp.exe",
    "newline-forgery": "ok\n12:00:00 [gpu-a] launch: ok",
    "del": "\x7f",
}


@pytest.mark.parametrize("field", ["host", "outcome", "sglang_version", "verb", "run", "drafter_fingerprint", "time"])
@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_history_text_escaped_on_terminal_raw_in_json(capsys, field, name):
    path = history.history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = ESCAPES[name]
    path.write_text(json.dumps(GOOD | {field: value}) + "\n")
    code, captured = _run_cli(capsys, ["history"])
    assert code == 0
    lines = captured.out.splitlines()
    assert len(lines) == 1, lines  # no forged second line
    for ch in lines[0]:
        assert ch == " " or ch.isprintable(), repr(lines[0])
    code, captured = _run_cli(capsys, ["history", "--json"])
    records = json.loads(captured.out)["records"]
    assert records[0][field] == value  # --json keeps the raw text as a JSON string


def test_history_table_on_a_terminal_escapes(monkeypatch):
    import io

    from deploy.render import report as render

    from rich.console import Console

    out = io.StringIO()
    rows = [GOOD | {"host": "\x1b]52;c;eA==\x07[red]x", "outcome": "\x1b[31mok"}]
    render.history_table(rows, Console(file=out, width=300, force_terminal=True, color_system=None))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]52;c;eA==\\x07[red]x" in text  # escaped, and [red] shown as text, not markup


# --- the state directory itself ----------------------------------------------------------------
def _file(tmp_path: Path) -> str:
    f = tmp_path / "a-file"
    f.write_text("x")
    return str(f)


def _file_parent(tmp_path: Path) -> str:
    return _file(tmp_path) + "/below"


XDG_CASES = {
    "a-file": _file,
    "below-a-file": _file_parent,
    "proc": lambda tmp: "/proc",
    "proc-self": lambda tmp: "/proc/self",
    "proc-sys": lambda tmp: "/proc/sys/kernel",
    "sys": lambda tmp: "/sys/kernel",
    "dev-null": lambda tmp: "/dev/null",
    "deployctl-is-a-file": lambda tmp: (Path(_file(tmp_path=tmp)).parent / "x", (tmp / "x").mkdir(),
                                        (tmp / "x" / "deployctl").write_text(""))[0].__str__(),
}


def _lock_args(tmp_path: Path):
    from deploy.engine.locks import local_lock

    config = tmp_path / "deployctl.yaml"
    config.write_text("hosts: []\n")
    return lambda: local_lock(config, "r1", {"pid": 1}).__enter__()


@pytest.mark.parametrize("case", sorted(XDG_CASES))
@pytest.mark.parametrize("use", ["history-append", "local-lock", "history-verb"])
def test_state_home_unusable(tmp_path, monkeypatch, capsys, case, use):
    xdg = XDG_CASES[case](tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", xdg)
    if use == "history-verb":
        code, captured = _run_cli(capsys, ["history"])
        assert code == ExitCode.IO, captured.err
        assert xdg in captured.err
        return
    action = (lambda: history.append([{"host": "a"}])) if use == "history-append" else _lock_args(tmp_path)
    with pytest.raises(LocalStateError) as caught:
        bounded(action)
    assert caught.value.exit_code == ExitCode.IO
    assert xdg in str(caught.value), str(caught.value)


@pytest.mark.parametrize("kind", sorted(set(NON_REGULAR) - {"directory"}))  # a directory is what it should be
def test_locks_folder_not_a_directory(tmp_path, kind):
    locks = state_home() / "locks"
    locks.parent.mkdir(parents=True, exist_ok=True)
    NON_REGULAR[kind](locks)
    with pytest.raises(LocalStateError) as caught:
        bounded(_lock_args(tmp_path))
    assert str(locks) in str(caught.value) and caught.value.exit_code == ExitCode.IO


@pytest.mark.parametrize("which", ["lock", "owner"])
@pytest.mark.parametrize("kind", ["directory", "fifo", "dev-zero", "socket"])
def test_lock_file_not_regular(tmp_path, which, kind):
    from deploy.engine.locks import local_lock_path

    config = tmp_path / "deployctl.yaml"
    config.write_text("hosts: []\n")
    path = local_lock_path(config, "r1")
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path if which == "lock" else path.with_name(path.name + ".owner.json")
    NON_REGULAR[kind](target)
    with pytest.raises(LocalStateError) as caught:
        bounded(_lock_args(tmp_path))
    assert str(target) in str(caught.value)


def test_history_survives_and_appends_normally():
    history.append([GOOD])
    history.append([GOOD | {"host": "gpu-b"}])
    assert [r["host"] for r in history.read()] == ["gpu-a", "gpu-b"]
    assert oct(os.stat(history.history_path()).st_mode & 0o777) == "0o600"
