"""Import hygiene of the key fixer: no import cycle inside the package (type-only imports included:
conversion -> loader -> rename -> conversion was one), and no other folder imports its private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXER = REPO / "deploy" / "remote" / "fixer"


def _fixer_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update(alias.name for alias in node.names)
    return found


def test_the_fixer_package_has_no_import_cycle():
    graph = {p.stem: _fixer_imports(p) for p in FIXER.glob("*.py")}
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join(trail + [module])
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if dep in graph:
                visit(dep, trail + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("path", sorted(p for p in (REPO / "deploy").rglob("*.py") if FIXER not in p.parents),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_other_folder_uses_a_private_fixer_name(path):
    tree = ast.parse(path.read_text())
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("deploy.remote.fixer"):
            private = [a.name for a in node.names if a.name.startswith("_")]
            assert not private, f"{path}: from {node.module} import {private}"
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
        if isinstance(node, ast.ImportFrom) and node.module == "deploy.remote":
            for alias in node.names:
                if alias.name == "fixer":
                    aliases[alias.asname or alias.name] = "fixer"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            raise AssertionError(f"{path}:{node.lineno}: {node.value.id}.{node.attr} is private to the fixer")
