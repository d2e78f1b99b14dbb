"""The fix-keys step without SSH: tests/recording.py's RecordingTransport answers with what the real
``fixer.pyz store`` printed for that very command, run here against local files (the state dir and
the drafter live in tmp_path; ``~`` is the recording's home)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.config.models import Host, Run
from deploy.base.errors import DeployError, ExitCode, RemoteCommandFailed, RemoteOutputError, VerificationFailed
from deploy.remote.fixer import convert
from deploy.steps import fix_keys
from deploy.steps.base import StepContext
from deploy.steps.memory import StepMemory
from tests.fixer_zipapp import fixer_zipapp
from tests.fixtures_ckpt import contents, make_speculators_drafter
from tests.recording import RecordingTransport, Reply


class World:
    def __init__(self, tmp_path: Path, *, layers: int = 1, generation: str = "auto") -> None:
        self.home = tmp_path / "home"
        (self.home / "state dir" / "helpers").mkdir(parents=True)
        shutil.copy(fixer_zipapp(), self.home / "state dir" / "helpers" / "fixer.pyz")
        self.drafter = make_speculators_drafter(tmp_path / "my drafter", layers=layers)
        self.host = Host(name="gpu-a", address="10.1.2.3", state_dir="~/state dir", python=sys.executable)
        self.run_ = Run(name="r", hosts=["gpu-a"], base_model="/m", drafter=str(self.drafter),
                        sglang_python=sys.executable, sglang_generation=generation)

    def ctx(self, conn, memory=None, **settings) -> StepContext:
        return StepContext(host=self.host, run=self.run_, settings=fix_keys.Settings(step="fix-keys", **settings),
                           conn=conn, launch_stamp="x", memory=StepMemory() if memory is None else memory)

    def host_answer(self, command: str) -> Reply:
        """Run the command as the host would (HOME is the world's home) and record its answer."""
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60,
                              env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"})
        return Reply("^" + re_escape(command) + "$", done.returncode, done.stdout, done.stderr)

    def step(self, memory=None, **settings):
        """plan() on a fresh context, the host's real answer to that command, then run()."""
        planned = fix_keys.plan(self.ctx(None, memory or StepMemory(), **settings))
        assert len(planned) == 1
        conn = RecordingTransport(self.host, [self.host_answer(planned[0].command)], home=str(self.home))
        ctx = self.ctx(conn, memory or StepMemory(), **settings)
        return conn, ctx, planned[0].command


def re_escape(text: str) -> str:
    return re.escape(text)


def test_run_sends_exactly_the_one_command_plan_shows(tmp_path):
    world = World(tmp_path)
    before = contents(world.drafter)
    conn, ctx, planned = world.step(memory=StepMemory(sglang_version="0.5.11"))
    outcome = fix_keys.run(ctx)
    assert conn.commands == [planned] and conn.uploads == []
    assert "--sglang-version 0.5.11" in planned and "--sglang-python" not in planned   # doctor's read reused
    assert outcome.status == "ok" and outcome.data["status"] == "converted" and outcome.data["renamed"] == 10
    assert outcome.data["store"] == f"~/state dir/drafters/{outcome.data['fingerprint'][:32]}"
    assert ctx.memory.drafter_path == outcome.data["store"]
    assert ctx.memory.drafter_fingerprint == outcome.data["fingerprint"]
    assert outcome.data["verification"]["ok"] is True and outcome.data["pruned"]["kept"]
    assert contents(world.drafter) == before
    assert (world.home / "state dir" / "drafters" / outcome.data["fingerprint"][:32] / ".deployctl-ready").exists()


def test_the_version_is_read_in_the_same_command_when_doctor_did_not(tmp_path):
    world = World(tmp_path)
    conn, ctx, planned = world.step()
    assert f"--sglang-python {shlex.quote(sys.executable)}" in planned
    with pytest.raises(RemoteCommandFailed) as exc:       # this python has no sglang installed
        fix_keys.run(ctx)
    assert "SGLang is not installed" in str(exc.value) and "gpu-a" in str(exc.value)
    assert len(conn.commands) == 1


def test_a_fixed_generation_is_passed_and_no_version_is_read(tmp_path):
    world = World(tmp_path, generation="modern")
    conn, ctx, planned = world.step(memory=StepMemory(sglang_version="0.5.11"))
    assert "--sglang-generation modern" in planned
    outcome = fix_keys.run(ctx)
    assert outcome.data["sglang_version"] is None and outcome.data["verification"]["generation"] == "modern"


def test_when_changed_skips_an_unchanged_drafter_and_always_reverifies_it(tmp_path):
    world = World(tmp_path)
    _, ctx, _ = world.step(memory=StepMemory(sglang_version="0.5.11"))
    first = fix_keys.run(ctx)
    conn, ctx, planned = world.step(memory=StepMemory(sglang_version="0.5.11"), when="changed")
    assert "--when changed" in planned
    skipped = fix_keys.run(ctx)
    assert skipped.status == "skipped" and skipped.data == {"fingerprint": first.data["fingerprint"],
                                                            "store": first.data["store"]}
    assert ctx.memory.drafter_path == first.data["store"]
    _, ctx, _ = world.step(memory=StepMemory(sglang_version="0.5.12"))
    again = fix_keys.run(ctx)
    assert again.data["status"] == "already_converted" and again.data["verification"]["generation"] == "modern"


def test_keep_drafters_and_hidden_states_from_reach_the_host(tmp_path):
    world = World(tmp_path)
    conn, ctx, planned = world.step(memory=StepMemory(sglang_version="0.5.11"), keep_drafters=5, hidden_states_from="vllm")
    assert "--keep 5" in planned and "--hidden-states-from vllm" in planned
    fix_keys.run(ctx)
    store = world.home / "state dir" / "drafters"
    [entry] = [p for p in store.iterdir() if not p.name.startswith(".")]
    local = make_speculators_drafter(tmp_path / "local")
    convert(local, hidden_states_from="vllm")                 # what the same fix gives here
    assert json.loads((entry / "config.json").read_text()) == json.loads((local / "config.json").read_text())
    assert json.loads((entry / "config.json").read_text())["eagle_config"] != \
        json.loads((world.drafter / "config.json").read_text()).get("eagle_config")


def test_a_drafter_sglang_would_not_load_fully_fails_verification(tmp_path):
    world = World(tmp_path, layers=2)
    _, ctx, _ = world.step(memory=StepMemory(sglang_version="0.5.11"))
    with pytest.raises(VerificationFailed) as exc:
        fix_keys.run(ctx)
    assert "only supports 1 layer" in str(exc.value) and str(world.drafter) in str(exc.value)


def test_a_broken_drafter_keeps_the_fixers_exit_code_and_names_the_file(tmp_path):
    world = World(tmp_path)
    (world.drafter / "model.safetensors").write_bytes(b"\x00" * 100)
    _, ctx, _ = world.step(memory=StepMemory(sglang_version="0.5.11"))
    with pytest.raises(DeployError) as exc:
        fix_keys.run(ctx)
    assert exc.value.exit_code == ExitCode.CHECKPOINT and "model.safetensors" in str(exc.value)


@pytest.mark.parametrize("stdout", ["", "Traceback (most recent call last):\n", '{"status": "converted"}\n', "[]\n"])
def test_anything_but_the_summary_is_a_remote_output_error(tmp_path, stdout):
    world = World(tmp_path)
    ctx = world.ctx(None, StepMemory(sglang_version="0.5.11"))
    conn = RecordingTransport(world.host, [Reply("fixer.pyz' store ", 1, stdout, "")], home=str(world.home))
    ctx = world.ctx(conn, StepMemory(sglang_version="0.5.11"))
    with pytest.raises(RemoteOutputError) as exc:
        fix_keys.run(ctx)
    assert "gpu-a" in str(exc.value) and len(conn.commands) == 1


def test_a_link_out_of_the_drafter_is_not_copied_and_the_step_says_so(tmp_path):
    world = World(tmp_path)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "weights.bin").write_bytes(b"B" * 4096)
    (world.drafter / "base-model").symlink_to(tmp_path / "base")
    conn, ctx, _ = world.step(memory=StepMemory(sglang_version="0.5.11"))
    outcome = fix_keys.run(ctx)
    assert outcome.status == "ok"
    entry = world.home / "state dir" / "drafters" / outcome.data["fingerprint"][:32]
    assert not (entry / "base-model").exists()
    assert any(str(world.drafter / "base-model") in note for note in outcome.data["skipped"])
    assert "not followed" in outcome.detail and "base-model" in outcome.detail


