"""SIMULATED traffic-dependent acceptance (deployctl sandbox TEST DOUBLE; issue 43).

Real speculative acceptance depends on what is generated: the EAGLE-3 paper (Li et al. 2025,
arXiv:2503.01840) reports a different acceptance length for one drafter on each of MT-bench
(multi-turn chat), HumanEval (code), GSM8K (math), Alpaca (instructions) and CNN/DM
(summaries); code is the most predictable. A public measurement of one drafter
(yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, K = 7, temperature 1, on its model card's comparison by
nebius): MT-bench 2.77, HumanEval 3.49, GSM8K 3.34, i.e. extra tokens per verify step of 1.77,
2.49 and 2.34, or 0.80 : 1.13 : 1.06 of their mean. And a drafter retrained on another data mix
can gain on one kind and lose on another.

The stand-in models both:

- ``kind_of(text)`` reads a prompt's kind from its words (the stand-in has no tokenizer, let alone
  a model that knows what a prompt is about): summary, code, math, chat, else instruct;
- ``KIND_FACTOR``: each kind's share of the drafter's extra accepted tokens, in the published order
  (code > math > instruct > summary ~ chat), scaled so that deployctl's built-in prompt set
  (deploy/data/prompts.json: 80 chat, 80 code, 80 math, 60 summary) averages ~1.0 and the stand-in's
  accept lengths on it stay what they were before this model (the instruct and summary factors are
  the stand-in's own choice in that order, not a published figure);
- the drafter marker ``SIMULATION-prompt-kinds``: a JSON object ``{kind: factor}`` (``"*"``: every
  kind not named), each factor in (0, 3], multiplying that kind's extra tokens for this drafter: a
  drafter good on the built-in prompts and poor on a live mix of instructions is
  ``{"instruct": 0.5, "*": 1.1}``. Like the other markers it is a file of the checkpoint, so a
  rollback to the previous drafter's bytes cures it.

A verify step's accepted tokens k (1 + the draft tokens accepted) become 1 + f (k - 1), f the
kind's factor times the drafter's, rounded by a low-discrepancy draw that keeps the mean, capped at
the draft tokens T: the accept length on a kind is ~1 + f (L - 1).
"""

from __future__ import annotations

import json
import re

KINDS = ("chat", "code", "math", "instruct", "summary")

KIND_FACTOR = {"chat": 0.88, "code": 1.12, "math": 1.06, "instruct": 1.00, "summary": 0.90}

#: the bench's (tests/benchmarks/bench_canary.py) per-kind accept lengths: 1 + f (L - 1), L = 2.9 (T = 16)
KIND_ACCEPT = {kind: round(1 + factor * 1.9, 3) for kind, factor in KIND_FACTOR.items()}

_SUMMARY = re.compile(r"\b(summari[sz]e|summary|headline|main point|tl;dr)", re.IGNORECASE)
_CODE = re.compile(r"\b(python|function|code|program|sql|regex|class|script|def)\b", re.IGNORECASE)
_MATH = re.compile(r"\b(solve|multiplied|how many|sum of|prime|average|equation|calculate|percent|area|convert|formula)\b|\d+\s*[-+*/x=]\s*\d+",
                   re.IGNORECASE)
_CHAT = re.compile(r"\b(explain|why|what are|what is|tell me|describe|misconceptions?|friend)\b", re.IGNORECASE)


def kind_of(text: str) -> str:
    """The prompt's kind, by its words (first match in this order: summary, code, math, chat)."""
    if _SUMMARY.search(text):
        return "summary"
    if _CODE.search(text):
        return "code"
    if _MATH.search(text):
        return "math"
    if _CHAT.search(text):
        return "chat"
    return "instruct"


def parse_marker(text: str) -> dict[str, float]:
    """``SIMULATION-prompt-kinds``' content: {kind or "*": factor in (0, 3]}; ValueError otherwise."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"SIMULATION-prompt-kinds must be a JSON object: {exc}") from None
    if not isinstance(value, dict) or not value:
        raise ValueError("SIMULATION-prompt-kinds must be a non-empty JSON object {kind: factor}")
    out: dict[str, float] = {}
    for kind, factor in value.items():
        if kind != "*" and kind not in KINDS:
            raise ValueError(f"SIMULATION-prompt-kinds: unknown kind {kind!r} (one of {', '.join(KINDS)} or '*')")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 3:
            raise ValueError(f"SIMULATION-prompt-kinds: {kind}: factor must be a number in (0, 3], got {factor!r}")
        out[kind] = float(factor)
    return out


def factor(kind: str, drafter: dict[str, float] | None) -> float:
    """The extra-token factor of a prompt of ``kind`` with a drafter whose marker is ``drafter``."""
    own = 1.0 if not drafter else drafter.get(kind, drafter.get("*", 1.0))
    return KIND_FACTOR.get(kind, 1.0) * own


def scaled(accepted: int, f: float, draft_tokens: int, u: float) -> int:
    """1 + f (accepted - 1), rounded up when ``u`` (a low-discrepancy draw in [0, 1)) falls below its
    fraction, capped at ``draft_tokens``."""
    if accepted <= 1 or f == 1.0:
        return accepted
    extra = (accepted - 1) * f
    return max(1, min(max(1, draft_tokens), 1 + int(extra) + (1 if u < extra - int(extra) else 0)))
