"""Benchmark prompt sets: the built-in one, a user's ShareGPT JSON or ``custom`` JSONL, or random ids.

SGLang 0.5.23's ``sglang.bench_serving`` reads local files, no download, with
``--dataset-name sharegpt --dataset-path FILE`` (a JSON array of records whose ``conversations``
(or ``conversation``) list has at least two turns; it uses the first two turns' ``value``) and
``--dataset-name custom --dataset-path FILE`` (JSON Lines, the same records one a line, a turn's
text in ``content`` or ``value``; sglang/benchmark/datasets/custom.py). Records with fewer than two
turns are skipped by SGLang, and so are they here (counted); anything else that is not that shape
is an error naming the file and line (exit 3), before any host is touched. SGLang silently skips a
JSONL line that is not JSON; here it is an error (a half-written file should not shrink a benchmark).

Acceptance measured on random token ids says little about real traffic (sglang#25359: accept
rate 0.13-0.27 on ``random`` 1024/1024 against accept lengths 2.4-4.7 on chat data for the same
drafters), so without ``--dataset`` the benchmark uses the built-in set (deploy/data/prompts.json,
written by the team with contrib/make_builtin_prompts.py: chat, code, math, summarisation);
``random-ids`` only when asked. verify-acceptance draws its prompts from the same built-in set.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.base.once import built_once
from deploy.base.limits import MAX_JSON_DEPTH, JSONTooDeep, check_json_depth, parse_json
from deploy.base.errors import ConfigError
from deploy.base.shell import path_join

BUILTIN = "builtin"
RANDOM_IDS = "random-ids"
#: the whole file is read (and uploaded) in memory: take a subset of a bigger corpus (the full
#: ShareGPT_V3 split is 642 MB; a few thousand records measure a drafter as well)
MAX_BYTES = 128 * 1024 * 1024
MAX_RECORDS = 500_000
#: one turn's text; a longer prompt is beyond any server's context anyway
MAX_TURN_CHARS = 1_000_000


@dataclass(frozen=True)
class Dataset:
    """A validated prompt set: what bench_serving reads and what every record names."""

    name: str  # "builtin", "random-ids" or the file's name
    kind: str  # bench_serving's --dataset-name: sharegpt | custom | random-ids
    sha256: str | None
    source: str  # where it came from, for messages
    content: bytes = field(default=b"", repr=False)
    #: the first (human) turn of each usable record, in file order
    prompts: tuple[str, ...] = field(default=(), repr=False)
    skipped: int = 0

    @property
    def is_file(self) -> bool:
        return self.kind != RANDOM_IDS

    def identity(self) -> dict[str, Any]:
        """What a benchmark record says about its prompts (compared by the regression gate)."""
        return {"dataset": self.name, "dataset_kind": self.kind, "dataset_sha256": self.sha256}

    def remote_path(self, state_root: str) -> str:
        """Where the file lives on a host: named by its sha256, so it is uploaded once per content."""
        assert self.sha256 is not None
        return path_join(state_root, "datasets", f"{self.sha256}.{'jsonl' if self.kind == 'custom' else 'json'}")


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


class _Lines:
    """Line numbers of increasing offsets, counted once: ``_line`` per record counted from the start
    each time (100,000 records on one 44 MB line took minutes)."""

    def __init__(self, text: str):
        self.text, self.offset, self.line = text, 0, 1

    def at(self, offset: int) -> int:
        if offset < self.offset:
            return _line(self.text, offset)
        self.line += self.text.count("\n", self.offset, offset)
        self.offset = offset
        return self.line


def _turn_text(turn: Any, keys: tuple[str, ...], where: str) -> str:
    if not isinstance(turn, dict):
        raise ConfigError(f"{where}: a turn must be an object like {{\"from\": \"human\", \"value\": \"...\"}}, "
                          f"found {type(turn).__name__}")
    for key in keys:
        if key in turn:
            value = turn[key]
            if not isinstance(value, str):
                raise ConfigError(f"{where}: turn {key!r} must be a string, found {type(value).__name__}")
            if len(value) > MAX_TURN_CHARS:
                raise ConfigError(f"{where}: a turn has {len(value)} characters, more than {MAX_TURN_CHARS}")
            return value
    raise ConfigError(f"{where}: a turn has no {' or '.join(repr(k) for k in keys)} text (keys: {sorted(turn)[:6]})")


def _record_prompt(record: Any, keys: tuple[str, ...], where: str) -> str | None:
    """The record's first turn, or None when SGLang would skip it (fewer than two turns)."""
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: a record must be an object with a \"conversations\" list, "
                          f"found {type(record).__name__}")
    turns = record.get("conversations", record.get("conversation"))
    if turns is None:
        raise ConfigError(f"{where}: a record has no \"conversations\" list (keys: {sorted(record)[:6]})")
    if not isinstance(turns, list):
        raise ConfigError(f"{where}: \"conversations\" must be a list of turns, found {type(turns).__name__}")
    texts = [_turn_text(turn, keys, where) for turn in turns]
    if len(texts) < 2:
        return None
    return texts[0] if texts[0].strip() else None


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{source}:{line}: not UTF-8 text "
                          f"(byte {exc.start}); bench_serving reads the file as UTF-8") from None


