"""The package's shape, kept by an ast scan of deploy/ (docs/architecture.md says why):

- no import cycle among deploy modules, counting every import (inside functions and under
  ``TYPE_CHECKING`` too: a lazy import still ties the two modules together);
- no module imports another module's ``_private`` name;
- no product file over 700 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "deploy"
MAX_LINES = 700

#: cycles being removed on other branches: each names the work that removes it (delete the entry
#: once it has landed). Only these exact cycles may exist.
EXPECTED_CYCLES: set[frozenset[str]] = set()
#: cross-folder private names still read on other branches: (module, module it reads, name)
EXPECTED_PRIVATE: set[tuple[str, str, str]] = set()

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str) -> list[tuple[str, str | None]]:
    """(imported deploy module, imported name or None) for every import statement in the module."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "deploy"]
        elif isinstance(node, ast.ImportFrom):
            target = resolve(module, node)
            if target.split(".")[0] != "deploy":
                continue
            for alias in node.names:
                # ``from deploy.steps import converge`` imports the module deploy.steps.converge
                sub = f"{target}.{alias.name}"
                found.append((sub, None) if sub in MODULES else (target, alias.name))
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _ in imports_of(module):
            # importing a.b.c runs a/__init__ and a/b/__init__ too, but those only re-export lazily here;
            # the edge that matters is to the module itself
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges[module].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_scan_sees_imports_inside_functions_and_type_checking():
    # the scan itself: the engine imports steps lazily and under TYPE_CHECKING
    targets = {t for t, _ in imports_of("deploy.engine.session")}
    assert "deploy.steps.base" in targets
    assert "deploy.playbook" in targets


def test_no_import_cycle():
    found = cycles(graph())
    unexpected = [sorted(c) for c in found if c not in EXPECTED_CYCLES]
    assert unexpected == [], f"import cycles among deploy modules: {unexpected}"


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def folder(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def private_reads(module: str) -> list[tuple[str, str]]:
    """(module, name) for every ``_name`` this module takes from another deploy module: imported
    (``from m import _x``) or read off an imported module (``import m as a`` ... ``a._x``)."""
    reads = [(t, n) for t, n in imports_of(module) if n is not None and n.startswith("_") and not n.startswith("__")]
    tree = ast.parse(MODULES[module].read_text())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = resolve(module, node)
            for a in node.names:
                if f"{target}.{a.name}" in MODULES:
                    aliases[a.asname or a.name] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                and node.attr.startswith("_") and not node.attr.startswith("__"):
            reads.append((aliases[node.value.id], node.attr))
    return reads


def test_no_cross_folder_private_name():
    """A ``_name`` is its folder's business (deploy/remote/fixer/'s modules share theirs, as one
    host-side program); another folder takes only public names."""
    bad = sorted({f"{module}: {target}.{name}" for module in MODULES for target, name in private_reads(module)
                  if (folder(target) if target in MODULES else target.rpartition('.')[0]) != folder(module)
                  and (module, target, name) not in EXPECTED_PRIVATE})
    assert bad == []


def test_no_product_file_over_700_lines():
    """Every product module, one test: the offenders are listed together (a case per module was
    120 tests of one len())."""
    lengths = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    assert len(lengths) >= 50  # the walk found the product's modules
    over = [f"{MODULES[m].relative_to(ROOT)}: {n} lines (at most {MAX_LINES})" for m, n in sorted(lengths.items())
            if n > MAX_LINES]
    assert over == []


#: floors, lowest first: a module may import its own floor and those below it, never one above
FLOORS = [
    ("base", ("deploy.errors", "deploy.limits", "deploy.shell", "deploy.config", "deploy.state_layout",
              "deploy.sglang", "deploy.ssh_config", "deploy.ssh_trust", "deploy.connect", "deploy.transport",
              "deploy.fanout", "deploy.remote", "deploy.local_state", "deploy.history",
              # issue 22 (HOSTILE): pure leaf modules, importing only deploy.errors
              "deploy.terminal", "deploy.bounded_channel", "deploy.ssh_agent", "deploy.ssh_config_eval",
              # issue 20 (BENCH): the dataset rules (local file checks, the built-in prompt set)
              "deploy.datasets",
              # issue 17 (RELIABILITY): SIGTERM/SIGHUP handled like Ctrl-C
              "deploy.signals")),
    ("facts", ("deploy.facts", "deploy.doctor", "deploy.locks", "deploy.serving")),
    ("steps", ("deploy.steps", "deploy.playbook")),
    ("engine", ("deploy.engine",)),
    ("fleet", ("deploy.fleet",)),
    ("verbs", ("deploy.inspect", "deploy.render", "deploy.cli", "deploy.__main__", "deploy")),
]


def floor_of(module: str) -> int:
    best, level = -1, -1
    for i, (_, prefixes) in enumerate(FLOORS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), i
    assert level >= 0, f"{module} is on no floor: add it to FLOORS (and docs/architecture.md)"
    return level


def test_no_upward_import():
    bad = []
    for module, targets in graph().items():
        for target in targets:
            if floor_of(target) > floor_of(module):
                bad.append(f"{module} ({FLOORS[floor_of(module)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})")
    assert sorted(bad) == []
