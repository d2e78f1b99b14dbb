"""SIGKILL the fixer at named stages and at random instants; every file must stay loadable.

After each kill: every weights file loads with the real safetensors library as either the complete
old or the complete new version (names and bytes), config.json and the index are valid JSON, old
or new; re-running the fixer completes the job; --restore brings back the original bytes exactly.

Named stages use the fixer's test hook DEPLOYCTL_FIX_KILL_AT (the process SIGKILLs itself there).
Random instants: a driver process imports the fixer, reports ready, and runs it when told to, with a
profile hook that counts the run's calls that change or settle what is on disk (os.* and file
methods: write, pwrite, fsync, rename, replace, unlink, close...) and SIGKILLs the process itself at
a seeded random one of them, before or after it. The instant is a point in the run's own progress,
so the machine's load cannot move it: a wall-clock delay in the test (and, later, a CPU-time timer,
which ticks only every few ms) let every kill of a 5-20 ms run land before its first write, or after
its last, on a busy CI host.
"""

from __future__ import annotations

import base64
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from safetensors.numpy import load_file

from deploy.remote import fixer as fix
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import contents, make_speculators_drafter

FIXER = fixer_zipapp()
SIDECAR = ".deployctl-fix-backup.json"
TIMEOUT = 30
CHUNK = "65536"          # DEPLOYCTL_FIX_COPY_CHUNK: many chunks, so kills land mid-copy

DRIVER = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import fixer as f
sys.stdout.write("ready\n"); sys.stdout.flush()
target = int(sys.stdin.readline().split()[1])     # 0: run to the end and count
sink = open(os.devnull, "w")
seen = 0
# the calls that change or settle what is on disk (reads are most of a run's calls and change nothing)
CHANGES = {"write", "pwrite", "writelines", "flush", "fsync", "fdatasync", "truncate", "ftruncate",
           "rename", "replace", "unlink", "remove", "link", "symlink", "mkdir", "rmdir", "close"}
def on_call(frame, event, fn):
    global seen
    if event not in ("c_call", "c_return"):
        return
    owner = getattr(fn, "__module__", None) or type(getattr(fn, "__self__", None)).__module__
    if (owner in ("posix", "_io", "io") and fn.__name__ in CHANGES
            and getattr(fn, "__self__", None) is not sink):
        seen += 1
        if seen == target:
            os.kill(os.getpid(), signal.SIGKILL)
