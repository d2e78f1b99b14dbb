"""Size and depth limits for every YAML file deployctl reads (config, playbooks).

A hostile or broken input must end in a clean error naming the file, never in a RecursionError
traceback or minutes of parsing: PyYAML's composer and constructor recurse once per nesting level
(``[[[[...]]]]`` a few thousand deep exhausts the stack), and a 50 MB config took two minutes and
2.7 GB. So: the size is checked before reading (and the read itself is bounded), a RecursionError
is caught where it happens, and the composed node graph is walked without recursion to bound the
depth and the number of nodes once aliases are expanded (``&a [*a, *a]`` doubling per level is a
"billion laughs" for pydantic).

The host-side key fixer (the package deploy/remote/fixer/) must stay standalone, so it carries
its own JSON guard with the same rules.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: deployctl configs and playbooks are a few KB; 1 MiB is far above any real one.
MAX_YAML_BYTES = 1 << 20
#: nesting depth of mappings and sequences (a real config is 4-5 deep).
MAX_YAML_DEPTH = 32
#: nodes after alias expansion: bounds what validation walks.
MAX_YAML_NODES = 200_000


class InputTooLarge(ValueError):
    """A file or document over a limit; the message says which limit."""


#: line/paragraph separators some tools read as newlines, and bidi overrides that make a path
#: display as something else than it is
_INVISIBLE = frozenset("\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff")


def has_control_chars(text: str) -> bool:
    """True for control characters: C0 (newline, tab, NUL, ESC...), DEL, C1, and _INVISIBLE."""
    return any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch in _INVISIBLE for ch in text)


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``; InputTooLarge over ``limit`` bytes.

    Opened non-blocking so a FIFO given as the config does not hang, and read at most
    ``limit + 1`` bytes so a file growing while read (or /dev/zero) cannot exhaust memory.
    Raises OSError for unreadable files and IsADirectoryError/InputTooLarge as appropriate.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise InputTooLarge("not a regular file (a device, FIFO or socket)")
        if st.st_size > limit:
            raise InputTooLarge(f"{st.st_size} bytes, over the limit of {limit} bytes")
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise InputTooLarge(f"more than {limit} bytes, over the limit")
        return data
    finally:
        os.close(fd)


def check_yaml_graph(root, max_depth: int = MAX_YAML_DEPTH, max_nodes: int = MAX_YAML_NODES) -> None:
    """Bound depth and expanded size of a composed YAML node graph, without recursion.

    Raises InputTooLarge naming the line where the limit was crossed. Recursive aliases
    (``&a [*a]``) are refused as well: they construct a self-containing list.
    """
    import yaml

    if root is None:
        return
    expanded: dict[int, int] = {}
    # iterative post-order: (node, depth, children_done)
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    on_path: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        if done:
            on_path.discard(key)
            total = 1 + sum(expanded[id(c)] for c in children)
            if total > max_nodes:
                raise InputTooLarge(
                    f"line {node.start_mark.line + 1}: more than {max_nodes} values once aliases are expanded"
                )
            expanded[key] = total
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise InputTooLarge(f"line {node.start_mark.line + 1}: an alias refers to a node that contains it")
        if depth > max_depth:
            raise InputTooLarge(f"line {node.start_mark.line + 1}: nested more than {max_depth} levels deep")
        on_path.add(key)
        stack.append((node, depth, True))
        for child in children:
            if id(child) in on_path:
                raise InputTooLarge(
                    f"line {child.start_mark.line + 1}: an alias refers to a node that contains it"
                )
            if id(child) not in expanded:
                stack.append((child, depth + 1, False))


#: nesting depth of any JSON document deployctl reads (datasets, host answers, host records,
#: quarantine entries, /server_info bodies): the deepest real one (a doctor facts document) is
#: under 10. Python's json recursed once per level: a ShareGPT record or a /server_info body
#: nested a few thousand deep was "internal error: RecursionError" (issue 31).
MAX_JSON_DEPTH = 64


class JSONTooDeep(InputTooLarge):
    """A JSON document nested deeper than MAX_JSON_DEPTH (a ValueError: callers name the file or host)."""


def check_json_depth(value, max_depth: int = MAX_JSON_DEPTH) -> None:
    """JSONTooDeep when ``value`` (a decoded document) nests lists/objects more than ``max_depth`` deep.

    Iterative: walking a deep document must not recurse either. ``[]`` is depth 1, ``[[]]`` depth 2.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > max_depth:
            raise JSONTooDeep(f"nested more than {max_depth} levels deep")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def parse_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH):
    """``json.loads`` bounded in depth: ValueError (JSONTooDeep) instead of a RecursionError.

    The size is the caller's bound (every reader caps its bytes before this)."""
    import json

    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONTooDeep(f"nested more than {max_depth} levels deep") from None
    check_json_depth(value, max_depth)
    return value