# ---- the store entry: the rule the plan shows, the host's answer the run uses -------------------

FINGERPRINT = "722d678167a1027796eab5af7600f5e46a04e019d293b07cc0184d8ed7a4c111"
ENTRY = FINGERPRINT[:32]


def _ctx(state_dir: str) -> StepContext:
    host = Host(name="gpu-a", address="10.1.2.3", state_dir=state_dir)
    run = Run(name="r", hosts=["gpu-a"], base_model="/m", drafter="/d")
    return StepContext(host=host, run=run, settings=fix_keys.Settings(step="fix-keys"), conn=None,
                       launch_stamp="x", memory=StepMemory())


@pytest.mark.parametrize("state_dir", ["/var/lib/deployctl", "/srv/deploy ctl", "~/.deployctl", "~/state dir", "~"])
def test_the_plans_store_path_is_the_fixers_own_rule(state_dir):
    # one rule, two sides: the controller shows it before the host answers, the fixer makes the entry
    # (deploy/remote/fixer/store.py store_entry, after the host's os.path.expanduser of --store)
    import posixpath

    from deploy.facts.fixer import store_entry_of
    from deploy.remote.fixer.store import store_entry

    ctx = _ctx(state_dir)
    home = "/home/gpu user"
    expand = lambda p: home + p[1:] if p.startswith("~") else p  # noqa: E731  (the host's expanduser)
    on_host = store_entry(expand(ctx.paths.drafters), FINGERPRINT)
    assert expand(fix_keys.store_path(ctx, FINGERPRINT)) == on_host
    assert posixpath.dirname(on_host) == expand(ctx.paths.drafters)
    # the host's answer, read back, is the config's spelling: a `~` state dir keeps its recorded argv
    assert store_entry_of(on_host, ctx.paths.drafters, FINGERPRINT, "gpu-a") == fix_keys.store_path(ctx, FINGERPRINT)