sys.setprofile(on_call)
code = f.main(sys.argv[2:], stdout=sink, stderr=sink)
sys.setprofile(None)
sys.stdout.write("done %d\n" % seen); sys.stdout.flush()
sys.exit(code)
"""


class Scenario(object):
    """A template drafter, its state before and after a clean conversion, and the CLI flags."""

    def __init__(self, root: Path, name: str, make, flags: List[str], kwargs: Dict[str, object],
                 full_backup: bool = False) -> None:
        self.name = name
        self.flags = flags + (["--full-backup"] if full_backup else [])
        self.kwargs = dict(kwargs, full_backup=full_backup)
        self.template = root / name / "template"
        make(self.template)
        self.original = contents(self.template)
        self.old = state(self.template)
        done = root / name / "converted"
        shutil.copytree(self.template, done)
        fix.convert(done, **self.kwargs)
        self.new = state(done)
        assert self.new["files"] != self.old["files"]
        self.trial = 0

    def fresh(self, tmp: Path) -> Path:
        self.trial += 1
        target = tmp / ("%s-%d" % (self.name, self.trial))
        shutil.copytree(self.template, target)
        return target


def state(directory: Path) -> Dict[str, object]:
    """What a loader sees: every tensor of every file (via safetensors) and the JSON files."""
    files = {}
    for path in sorted(directory.glob("*.safetensors")):
        files[path.name] = {k: (str(v.dtype), v.shape, v.tobytes())
                            for k, v in load_file(str(path)).items()}
    out = {"files": files}
    for name in ("config.json", "model.safetensors.index.json"):
        if (directory / name).exists():
            out[name] = json.loads((directory / name).read_text())
    return out


def assert_old_or_new(directory: Path, scenario: Scenario) -> str:
    """Check the invariant; return where the run stopped, e.g. 'backup+new,old+config:old'."""
    now = state(directory)
    assert set(now["files"]) == set(scenario.old["files"])
    where = []
    for name, tensors in sorted(now["files"].items()):
        assert tensors in (scenario.old["files"][name], scenario.new["files"][name]), name
        where.append("new" if tensors == scenario.new["files"][name] else "old")
    where = [",".join(where)]
    for name in ("model.safetensors.index.json", "config.json"):
        if name in scenario.old:
            assert now[name] in (scenario.old[name], scenario.new[name]), name
            where.append("%s:%s" % (name.split(".")[0], "new" if now[name] == scenario.new[name]
                                    else "old"))
    if (directory / SIDECAR).exists():
        sidecar = json.loads((directory / SIDECAR).read_text())
        assert sidecar["format"] == "deployctl-fix-backup"
        where.insert(0, "backup")
    return "+".join(where)


def finish_and_restore(directory: Path, scenario: Scenario) -> None:
    summary = fix.convert(directory, **scenario.kwargs)
    assert summary["status"] in ("converted", "already_converted")
    assert summary["verification"]["ok"] is True
    assert state(directory) == scenario.new
    again = fix.convert(directory, **scenario.kwargs)
    assert again["status"] == "already_converted"
    fix.restore(directory)
    restored = {k: v for k, v in contents(directory).items() if not k.endswith(".orig")}
    assert restored == scenario.original


def run_killed_at(directory: Path, scenario: Scenario, stage: str, extra: List[str] = ()) -> int:
    env = dict(os.environ, DEPLOYCTL_FIX_KILL_AT=stage, DEPLOYCTL_FIX_COPY_CHUNK=CHUNK)
    argv = [sys.executable, str(FIXER)] + list(extra or scenario.flags) + [str(directory)]
    result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            timeout=TIMEOUT)
    return result.returncode


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault-templates")
    big = dict(hidden=256, vocab=2048, draft_vocab=512)
    longer = ["layers.0.=model.layers.0."]
    return {
        "in_place": Scenario(root, "in_place", lambda d: make_speculators_drafter(d), [], {}),
        # model.layers.0.* is a parameter name only in SGLang 0.5.12+
        "fallback": Scenario(root, "fallback", lambda d: make_speculators_drafter(d, **big),
                             ["--rename", longer[0], "--sglang-generation", "modern"],
                             {"renames": longer, "generation": "modern"}),
        "sharded": Scenario(root, "sharded",
                            lambda d: make_speculators_drafter(d, sharded=True), [], {}),
        "full_backup": Scenario(root, "full_backup", lambda d: make_speculators_drafter(d, **big),
                                [], {}, full_backup=True),
    }


STAGES = [
    ("in_place", "after_backup_tmp_write"),
    ("in_place", "after_backup_rename"),
    ("in_place", "before_header_write"),
    ("in_place", "after_header_write"),
    ("in_place", "after_weights_before_config"),
    ("in_place", "after_config_tmp"),
    ("in_place", "before_config_replace"),
    ("in_place", "after_config_replace"),
    ("in_place", "before_verify"),
    ("fallback", "after_backup_tmp_write"),
    ("fallback", "after_backup_rename"),
    ("fallback", "before_copy"),
    ("fallback", "mid_copy"),
    ("fallback", "mid_copy:7"),
    ("fallback", "before_replace"),
    ("fallback", "after_replace"),
    ("fallback", "after_weights_before_config"),
    ("fallback", "before_config_replace"),
    ("fallback", "after_config_replace"),
    ("sharded", "after_backup_tmp_write"),
    ("sharded", "after_backup_rename"),
    ("sharded", "before_header_write"),
    ("sharded", "after_header_write"),
    ("sharded", "before_header_write:2"),
    ("sharded", "after_header_write:2"),
    ("sharded", "after_weights_before_config"),
    ("sharded", "after_index_tmp"),
    ("sharded", "before_index_replace"),
    ("sharded", "after_index_replace"),
    ("sharded", "after_config_tmp"),
    ("sharded", "before_config_replace"),
    ("sharded", "after_config_replace"),
    ("full_backup", "mid_full_backup"),
    ("full_backup", "mid_full_backup:3"),
    ("full_backup", "after_backup_rename"),
    ("full_backup", "after_header_write"),
]


@pytest.mark.parametrize("name, stage", STAGES, ids=["%s-%s" % s for s in STAGES])
def test_kill_at_stage(scenarios, tmp_path, name, stage):
    scenario = scenarios[name]
    directory = scenario.fresh(tmp_path)
    code = run_killed_at(directory, scenario, stage)
    assert code == -signal.SIGKILL, "stage %s was never reached (exit %s)" % (stage, code)
    assert_old_or_new(directory, scenario)
    finish_and_restore(directory, scenario)


RESTORE_STAGES = [
    ("in_place", "restore_before_header_write"),
    ("in_place", "restore_after_header_write"),
    ("in_place", "restore_after_config"),
    ("in_place", "restore_before_sidecar_remove"),
    ("fallback", "restore_mid_copy"),
    ("sharded", "restore_after_header_write:2"),
]


@pytest.mark.parametrize("name, stage", RESTORE_STAGES, ids=["%s-%s" % s for s in RESTORE_STAGES])
def test_kill_during_restore(scenarios, tmp_path, name, stage):
    scenario = scenarios[name]
    directory = scenario.fresh(tmp_path)
    fix.convert(directory, **scenario.kwargs)
    code = run_killed_at(directory, scenario, stage, extra=["--restore"])
    assert code == -signal.SIGKILL, "stage %s was never reached (exit %s)" % (stage, code)
    assert_old_or_new(directory, scenario)
    fix.restore(directory)
    assert contents(directory) == scenario.original


def driver_process(directory: Path, scenario: Scenario) -> subprocess.Popen:
    env = dict(os.environ, DEPLOYCTL_FIX_COPY_CHUNK=CHUNK)
    env.pop("DEPLOYCTL_FIX_KILL_AT", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(FIXER)] + scenario.flags + [str(directory)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT)
    assert ready and proc.stdout.readline() == b"ready\n"
    return proc


def counted_calls(tmp_path: Path, scenario: Scenario) -> int:
    """How many changing OS and file calls (each counted at its call and its return) a whole run makes."""
    proc = driver_process(scenario.fresh(tmp_path), scenario)
    proc.stdin.write(b"go 0\n")
    proc.stdin.flush()
    out, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0
    return int(out.split()[-1])


@pytest.mark.parametrize("name", ["in_place", "fallback", "sharded"])
def test_kill_at_random_instants(scenarios, tmp_path, name):
    scenario = scenarios[name]
    rng = random.Random("deployctl-%s" % name)
    calls = counted_calls(tmp_path, scenario)
    outcomes = {"killed": 0, "finished": 0}
    stopped_at = {}
    for _ in range(16):
        directory = scenario.fresh(tmp_path)
        proc = driver_process(directory, scenario)
        target = rng.randint(1, int(calls * 1.15))      # some past the end: the run finishes
        proc.stdin.write(b"go %d\n" % target)
        proc.stdin.flush()
        proc.wait(timeout=TIMEOUT)
        proc.stdout.close()
        proc.stdin.close()
        assert proc.returncode in (0, -signal.SIGKILL), proc.returncode
        outcomes["killed" if proc.returncode == -signal.SIGKILL else "finished"] += 1
        where = assert_old_or_new(directory, scenario)
        stopped_at[where] = stopped_at.get(where, 0) + 1
        finish_and_restore(directory, scenario)
    print("random kills %s: %d calls, %s, stopped at %s" % (name, calls, outcomes, stopped_at))
    assert outcomes["killed"] >= 4, outcomes
    assert len(stopped_at) >= 3, stopped_at         # before, inside and after the writes


def test_torn_multi_page_header_is_completed_by_the_next_run(tmp_path):
    """A header over one page can be cut between pages by a kill inside pwrite (Linux checks
    for fatal signals between page copies); the next run finishes the write from the sidecar."""
    directory = tmp_path / "d"
    make_speculators_drafter(directory, layers=40)          # ~400 tensors: a multi-page header
    expected = tmp_path / "expected"
    shutil.copytree(directory, expected)
    fix.convert(expected, generation="modern")     # layers.N.input_layernorm -> hidden_norm, N > 0
    weights = directory / "model.safetensors"
    original = contents(directory)
    raw = weights.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert 8 + n > 3 * 4096
    code = run_killed_at(directory, None, "before_header_write",
                         extra=["--sglang-generation", "modern"])
    assert code == -signal.SIGKILL
    entry = json.loads((directory / SIDECAR).read_text())["files"]["model.safetensors"]
    target = base64.b64decode(entry["target"]["b64"])
    assert len(target) == 8 + n
    torn = target[:4096] + raw[4096:8 + n]                   # first page new, the rest old
    with open(weights, "r+b") as handle:
        handle.write(torn)

    summary = fix.convert(directory, generation="modern")

    assert any("half done" in line for line in summary["log"])
    assert summary["files"][0]["mode"] == "unchanged"        # the header was completed
    assert state(directory) == state(expected)
    assert fix.convert(directory, generation="modern")["status"] == "already_converted"
    fix.restore(directory)
    assert contents(directory) == original


def test_torn_header_is_restored_directly(tmp_path):
    directory = tmp_path / "d"
    make_speculators_drafter(directory, layers=40)
    weights = directory / "model.safetensors"
    original = contents(directory)
    raw = weights.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert run_killed_at(directory, None, "after_header_write",
                         extra=["--sglang-generation", "modern"]) == -signal.SIGKILL
    new = weights.read_bytes()
    with open(weights, "r+b") as handle:
        handle.write(raw[:4096] + new[4096:8 + n])          # first page old, the rest new
    with pytest.raises(fix.FixError):
        fix.convert(directory, generation="modern", dry_run=True)
    fix.restore(directory)
    assert contents(directory) == original