def parse_sharegpt(data: bytes, source: str) -> tuple[tuple[str, ...], int]:
    """(usable prompts, skipped records) of a ShareGPT JSON array; ConfigError naming file and line."""
    text = _decode(data, source)
    decoder = json.JSONDecoder()
    position = len(text) - len(text.lstrip())
    if not text[position:position + 1] == "[":
        raise ConfigError(f"{source}:{_line(text, position)}: a ShareGPT dataset is a JSON array of records "
                          f"([{{\"conversations\": [...]}}, ...]); it starts with {text[position:position + 20]!r}"
                          " (JSON Lines: name the file .jsonl)")
    position += 1
    lines = _Lines(text)
    prompts: list[str] = []
    skipped = 0
    index = 0
    while True:
        while position < len(text) and text[position] in " \t\r\n":
            position += 1
        if text[position:position + 1] == "]" and index == 0:
            position += 1
            break
        try:
            record, end = decoder.raw_decode(text, position)
            check_json_depth(record, MAX_JSON_DEPTH - 1)  # inside the top-level array
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source}:{exc.lineno}: invalid JSON (column {exc.colno}: {exc.msg})") from None
        except (RecursionError, JSONTooDeep):
            raise ConfigError(f"{source}:{lines.at(position)}: record {index + 1} is nested more than "
                              f"{MAX_JSON_DEPTH} levels deep; not a ShareGPT record") from None
        where = f"{source}:{lines.at(position)}: record {index + 1}"
        prompt = _record_prompt(record, ("value",), where)
        if prompt is None:
            skipped += 1
        else:
            prompts.append(prompt)
        index += 1
        if index > MAX_RECORDS:
            raise ConfigError(f"{source}: more than {MAX_RECORDS} records; take a subset")
        position = end
        while position < len(text) and text[position] in " \t\r\n":
            position += 1
        if text[position:position + 1] == ",":
            position += 1
            continue
        if text[position:position + 1] == "]":
            position += 1
            break
        raise ConfigError(f"{source}:{_line(text, position)}: expected ',' or ']' after record {index}, "
                          f"found {text[position:position + 20]!r}")
    if text[position:].strip():
        position += len(text[position:]) - len(text[position:].lstrip())
        raise ConfigError(f"{source}:{_line(text, position)}: text after the closing ']': "
                          f"{text[position:].strip()[:40]!r}")
    return tuple(prompts), skipped


