"""Issue 29 without a sandbox: swap_decision, the sender's facts and parsers, the stand-in's session."""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest

from deploy.config.models import Host, Run
from deploy.base.errors import RemoteOutputError
from deploy.facts.drafter_swap import DrafterFacts, GpuMemory, SwapInspection, parse_inspection, parse_send
from deploy.remote import drafter_swap as sender
from deploy.host.deployment import DesiredDeployment, desired_deployment
from deploy.steps.swap_decision import RunningServer, has_admin_key, swap_decision
from sandbox import drafter as drafter_mod
from tests.fixtures_ckpt import make_sglang_drafter

TENSORS = {"fc.weight": ["BF16", [64, 192]], "midlayer.mlp.up_proj.weight": ["BF16", [128, 64]], "d2t": ["I64", [128]]}
HOST = Host(name="h", address="127.0.0.1", state_dir="/s")


def a_run(**fields) -> Run:
    return Run.model_validate({"name": "r", "hosts": ["h"], "base_model": "/m", "drafter": "/d", "tp_size": 2,
                               "drafter_update": "swap"} | fields)


def deployment(drafter: str, fingerprint: str, run: Run | None = None, **changes) -> DesiredDeployment:
    """What the run launches with ``drafter`` (the one builder: deploy/host/deployment.py)."""
    built = desired_deployment(run or a_run(), HOST, drafter_path=drafter, drafter_fingerprint=fingerprint,
                               sglang_version="0.5.23")
    if "argv" in changes:
        changes["argv"] = tuple(changes["argv"])
    return dataclasses.replace(built, **changes)


#: what the running server was launched with (the old drafter)
ARGV = list(deployment("/s/drafters/OLD", "old" * 8).argv)


def desired(**changes) -> DesiredDeployment:
    return deployment("/s/drafters/NEW", "new" * 8, **changes)


def argv_of(want: DesiredDeployment) -> list[str]:
    return list(want.argv)


def running(**changes) -> RunningServer:
    record = deployment("/s/drafters/OLD", "old" * 8).record().but(pid=42)
    alive, health = changes.pop("alive", True), changes.pop("health", 200)
    return RunningServer(None if changes.pop("no_record", False) else record.but(**changes), alive, health, 42)


def facts(**changes) -> DrafterFacts:
    return DrafterFacts.model_validate({"config": {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64},
                                        "tensors": TENSORS, "bytes": 3 << 20, "d2t_sha256": "a", "t2d_sha256": "b"}
                                       | changes)


def seen(new: DrafterFacts | None = None, gpus=((0, 1000, 8000), (1, 1000, 8000)), gpu_error=None) -> SwapInspection:
    return SwapInspection(running=facts(), new=new or facts(), gpus=None if gpus is None else [
        GpuMemory(index=i, used_mib=u, total_mib=t) for i, u, t in gpus], gpu_error=gpu_error)