#: (state dir, what the host answered as the store entry): each one refused, naming the host
REFUSED_ENTRIES = [
    ("/var/lib/deployctl", f"/var/lib/other/drafters/{ENTRY}"),          # another store
    ("/var/lib/deployctl", f"var/lib/deployctl/drafters/{ENTRY}"),       # relative
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/{ENTRY}/"),     # not normalised
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/../{ENTRY}"),
    ("/var/lib/deployctl", f"/var/lib/deployctl//drafters/{ENTRY}"),
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/{'0' * 32}"),   # another drafter's entry
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/.staging-{ENTRY}"),
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/{ENTRY}/inner"),
    ("/var/lib/deployctl", "/var/lib/deployctl/drafters"),
    ("/var/lib/deployctl", ""),
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/{ENTRY}\n"),
    ("~/.deployctl", f"/home/u/other/drafters/{ENTRY}"),
    ("~/.deployctl", f"/home/u/x.deployctl/drafters/{ENTRY}"),           # a suffix, not the folder
    ("~/.deployctl", f"~/.deployctl/drafters/{ENTRY}"),                   # unexpanded: not absolute
]


@pytest.mark.parametrize("state_dir, answer", REFUSED_ENTRIES)
def test_a_store_entry_outside_the_rule_is_refused_naming_the_host(state_dir, answer):
    # before: the controller computed the path itself and ignored the host's answer
    from deploy.facts.fixer import FixerSummary

    ctx = _ctx(state_dir)
    summary = FixerSummary(status="unchanged", exit_code=0, drafter="/d", fingerprint=FINGERPRINT, store=answer,
                           stored_before=True, sglang_version=None, sglang_version_read=None, renamed=0, files=[],
                           config=None, verification=None, pruned=None)
    with pytest.raises(RemoteOutputError) as exc:
        fix_keys.outcome_of(ctx, summary)
    assert "gpu-a" in str(exc.value) and "store entry" in str(exc.value)
    assert ctx.memory.drafter_path is None


def test_the_run_uses_the_store_entry_the_host_named(tmp_path):
    # the real fixer's answer (absolute, ~ expanded on the host) becomes the config's spelling
    world = World(tmp_path)
    _, ctx, _ = world.step(memory=StepMemory(sglang_version="0.5.11"))
    outcome = fix_keys.run(ctx)
    answered = world.home / "state dir" / "drafters" / outcome.data["fingerprint"][:32]
    assert answered.is_dir() and ctx.memory.drafter_path == f"~/state dir/drafters/{answered.name}"


#: (state dir, the host's answer, the drafter path the run uses): the homes a host may expand ~ to
ACCEPTED_ENTRIES = [
    ("/var/lib/deployctl", f"/var/lib/deployctl/drafters/{ENTRY}", f"/var/lib/deployctl/drafters/{ENTRY}"),
    ("~/.deployctl", f"/home/gpu/.deployctl/drafters/{ENTRY}", f"~/.deployctl/drafters/{ENTRY}"),
    ("~/.deployctl", f"/.deployctl/drafters/{ENTRY}", f"~/.deployctl/drafters/{ENTRY}"),          # HOME=/
    ("~", f"/root/drafters/{ENTRY}", f"~/drafters/{ENTRY}"),
]


@pytest.mark.parametrize("state_dir, answer, used", ACCEPTED_ENTRIES)
def test_the_store_entry_the_host_names_is_used_in_the_configs_spelling(state_dir, answer, used):
    from deploy.facts.fixer import store_entry_of

    ctx = _ctx(state_dir)
    assert store_entry_of(answer, ctx.paths.drafters, FINGERPRINT, "gpu-a") == used