def parse_custom(data: bytes, source: str) -> tuple[tuple[str, ...], int]:
    """(usable prompts, skipped records) of a ``custom`` JSONL file; ConfigError naming file and line."""
    text = _decode(data, source)
    prompts: list[str] = []
    skipped = 0
    records = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except JSONTooDeep:
            raise ConfigError(f"{source}:{number}: nested more than {MAX_JSON_DEPTH} levels deep; not a custom "
                              "dataset record") from None
        except ValueError as exc:
            raise ConfigError(f"{source}:{number}: not a JSON object ({exc}); a custom dataset has one record "
                              "a line") from None
        prompt = _record_prompt(record, ("content", "value"), f"{source}:{number}")
        if prompt is None:
            skipped += 1
        else:
            prompts.append(prompt)
        records += 1
        if records > MAX_RECORDS:
            raise ConfigError(f"{source}: more than {MAX_RECORDS} records; take a subset")
    return tuple(prompts), skipped


def from_bytes(data: bytes, name: str, kind: str, source: str) -> Dataset:
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{source}: {len(data)} bytes, more than the {MAX_BYTES // (1024 * 1024)} MiB a dataset "
                          "may have (it is read and uploaded whole); take a subset")
    parse = parse_custom if kind == "custom" else parse_sharegpt
    prompts, skipped = parse(data, source)
    if not prompts:
        raise ConfigError(f"{source}: no usable record (a record needs a \"conversations\" list of at least two "
                          f"turns with a non-empty first turn; {skipped} skipped)")
    return Dataset(name=name, kind=kind, sha256=hashlib.sha256(data).hexdigest(), source=source, content=data,
                   prompts=prompts, skipped=skipped)


@functools.lru_cache(maxsize=8)
def _load_file(path: str, size: int, mtime_ns: int) -> Dataset:
    kind = "custom" if path.endswith(".jsonl") else "sharegpt"
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the dataset: {exc.strerror or exc}") from None
    return from_bytes(data, os.path.basename(path), kind, path)


def load_file(path: str | Path) -> Dataset:
    """A local ShareGPT ``.json`` (or ``custom`` ``.jsonl``) file, validated; ConfigError (exit 3)."""
    text = str(path)
    if not (text.endswith(".json") or text.endswith(".jsonl")):
        raise ConfigError(f"{text}: a dataset file must be ShareGPT JSON (.json) or SGLang's custom JSON Lines "
                          "(.jsonl); or use 'builtin' or 'random-ids'")
    try:
        info = os.stat(text)
    except OSError as exc:
        raise ConfigError(f"{text}: dataset file not found ({exc.strerror or exc})") from None
    if not os.path.isfile(text):
        raise ConfigError(f"{text}: the dataset is not a regular file")
    if info.st_size > MAX_BYTES:
        raise ConfigError(f"{text}: {info.st_size} bytes, more than the {MAX_BYTES // (1024 * 1024)} MiB a dataset "
                          "may have (it is read and uploaded whole); take a subset")
    return _load_file(os.path.abspath(text), info.st_size, info.st_mtime_ns)


@built_once  # every host's benchmark step asks for it at once
def builtin() -> Dataset:
    data = (importlib.resources.files("deploy") / "data" / "prompts.json").read_bytes()
    return from_bytes(data, BUILTIN, "sharegpt", "deployctl's built-in prompt set (deploy/data/prompts.json)")


def random_ids() -> Dataset:
    return Dataset(name=RANDOM_IDS, kind=RANDOM_IDS, sha256=None, source="random token ids")


def resolve(value: str, base: Path | None = None) -> Dataset:
    """``builtin``, ``random-ids`` or a file path (relative to ``base``, the config file's folder)."""
    if value == BUILTIN:
        return builtin()
    if value == RANDOM_IDS:
        return random_ids()
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return load_file(path)


def verify_prompts(count: int) -> list[str]:
    """verify-acceptance's prompts: the first ``count`` of the built-in set (its kinds interleave)."""
    prompts = builtin().prompts
    return [prompts[i % len(prompts)] for i in range(count)]
