"""How the generated corpora spread their words over the models' fields."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any


def words_per_field(fields: Iterable[tuple[Any, object]],
                    words: Callable[[object], Sequence[str]]) -> list[tuple[Any, str]]:
    """(field, word) cases for (field, annotation) pairs: the first field of each annotation gets
    every word its kind takes, each later field of the same annotation one word, the next in turn.

    A field's type decides how a word is read and refused (the loader's literal check, pydantic's
    strict type for the annotation), and the message names the field from the same code: every
    word is proven once per field kind, and every field once (a field added later included),
    instead of every field times every word.
    """
    cases, turn = [], {}
    for name, annotation in fields:
        kind, choices = repr(annotation), list(words(annotation))
        if not choices:
            continue
        if kind not in turn:
            cases += [(name, word) for word in choices]
            turn[kind] = 0
        else:
            turn[kind] += 1
            cases.append((name, choices[turn[kind] % len(choices)]))
    return cases
