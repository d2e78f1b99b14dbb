"""The three depth walks (the controller's deploy.base.limits.parse_json, the host helpers'
state_files.loads_json, the key fixer's header._json_depth: three programs, so three copies) agree with
a recursive reference on generated JSON shapes, at and around the 64-level limit: each refuses exactly
the documents nested deeper than 64, and the fixer's walk reports the depth up to one level past it."""

from __future__ import annotations

import json
import random

import pytest

from deploy.base import limits
from deploy.remote import state_files
from deploy.remote.fixer import header

LIMIT = 64


def depth(value) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
    if children is None:
        return 0
    return 1 + max((depth(child) for child in children), default=0)


def shape(rng: random.Random, levels: int):
    """A value exactly ``levels`` deep, with scalar and shallow (at most 2 levels) siblings on the way down."""
    if levels == 0:
        return rng.choice([1, "s", None, 2.5, True])
    inner = shape(rng, levels - 1)
    siblings = [shape(rng, rng.randrange(min(levels, 3))) for _ in range(rng.randrange(3))]
    if rng.random() < 0.5:
        items = siblings + [inner]
        rng.shuffle(items)
        return items
    keys = [f"k{i}" for i in range(len(siblings) + 1)]
    rng.shuffle(keys)
    return dict(zip(keys, siblings + [inner]))


CASES = [(seed, levels) for seed in range(3) for levels in (0, 1, 2, 5, 63, 64, 65, 66, 80)]


@pytest.mark.parametrize("seed, levels", CASES, ids=[f"seed{s}-depth{n}" for s, n in CASES])
def test_every_walk_refuses_exactly_what_is_deeper_than_the_limit(seed, levels):
    value = shape(random.Random(seed * 1000 + levels), levels)
    assert depth(value) == levels
    text = json.dumps(value)
    assert header._json_depth(json.loads(text)) == min(levels, LIMIT + 1)
    too_deep = levels > LIMIT
    for parse in (limits.parse_json, state_files.loads_json):
        if too_deep:
            with pytest.raises(ValueError, match="nested more than 64 levels deep"):
                parse(text)
        else:
            assert parse(text) == value


def test_the_limits_are_one_number():
    assert limits.MAX_JSON_DEPTH == state_files.MAX_JSON_DEPTH == header.MAX_JSON_DEPTH == LIMIT
