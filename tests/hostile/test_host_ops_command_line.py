"""host_ops.py's own command-line parser (a table, not argparse: argparse cost ~8 ms of CPU on each host
command) against the argparse parser it replaced, on generated command lines: both take a line with the
same values, or both refuse it (exit 2, usage on stderr). Every command line the product builds parses.

The reference below is host_ops.py's parser as of commit 15a76e0, word for word in what it accepts,
values that start with '-' included ('--exclude --x' is a missing value, '--grace -1' a value)."""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import shlex

import pytest

from deploy.facts import helpers, host_helper
from deploy.remote import host_ops, host_ops_args


def reference_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="host_ops.py")
    sub = parser.add_subparsers(dest="command", required=True)
    stop = sub.add_parser("stop-processes")
    stop.add_argument("--scope", choices=("user", "pidfile"), required=True)
    stop.add_argument("--pidfile", default="")
    stop.add_argument("--expect", default="sglang")
    stop.add_argument("--record", default="")
    stop.add_argument("--grace", type=float, default=30.0)
    stop.add_argument("--exclude", action="append", default=[])
    probe = sub.add_parser("probe")
    probe.add_argument("--url", required=True)
    probe.add_argument("--pid", type=int, required=True)
    probe.add_argument("--log", default="")
    probe.add_argument("--timeout", type=float, default=5.0)
    state = sub.add_parser("server-state")
    state.add_argument("--pidfile", required=True)
    state.add_argument("--record", required=True)
    state.add_argument("--url", required=True)
    state.add_argument("--timeout", type=float, default=5.0)
    accept = sub.add_parser("accept-check")
    accept.add_argument("--base", required=True)
    accept.add_argument("--requests", type=int, default=4)
    accept.add_argument("--max-new-tokens", type=int, default=256)
    accept.add_argument("--timeout", type=float, default=300.0)
    accept.add_argument("--concurrency", type=int, default=1)
    accept.add_argument("--prompts-json", default="")
    accept.add_argument("--key-from", default="")
    key = sub.add_parser("api-key")
    key.add_argument("--record", required=True)
    health = sub.add_parser("watch-health")
    health.add_argument("--url", required=True)
    health.add_argument("--pid", type=int, required=True)
    health.add_argument("--log", default="")
    health.add_argument("--timeout", type=float, default=5.0)
    health.add_argument("--interval", type=float, default=0.2)
    gpus = sub.add_parser("watch-gpus")
    gpus.add_argument("--gpu-query", required=True)
    gpus.add_argument("--apps-query", required=True)
    gpus.add_argument("--interval", type=float, default=0.1)
    for watch in (health, gpus):
        watch.add_argument("--every", type=float, default=1.0)
        watch.add_argument("--for", dest="timeout_total", type=float, required=True)
        watch.add_argument("--until-stdin-eof", action="store_true")
    write = sub.add_parser("write-file")
    write.add_argument("path")
    write.add_argument("--mode", default="600")
    return parser


