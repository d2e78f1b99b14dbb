"""Why acceptance is ~1.0, ordered by what the doctor found on the host (used by verify-acceptance)."""

from __future__ import annotations

from typing import Optional


#: verify-acceptance's suspects for accept length ~1.0, each with the doctor check that speaks to it
ACCEPTANCE_SUSPECTS = (
    ("target-capture", "the target does not capture the aux hidden states (no set_eagle3_layers_to_capture)"),
    ("cuda-graph-capture", "the CUDA-graph capture bug of SGLang 0.5.10 and older with custom aux ids (PR #22836)"),
    ("speculative-flags", "EAGLE instead of EAGLE3: the drafter gets one hidden state (PR #21272)"),
    ("drafter-weights", "drafter weights dropped by the loader (layers.0.* vs midlayer.*)"),
    ("draft-vocab-map", "a reduced draft vocabulary without d2t: draft ids taken as target ids "
                        "(NVIDIA-NeMo/Automodel#2447)"),
    ("drafter-window", "requests longer than the drafter's window (max_position_embeddings, or rope_scaling "
                       "lost in conversion): drafts past it are noise (sglang#6783, speculators#574)"),
)


def likely_causes(checks: Optional[list[dict[str, str]]]) -> list[str]:
    """The acceptance suspects, most likely first: what the doctor failed, then what it could not decide."""
    status = {c["name"]: c["status"] for c in checks or []}
    rank = {"fail": 0, "warn": 1, None: 2, "pass": 3}
    ordered = sorted(ACCEPTANCE_SUSPECTS, key=lambda s: rank.get(status.get(s[0]), 2))
    label = {"fail": "doctor: FAILED", "warn": "doctor: warned or could not decide", "pass": "doctor: passed",
             None: "doctor did not run"}
    return [f"{text} ({label[status.get(name)]})" for name, text in ordered]


def simulated_acceptance(checks: Optional[list[dict[str, str]]]) -> Optional[str]:
    """Why a measured accept length proves nothing: SGLANG_SIMULATE_ACC_LEN makes the server report
    the simulated value whatever the drafter does (the doctor's simulated-acceptance check)."""
    for check in checks or []:
        if check.get("name") == "simulated-acceptance" and check.get("status") == "fail":
            return check.get("reason")
    return None