@pytest.mark.parametrize("run, want, have, why", [
    (a_run(drafter_update="reload"), desired(), running(), "drafter_update: reload"),
    (a_run(hosts=[], nodes=["a", "b"]), desired(), running(), "multi-node"),
    (a_run(), desired(), running(no_record=True), "no deployment is recorded"),
    (a_run(), desired(), running(run="other"), "run 'other'"),
    (a_run(), desired(), running(alive=False), "not running"),
    (a_run(), desired(), running(health=503), "/health 503"),
    (a_run(), desired(sglang_version="0.5.20"), running(sglang_version="0.5.20"), "0.5.20 has no weight-update session"),
    (a_run(), desired(sglang_version=None), running(), "version is unknown"),
    (a_run(), desired(), running(sglang_version="0.5.22"), "besides the drafter: sglang version (SGLang 0.5.22 -> 0.5.23)"),
    (a_run(), desired(drafter_fingerprint="old" * 8), running(), "the drafter did not change"),
    (a_run(), desired(argv=argv_of(desired()) + ["--mem-fraction-static", "0.8"]), running(),
     "besides the drafter: argv (adds --mem-fraction-static 0.8)"),
    # the run's own extra_args through the one argv builder: a launch option is not a drafter change
    (a_run(), deployment("/s/drafters/NEW", "new" * 8, a_run(extra_args=["--mem-fraction-static", "0.8"])), running(),
     "besides the drafter: argv (adds --mem-fraction-static 0.8)"),
    (a_run(), desired(argv=[a if a != "/m" else "/m2" for a in argv_of(desired())]), running(),
     "besides the drafter: argv (adds /m2; drops /m)"),
    (a_run(), desired(env_hash="f"), running(), "besides the drafter: env hash"),
    (a_run(), desired(env_file="/s/env"), running(), "besides the drafter: env file"),
    (a_run(), desired(draft_tokens=8), running(), "besides the drafter: draft tokens"),
    (a_run(), desired(), running(drafter_update={"how": "swap-failed"}), "a swap failed on this server before"),
    (a_run(), desired(argv=argv_of(desired()) + ["--admin-api-key"]), running(argv=ARGV + ["--admin-api-key"]),
     "no key for it"),
    # issue 41: what real SGLang's session cannot serve, refused before anything is sent
    (a_run(), desired(argv=argv_of(desired()) + ["--dp-size", "2"]), running(argv=ARGV + ["--dp-size", "2"]),
     "--dp-size 2: SGLang's update_weights_from_tensor asserts dp_size == 1"),
    (a_run(), desired(argv=argv_of(desired()) + ["--data-parallel-size=4"]),
     running(argv=ARGV + ["--data-parallel-size=4"]), "--dp-size 4"),
    (a_run(), desired(argv=argv_of(desired()) + ["--weight-cache-mode", "shared"]),
     running(argv=ARGV + ["--weight-cache-mode", "shared"]), "--weight-cache-mode shared"),
    (a_run(env={"SGLANG_OPT_BF16_FP32_GEMM_ALGO": "hpc"}), desired(), running(), "SGLANG_OPT_BF16_FP32_GEMM_ALGO=hpc"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_refusals_before_the_host_is_inspected_reload_and_say_why(run, want, have, why):
    decision = swap_decision(run, want, have)
    assert decision.path == "reload" and why in decision.reason and not decision.pending


def test_the_command_overrides_the_run_and_plan_says_what_it_still_checks():
    assert swap_decision(a_run(), desired(), running(), override="reload").reason.startswith("--reload")
    plan = swap_decision(a_run(drafter_update="reload"), desired(), None, override="swap")
    assert plan.path == "swap" and plan.pending and plan.reason.startswith("--swap-drafter")
    assert swap_decision(a_run(), desired(), running()).pending  # not inspected yet


@pytest.mark.parametrize("inspection, why", [
    (seen(facts(config={"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128})), "config changed (hidden_size)"),
    (seen(facts(tensors=TENSORS | {"norm.weight": ["BF16", [64]]})), "tensors changed (new norm.weight)"),
    (seen(facts(tensors=TENSORS | {"fc.weight": ["BF16", [64, 256]]})), "shapes changed (fc.weight"),
    (seen(facts(tensors=TENSORS | {"fc.weight": ["F16", [64, 192]]})), "shapes changed (fc.weight"),
    (seen(facts(d2t_sha256="z")), "vocabulary map"),
    (seen(facts(error="/s/drafters/NEW: no *.safetensors")), "cannot read the new drafter"),
    (seen(gpus=None, gpu_error="nvidia-smi: not found"), "free memory is unknown (nvidia-smi: not found)"),
    (seen(facts(bytes=2000 << 20), gpus=((0, 1000, 8000), (1, 7000, 8000))), "GPU 1: 1000 MiB free, 2768 MiB needed"),
    # issue 41: the sender's own CUDA context counts (768 MiB): 3 MiB of drafter in 700 MiB free does not fit
    (seen(gpus=((0, 1000, 8000), (1, 7300, 8000))), "GPU 1: 700 MiB free, 771 MiB needed: the drafter and 768 MiB"),
    (seen(gpus=((0, 1000, 8000),)), "GPU 1 of the server is not listed"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_refusals_after_the_inspection_reload_and_say_why(inspection, why):
    decision = swap_decision(a_run(), desired(), running(), inspection)
    assert decision.path == "reload" and why in decision.reason


def test_only_the_tensors_changed_is_a_swap_on_the_servers_own_gpus():
    decision = swap_decision(a_run(), desired(), running(), seen())
    assert decision.path == "swap" and not decision.pending and "only the drafter's tensors changed" in decision.reason
    # dp-size 1, an admin key alone (NORMAL routes stay open), an API key (the sender and verify-acceptance
    # both send it; refused while verify sent none): still a swap
    for flags in (["--dp-size", "1"], ["--admin-api-key", "adm"], ["--api-key", "k"], ["--api-key=k", "--admin-api-key", "m"]):
        assert swap_decision(a_run(), desired(argv=argv_of(desired()) + flags), running(argv=ARGV + flags),
                             seen()).path == "swap"
    # --base-gpu-id 2: GPUs 2 and 3 are the server's, 0 and 1 do not count
    argv = argv_of(desired()) + ["--base-gpu-id", "2"]
    full = seen(gpus=((0, 8000, 8000), (1, 8000, 8000), (2, 0, 8000), (3, 0, 8000)))
    assert swap_decision(a_run(), desired(argv=argv), running(argv=ARGV + ["--base-gpu-id", "2"]), full).path == "swap"


def test_the_running_drafter_is_put_back_in_its_own_slot_only():
    # the same path elsewhere in the argv (a token map under the drafter's dir, say) is not the drafter
    want = desired(argv=argv_of(desired()) + ["--speculative-token-map", "/s/drafters/NEW"])
    back = want.with_drafter("/s/drafters/OLD", "old" * 8)
    assert back.argv[-1] == "/s/drafters/NEW" and back.argv.count("/s/drafters/OLD") == 1
    assert back.drafter_fingerprint == "old" * 8 and back.drafter_path == "/s/drafters/OLD"
    assert swap_decision(a_run(), desired(), running(), seen()).path == "swap"
    assert "argv (adds --speculative-token-map /s/drafters/NEW)" in swap_decision(a_run(), want, running()).reason
    assert has_admin_key(["--admin-api-key", "k"]) is True and has_admin_key(["--admin-api-key=k"]) is True
    assert has_admin_key(["--admin-api-key", "--port"]) is False and has_admin_key([]) is None


# ------------------------------------------------------------------------------ host-side facts


def test_drafter_facts_read_shapes_bytes_and_the_vocabulary_map(tmp_path):
    make_sglang_drafter(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    config = json.loads((tmp_path / "b" / "config.json").read_text()) | {"_name_or_path": "elsewhere"}
    (tmp_path / "b" / "config.json").write_text(json.dumps(config))  # the producer's name is not a change
    a, b = sender.drafter_facts(str(tmp_path / "a")), sender.drafter_facts(str(tmp_path / "b"))
    assert a == b and a["d2t_sha256"] and a["tensors"]["fc.weight"] == ["F16", [64, 192]] and a["bytes"] > 0
    make_sglang_drafter(tmp_path / "c", draft_vocab=64)
    assert sender.drafter_facts(str(tmp_path / "c"))["d2t_sha256"] != a["d2t_sha256"]
    out = sender.inspect(str(tmp_path / "a"), str(tmp_path / "missing"))
    assert "error" in out["new"] and out["running"] == a


@pytest.mark.parametrize("flags, keys", [
    ([], (None, None)),
    (["--admin-api-key", "adm"], (None, "adm")),            # NORMAL routes open, ADMIN_OPTIONAL: the admin key
    (["--api-key", "api"], ("api", "api")),                 # both: the API key
    (["--api-key=api", "--admin-api-key=adm"], ("api", "adm")),  # NORMAL: the API key; ADMIN_OPTIONAL: admin only
])
def test_the_keys_come_from_the_record_as_sglangs_decide_request_auth_wants_them(tmp_path, flags, keys):
    """srt/utils/auth.py (0.5.21 = 0.5.23): NORMAL routes (/server_info, /model_info) take --api-key
    whatever --admin-api-key says; ADMIN_OPTIONAL ones the admin key when set, else the API key."""
    (tmp_path / "deployment.json").write_text(json.dumps({"argv": ARGV + flags}))
    assert sender.server_keys(str(tmp_path)) == keys
    (tmp_path / "deployment.json").write_text("not json")
    assert sender.server_keys(str(tmp_path)) == (None, None)


SUMMARY = {"ok": True, "stage": "done", "sent": True, "ended": True, "http_status": 200, "message": "Success",
           "weight_version": "abc", "tensors": 12, "seconds": 0.4, "flushed": True, "held_s": 0.3,
           "held": {"begin": 0.1, "update": 0.1, "end": 0.1}}


@pytest.mark.parametrize("output", [
    "", "\n\n", "Traceback (most recent call last):", json.dumps(SUMMARY) + "\n" + json.dumps(SUMMARY),
    json.dumps(SUMMARY | {"stage": "somewhere"}), json.dumps(SUMMARY | {"sent": "yes"}),
    json.dumps(SUMMARY | {"extra": 1}), json.dumps({k: v for k, v in SUMMARY.items() if k != "ok"}),
    json.dumps(SUMMARY | {"seconds": -1}), json.dumps([SUMMARY]),
    json.dumps(SUMMARY | {"format": "stand-in"}),  # issue 41: one payload path, no format to say
    json.dumps(SUMMARY | {"held": {"flush": 0.1}}), json.dumps({k: v for k, v in SUMMARY.items() if k != "held_s"}),
])
def test_a_send_summary_not_exactly_as_documented_is_refused(output):
    with pytest.raises(RemoteOutputError, match="h1"):
        parse_send(output, "h1")


def test_inspection_parses_the_helpers_own_output_and_refuses_others(tmp_path):
    make_sglang_drafter(tmp_path / "a")
    out = sender.inspect(str(tmp_path / "a"), str(tmp_path / "a"))
    parsed = parse_inspection(json.dumps(out) + "\n", "h1")
    assert parsed.running == parsed.new
    for bad in (json.dumps(out | {"gpus": [{"index": -1, "used_mib": 0, "total_mib": 1}]}),
                json.dumps(out | {"new": {"tensors": "all"}}), json.dumps({"running": out["running"]})):
        with pytest.raises(RemoteOutputError, match="h1"):
            parse_inspection(bad, "h1")
    assert parse_send(json.dumps(SUMMARY), "h1").weight_version == "abc"


# ------------------------------------------------------------------------ the stand-in's session


@pytest.fixture(scope="module")
def ls():
    from tests.integration.test_sandbox import load_launch_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SGLANG_SIM_IMPORT_SECONDS", "0")  # the stand-in's `import sglang` pays 2.5 s otherwise
        return load_launch_module()


def engine(ls, version="0.5.23", tp=2, base=0):
    args = SimpleNamespace(tp_size=tp, base_gpu_id=base, api_key=None, admin_api_key=None, model_path="/m",
                           tokenizer_path="/m", weight_version="default", speculative_token_map=None,
                           disable_cuda_graph=False, log_level="info", speculative_draft_model_quantization=None)
    spec = ls.Speculation("EAGLE3", draft_tokens=16, accept_p=0.66)
    spec.draft_config = {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1,
                         "hidden_size": 64, "vocab_size": 256, "draft_vocab_size": 128}
    spec.target_config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "vocab_size": 256}
    return ls.Engine(args, version, spec, {}, 0.5)


def drafter_dir(root, names, markers=None):
    """A drafter directory whose safetensors header holds ``names`` (the stand-in reads headers only)."""
    import struct

    root.mkdir(parents=True, exist_ok=True)
    header = json.dumps({n: {"dtype": "BF16", "shape": [1], "data_offsets": [2 * i, 2 * i + 2]}
                         for i, n in enumerate(names)}).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (2 * len(names)))
    for name, text in (markers or {}).items():
        (root / f"SIMULATION-{name}").write_text(text)
    return root


def entries_of(root, tp, base=0):
    """The product's one payload path: deploy/remote/drafter_swap.py sglang_payloads (issue 41)."""
    entries, count, keep = sender.sglang_payloads(str(root), tp, base)
    assert count > 0 and len(keep) == tp
    return entries


def update(e, entries, **body):
    return e.weight_updates.handle("/update_weights_from_tensor",
                                   {"serialized_named_tensors": entries, "selector": "draft"} | body)


@pytest.fixture()
def sim():
    from tests.sim_python import sim_python

    with sim_python():
        yield


def test_the_session_is_sglangs_and_a_swapped_drafter_follows_the_loader_rules(ls, sim, monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_SIM_SWAP_SECONDS", "0")
    e = engine(ls)
    good = entries_of(drafter_dir(tmp_path / "good", list(drafter_mod.drafter_tensor_specs(layout="sglang"))), 2)
    w = e.weight_updates
    assert update(e, good) == (400, {"success": False, "message": "update_weights_from_tensor must run between "
                                     "begin_weight_update() and end_weight_update()"})
    assert w.handle("/begin_weight_update", {"selector": "draft"})[0] == 200
    assert w.handle("/begin_weight_update", {"selector": "draft"})[1]["message"].startswith(
        "a weight-update session is already open")
    assert update(e, good, weight_version="v2")[0] == 200 and e.model_info()["weight_version"] == "v2"
    assert e.spec.accept_p > 0.6
    # a drafter whose decoder layer the loader drops serves at 1.00 after a swap, as at launch
    dropped = [n.replace("midlayer.", "decoder.") for n in drafter_mod.drafter_tensor_specs(layout="sglang")]
    assert update(e, entries_of(drafter_dir(tmp_path / "dropped", dropped), 2))[0] == 200
    assert e.spec.accept_p == 0.0 and "random init" in e.spec.collapse_reason
    marked = drafter_dir(tmp_path / "marked", list(drafter_mod.drafter_tensor_specs(layout="sglang")),
                         {"accept-nothing": ""})
    assert update(e, entries_of(marked, 2))[0] == 200 and e.spec.accept_p == 0.0
    # one payload per rank, each on its own GPU: rank 1 reading rank 0's copy, too few entries, not a pickle
    assert "not on this rank's GPU 1" in update(e, [good[0], good[0]])[1]["message"]
    assert "list index out of range" in update(e, good[:1])[1]["message"]
    assert "cannot deserialize" in update(e, [base64.b64encode(b"{}").decode()] * 2)[1]["message"]
    assert w.handle("/end_weight_update", {})[0] == 200
    assert w.handle("/end_weight_update", {})[1]["message"].startswith("no weight-update session is open")
    # --base-gpu-id 2: the sender's copies on GPUs 2 and 3 are the ranks' own
    e2 = engine(ls, base=2)
    assert e2.weight_updates.handle("/begin_weight_update", {"selector": "draft"})[0] == 200
    assert update(e2, entries_of(tmp_path / "good", 2, base=2))[0] == 200
    assert "not on this rank's GPU 2" in update(e2, good)[1]["message"]


def test_not_flushed_loads_the_weights_but_weight_version_stays_as_real_sglang_answers(ls, sim, monkeypatch, tmp_path):
    """0.5.21 - 0.5.23: weight_updater.flush_cache_after_weight_update fails the call; the tokenizer
    records weight_version only on success (tokenizer_control_mixin.py), so /model_info keeps the old one."""
    monkeypatch.setenv("SGLANG_SIM_SWAP_SECONDS", "0")
    e = engine(ls)
    good = entries_of(drafter_dir(tmp_path / "good", list(drafter_mod.drafter_tensor_specs(layout="sglang"))), 2)
    e.weight_updates.handle("/begin_weight_update", {"selector": "draft"})
    e.running = 1  # a request at the scheduler: the flush is refused
    code, answer = update(e, good, weight_version="v2")
    assert code == 400 and answer["message"].startswith("Weights were updated, but the cache was not flushed")
    assert e.model_info()["weight_version"] == "default"


def test_the_stand_in_authenticates_as_sglangs_decide_request_auth():
    """srt/utils/auth.py, 0.5.21 = 0.5.23, and the routes' levels in http_server.py."""
    from tests.sim_python import sim_python

    with sim_python():
        from sglang.srt.utils.auth import decide_request_auth

    def allowed(path, header, api=None, admin=None):
        return decide_request_auth(method="GET", path=path, authorization_header=header, api_key=api,
                                   admin_api_key=admin)

    assert allowed("/server_info", None) and allowed("/begin_weight_update", None)
    assert not allowed("/server_info", None, api="a") and allowed("/server_info", "Bearer a", api="a")
    assert allowed("/server_info", None, admin="m")  # NORMAL with the admin key alone: open
    assert not allowed("/server_info", "Bearer m", api="a", admin="m")  # the admin key is not the API key
    assert not allowed("/begin_weight_update", "Bearer a", api="a", admin="m")  # both: admin only
    assert allowed("/begin_weight_update", "Bearer m", api="a", admin="m")
    assert allowed("/begin_weight_update", "Bearer a", api="a") and not allowed("/flush_cache", None, api="a")
    assert allowed("/health", None, api="a", admin="m")


def test_0_5_20_has_no_session(ls):
    assert not engine(ls, version="0.5.20").weight_updates.serves("/begin_weight_update")
    assert engine(ls, version="0.5.21").weight_updates.serves("/begin_weight_update")


# ------------------------------------------------------------------------------ behind a router


def planned(name: str):
    from deploy.engine.playbook import PlannedStep
    from deploy.steps import REGISTRY

    return PlannedStep(name, REGISTRY[name].Settings(step=name))


def test_behind_a_router_a_replica_that_would_swap_is_drained_first():
    """Issue 41: every begin, update and end of SGLang's session takes the tokenizer's model_update_lock
    writer lock (tokenizer_control_mixin.py, 0.5.21 - 0.5.23), which waits for every in-flight request
    and holds new ones back: a replica kept in the router would hold its users' requests up to three
    times the longest one. Before, the probe kept it in the router ("kept in the router (no drain)")."""
    from deploy.fleet.rolling import probe_verdict
    from deploy.steps.memory import StepMemory

    assert probe_verdict(True, "already running as desired", None) == ("unchanged", "already running as desired")
    verdict, why = probe_verdict(False, "drafter fingerprint changed", "only the drafter changed so far")
    assert verdict == "redeploy" and why == "drafter swap, drained first: only the drafter changed so far"
    assert probe_verdict(False, "argv changed", None) == ("redeploy", "argv changed")
    assert not hasattr(StepMemory(), "leave_router")  # no replica is kept in the router for a swap any more


def test_the_stand_ins_model_update_lock_holds_new_requests_while_a_session_call_waits(ls):
    """SGLang's RWLock (srt/utils/aio_rwlock.py, 0.5.21 - 0.5.23) is writer-preferring: a session call
    waits for the request in flight, and a request that arrives meanwhile waits for the call."""
    import threading
    import time

    gate = ls.ModelUpdateLock()
    order: list[str] = []
    gate.acquire_reader()  # a request in flight

    def session_call():
        gate.acquire_writer()
        order.append("call")
        time.sleep(0.1)
        gate.release_writer()

    def new_request():
        gate.acquire_reader()
        order.append("new request")
        gate.release_reader()

    writer = threading.Thread(target=session_call)
    writer.start()
    time.sleep(0.1)  # the call waits for the request in flight
    late = threading.Thread(target=new_request)
    late.start()
    time.sleep(0.1)
    assert order == []  # neither the call nor the new request got in while the old request runs
    gate.release_reader()
    writer.join(5)
    late.join(5)
    assert order == ["call", "new request"]


def test_no_swap_module_of_the_product_knows_the_sandbox():
    """Issue 41: one payload path. Before, the sender asked /server_info whether the server was the
    sandbox (``simulated``) and then sent the stand-in's own format; SGLang's path never ran in a test."""
    from pathlib import Path

    root = Path(sender.__file__).resolve().parents[1]
    for path in ("remote/drafter_swap.py", "facts/drafter_swap.py", "steps/swap_drafter.py", "steps/swap_decision.py",
                 "fleet/rolling.py"):
        text = (root / path).read_text().lower()
        for word in ("sandbox", "simulated", "stand-in", "sim_format", "deployctl-sim-drafter"):
            assert word not in text, (path, word)