def reference(argv: list[str]) -> dict | None:
    """The namespace argparse made, or None where it refused (SystemExit 2)."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = reference_parser().parse_args(argv)
    except SystemExit as stop:
        assert stop.code == 2
        return None
    if args.command == "stop-processes" and args.scope == "pidfile" and not args.pidfile:
        return None  # main()'s parser.error: exit 2
    return vars(args)


def table(argv: list[str]) -> dict | None:
    try:
        return vars(host_ops_args.parse_args(argv))
    except host_ops_args.UsageError:
        return None


VALUES = ["5", "0", "17", "2.5", "1e3", "inf", "abc", "http://127.0.0.1:30000", "/srv/a b/record.json",
          "user", "pidfile", "", "=x", "a=b", " 7", "0x10", "pid file",
          "-1", "-2.5", "-x", "--url", "-", "--a b", "-1e3"]


def generated_lines(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    verbs = list(host_ops_args.VERBS)
    lines = []
    for _ in range(count):
        verb = rng.choice(verbs + ["nope", "--scope"])
        specs = host_ops_args.VERBS.get(verb, host_ops_args.VERBS["probe"])
        flags = [flag.rstrip("!") for flag, _, _, _ in specs]
        words: list[str] = [verb]
        for _ in range(rng.randint(0, len(flags) + 2)):
            flag = rng.choice(flags + ["--bogus", "--url", "PATH"])
            if flag == "PATH":
                words.append(rng.choice(["/srv/f", "x", "PATH", "PATH=x"]))
                continue
            kind = dict((f.rstrip("!"), k) for f, _, k, _ in specs).get(flag)
            if kind == "flag" and rng.random() < 0.8:
                words.append(flag)
                continue
            value = rng.choice(VALUES)
            if rng.random() < 0.3:
                words.append(f"{flag}={value}")
            elif rng.random() < 0.05:
                words.append(flag)  # its value missing (at the end) or the next flag taken for it
            else:
                words += [flag, value]
        if rng.random() < 0.6:  # mostly complete lines: add what each verb requires
            for flag, _, kind, _ in specs:
                if flag.endswith("!") and flag.rstrip("!") not in words:
                    words += [flag.rstrip("!"), rng.choice(kind if isinstance(kind, tuple) else ["5", "u"])]
            if verb == "write-file" and rng.random() < 0.8:
                words.insert(rng.randint(1, len(words)), "/srv/state.json")
        lines.append(words)
    return lines


@pytest.mark.parametrize("seed", range(12))
def test_the_table_takes_and_refuses_what_argparse_did(seed):
    lines = generated_lines(seed, 150)
    taken = 0
    for argv in lines:
        expected, got = reference(argv), table(argv)
        assert got == expected, argv
        taken += expected is not None
    assert 3 < taken < len(lines)  # both outcomes were tried


def test_every_command_line_the_product_builds_parses():
    python, helper = "python3", "/home/u/.deployctl/helpers/host_ops.py"
    lines = [
        host_helper.stop_processes_command(python, helper, "user", 30, exclude=["sglang-router", "a b"]),
        host_helper.stop_processes_command(python, helper, "pidfile", 2.5, pidfile="/run/x.pid", record="/r.json"),
        host_helper.probe_command(python, helper, "http://127.0.0.1:30000/health", 42, "/srv/log"),
        host_helper.accept_check_command(python, helper, "http://127.0.0.1:30000", 4, 256,
                                         prompts=["a --b", "c"], concurrency=2, key_from="/r.json"),
        host_helper.watch_health_command(python, helper, "http://h/health", 7, "/l", interval_s=0.2, every_s=1,
                                         for_s=900),
        host_helper.watch_gpus_command(python, helper, "nvidia-smi --query-gpu=memory.used", "nvidia-smi -q",
                                       interval_s=0.1, every_s=1, for_s=120),
        helpers.write_file_command(python, helper, "/srv/state.json", 0o644),
    ]
    for line in lines:
        words = shlex.split(line)
        start = words.index(helper) + 1
        argv = words[start:]
        assert table(argv) == reference(argv) is not None, line


@pytest.mark.parametrize("argv, message", [
    ([], "a verb is needed"),
    (["probe", "--url", "u"], "the following arguments are required: --pid"),
    (["probe", "--url", "u", "--pid", "x"], "--pid needs an integer, not 'x'"),
    (["watch-gpus", "--for=1", "--gpu-query", "q", "--apps-query", "q", "--until-stdin-eof=1"], "takes no value"),
    (["stop-processes", "--scope", "all"], "--scope must be one of user, pidfile"),
    (["stop-processes", "--scope", "pidfile"], "--scope pidfile needs --pidfile"),
    (["write-file"], "required: PATH"),
])
def test_a_refusal_exits_2_with_usage_and_the_reason(argv, message, capsys):
    assert host_ops.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: host_ops.py VERB")
    assert message in captured.err.splitlines()[-1]


def test_help_prints_usage_and_exits_0(capsys):
    assert host_ops.main(["--help"]) == 0
    assert capsys.readouterr().out == host_ops_args.USAGE
