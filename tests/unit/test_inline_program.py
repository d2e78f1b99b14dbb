"""deploy/facts/inline.py: several module sources as one ``python3 -c`` program, and its size after
the two layers of shell quoting a remote command goes through (Linux: 128 KiB per argument)."""

from __future__ import annotations

import json
import random
import shlex
import string
import subprocess
import sys

import pytest

from deploy.config.models import Host, Run
from deploy.facts import doctor
from deploy.facts.inline import MAX_ARG_STRLEN, InlineProgramTooLarge, inline_program
from deploy.ssh.transport import CommandResult, remote_timeout_wrap

PACKAGE = [("pkg.errors", "class Oops(Exception):\n    pass\n"),
           ("pkg.sub.reader", "from ..errors import Oops\n\ndef read(x):\n    if x < 0:\n        raise Oops('neg')\n"
                              "    return x * 2\n"),
           ("tool", "import sys\nfrom pkg.sub.reader import read\nfrom pkg.errors import Oops\n"
                    "if __name__ == '__main__':\n    try:\n        print(read(int(sys.argv[1])))\n"
                    "    except Oops as exc:\n        print('refused', exc)\n        sys.exit(3)\n")]


def run_through_two_shells(program: str, *args: str) -> subprocess.CompletedProcess:
    """As a host runs it: sshd's login shell gets one string holding ``timeout ... sh -c '<command>'``."""
    command = " ".join([shlex.quote(sys.executable), "-c", shlex.quote(program)] + [shlex.quote(a) for a in args])
    return subprocess.run(["sh", "-c", remote_timeout_wrap(command, 30)], capture_output=True, text=True, timeout=60)


def test_modules_import_each_other_and_the_entry_runs_as_main():
    program = inline_program(PACKAGE, "tool")
    done = run_through_two_shells(program, "21")
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    refused = run_through_two_shells(program, "-1")
    assert refused.returncode == 3 and refused.stdout == "refused neg\n"   # one Oops class across modules


def test_the_program_has_no_quote_so_quoting_does_not_grow_it():
    program = inline_program(PACKAGE, "tool")
    assert "'" not in program and len(shlex.quote(program)) == len(program) + 2


def test_a_bad_bundle_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="entry module 'main'"):
        inline_program(PACKAGE, "main")
    with pytest.raises(ValueError, match="repeat"):
        inline_program(PACKAGE + [PACKAGE[0]], "tool")


def test_an_oversized_bundle_is_refused_naming_the_limit():
    rng = random.Random(7)              # incompressible: zlib cannot shrink it under the limit
    noise = "".join(rng.choice(string.ascii_letters) for _ in range(200_000))
    with pytest.raises(InlineProgramTooLarge) as exc:
        inline_program([("big", f"X = {noise!r}\n")], "big")
    assert str(MAX_ARG_STRLEN) in str(exc.value)


def test_the_doctor_command_fits_in_one_argument_after_two_layers_of_quoting():
    host = Host(name="gpu-a", address="10.1.2.3", state_dir="~/it's state")       # quotes in paths grow it
    run = Run(name="r", hosts=["gpu-a"], base_model="/data/it's model", drafter="/data/it's drafter")
    for command in (doctor.host_command(host, run), doctor.sglang_command(run, ["KimiK25ForConditionalGeneration"])):
        wrapped = remote_timeout_wrap(command, 60)          # the login shell's one -c argument
        assert len(wrapped.encode()) < MAX_ARG_STRLEN // 2, len(wrapped)
        assert len(shlex.quote(wrapped).encode()) < MAX_ARG_STRLEN // 2        # and quoted once more


def test_the_doctor_program_runs_through_two_shells():
    spec = {"architectures": ["KimiK25ForConditionalGeneration"]}
    done = run_through_two_shells(doctor.doctor_program(), "sglang", json.dumps(spec))
    assert done.returncode == 0, done.stderr
    facts = doctor.parse_sglang_facts(CommandResult("sglang", done.returncode, done.stdout, done.stderr, 0.0), "gpu-a")
    assert facts.mode == "sglang" and facts.imported_sglang is False


def test_a_module_is_compiled_only_when_imported_and_the_bundles_copy_wins(tmp_path):
    """The doctor's SGLang part never imports host_ops: the loader compiles a module on its first
    import, so a module nobody imports costs nothing (here it is not even Python), while one that
    is imported still fails loudly; and a module of the bundle wins over one of the same name on
    the host's sys.path, as when every module was registered up front."""
    unused = PACKAGE + [("unused", "def (:\n")]
    done = run_through_two_shells(inline_program(unused, "tool"), "21")
    assert done.returncode == 0 and done.stdout == "42\n", done.stderr
    imported = [("unused", "def (:\n"), ("main", "import unused\n")]
    done = run_through_two_shells(inline_program(imported, "main"))
    assert done.returncode == 1 and "SyntaxError" in done.stderr
    (tmp_path / "shadow.py").write_text("WHO = 'the host'\n")
    bundle = [("shadow", "WHO = 'the bundle'\n"), ("main", "import shadow\nprint(shadow.WHO)\n")]
    command = " ".join([f"PYTHONPATH={shlex.quote(str(tmp_path))}", shlex.quote(sys.executable), "-c",
                        shlex.quote(inline_program(bundle, "main"))])
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "the bundle\n", done.stderr


def test_a_program_is_built_once_however_many_host_workers_ask_at_once():
    """Issue 37: every host worker of a run asks for the same program at its first step; with
    ``functools.lru_cache`` alone each worker that asked before the first build ended built it again
    (8 doctor programs for 12 hosts, a zlib compression of 150 kB each)."""
    from concurrent.futures import ThreadPoolExecutor
    import threading

    from deploy.base.once import built_once

    workers = 8
    gate = threading.Barrier(workers)
    builds: list[int] = []
    others_arrived = threading.Event()

    @built_once
    def program() -> str:
        builds.append(1)
        # with a cache that does not serialise the first build, the others come in here meanwhile
        others_arrived.wait(1.0)
        return "the program"

    def ask() -> str:
        gate.wait(10)
        return program()

    with ThreadPoolExecutor(workers) as pool:
        answers = [f.result(30) for f in [pool.submit(ask) for _ in range(workers)]]
    assert answers == ["the program"] * workers
    assert len(builds) == 1, f"built {len(builds)} times"
    assert program() == "the program" and len(builds) == 1


@pytest.mark.parametrize("builder", ["deploy.facts.doctor:doctor_program", "deploy.facts.status:status_program",
                                     "deploy.fleet.router:fleet_ops_program", "deploy.engine.locks:host_lock_program",
                                     "deploy.facts.quarantine:update_program", "deploy.facts.helpers:helper_payloads",
                                     "deploy.local.datasets:builtin"])
def test_every_program_a_run_sends_to_each_host_is_built_once_per_process(builder):
    """And the built-in prompt set every host's benchmark reads: each builder is a ``built_once`` (the
    test above: one build however many threads ask), and later calls get the very same value."""
    import importlib

    from deploy.base.once import built_once

    module, name = builder.split(":")
    function = getattr(importlib.import_module(module), name)
    assert isinstance(function, built_once), f"{builder} is not built_once"
    assert function() is function()
