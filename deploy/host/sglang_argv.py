"""SGLang's launch argv and addresses, pure: the one place its flags are spelled.

The launch step, converge, the doctor's checks and facts, and the fleet's router all read these
rules from here (below the steps: facts and doctor never import a step).
"""

from __future__ import annotations

from deploy.config.models import Host, Run

#: SGLang 0.5.7+: the draft model's own quantization (unset: it inherits the target's, sglang#28196)
DRAFT_QUANT_FLAG = "--speculative-draft-model-quantization"
DRAFTER_FLAG = "--speculative-draft-model-path"


def speculative_plan(run: Run, draft_tokens: int) -> tuple[int, int, int]:
    """(num_steps, topk, num_draft_tokens) passed explicitly.

    With topk 1 SGLang logs a warning and silently rewrites num_draft_tokens to num_steps + 1, so
    "16 draft tokens" must be sent as num_steps 15 (sglang server_args, all versions in use).
    """
    if run.eagle_topk == 1:
        return draft_tokens - 1, 1, draft_tokens
    assert run.speculative_num_steps is not None
    return run.speculative_num_steps, run.eagle_topk, draft_tokens


def serve_address(run: Run, host: Host) -> str:
    return run.serve_host or host.address


#: bind addresses that mean every interface of the host
WILDCARD_BINDS = ("0.0.0.0", "::")


def probe_address(run: Run, host: Host) -> str:
    """Where a probe ON the host reaches the server (a wildcard bind answers on loopback); the
    router reaches it elsewhere (fleet.router.worker_address)."""
    address = serve_address(run, host)
    return "127.0.0.1" if address in WILDCARD_BINDS else address


def sglang_argv(run: Run, host: Host, draft_tokens: int, drafter: str | None = None,
                draft_quantization: str | None = None) -> list[str]:
    steps, topk, tokens = speculative_plan(run, draft_tokens)
    return [
        run.sglang_python, "-m", "sglang.launch_server",
        "--model-path", run.base_model,
        "--speculative-algorithm", run.speculative_algorithm,
        DRAFTER_FLAG, drafter or run.drafter,
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(tokens),
        "--tp-size", str(run.tp_size),
        "--host", serve_address(run, host),
        "--port", str(run.port),
        "--trust-remote-code",
        # /metrics (Prometheus): `deployctl status` reads sglang:spec_accept_length and the token
        # counters from it while the server serves (SGLang only serves /metrics with this flag)
        "--enable-metrics",
        # the doctor's decision for an unquantized drafter under a quantized target (sglang#28196)
        *([DRAFT_QUANT_FLAG, draft_quantization] if draft_quantization else []),
        *run.extra_args,
    ]


PATH_POSITIONS = ("--model-path", "--speculative-draft-model-path")


def unseen_holder(owner: int | None, deploy_uid: int | None) -> str:
    """Who holds a listening socket that no process visible in this /proc holds (issue 37: one of the
    deploy user's own processes in a container was called "another user's")."""
    if owner is not None and owner == deploy_uid:
        return (f"a process of the deploy user (uid {owner}) that is not visible here: one in another PID "
                "namespace (a container?)")
    if owner is not None:
        return f"a process of uid {owner}, another user's (not visible to the deploy user)"
    return "a process the deploy user cannot see (another user's, or in another PID namespace)"
