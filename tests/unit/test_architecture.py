"""The package's shape, kept by an ast scan of deploy/ (docs/architecture.md says why):

- no import cycle among deploy modules, counting every import (inside functions and under
  ``TYPE_CHECKING`` too: a lazy import still ties the two modules together);
- no module imports another module's ``_private`` name;
- no product file over 700 lines;
- every module listed on its floor (FLOORS), a folder per floor, nothing loose at deploy/'s top, and
  no import from a floor above.
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
    assert "deploy.engine.playbook" in targets


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


#: floors, lowest first, each the folders on it and every module of each folder: a module may import its
#: own floor and those below it, never one above. A new module is placed here deliberately
#: (test_every_module_is_on_a_floor), and a folder is on one floor whole (docs/architecture.md).
FLOORS: list[tuple[str, dict[str, tuple[str, ...]]]] = [
    # pure leaves and the host-side programs: import nothing above
    ("base", {
        "deploy.base": ("__init__", "errors", "limits", "once", "secrets", "shell", "signals", "terminal"),
        "deploy.remote": ("__init__", "doctor_facts", "drafter_swap", "fleet_ops", "host_lock", "host_ops",
                          "host_ops_args", "http_plain", "listeners", "package_metadata", "quarantine", "server_status",
                          "sglang_cli", "sglang_source", "state_files"),
        "deploy.remote.fixer": ("__init__", "__main__", "checkpoint", "cli", "config", "conversion", "errors",
                                "fileio", "header", "loader", "plan", "rename", "restoration", "sidecar", "store"),
    }),
    # the YAML"s models and loader
    ("config", {
        "deploy.config": ("__init__", "loader", "models"),
    }),
    # reaching a host, what it runs, what is kept locally
    ("reach", {
        "deploy.ssh": ("__init__", "agent", "bounded_channel", "config", "config_eval", "hop", "process_group", "transport",
                       "trust"),
        "deploy.host": ("__init__", "deployment", "records", "sglang_argv", "state_layout"),
        "deploy.local": ("__init__", "canary_gate", "datasets", "history", "same_night", "state", "throughput_gate"),
    }),
    # command builders and strict parsers; the doctor"s judgements over them
    ("facts", {
        "deploy.facts": ("__init__", "bench", "canary", "doctor", "drafter_swap", "fixer", "fuser", "gpus", "helpers",
                         "host_helper", "inline", "quarantine", "router", "server", "status"),
        "deploy.doctor": ("__init__", "before_stop", "checks", "sglang_options", "speculation", "suspects",
                          "verdict"),
    }),
    # one module per playbook step
    ("steps", {
        "deploy.steps": ("__init__", "base", "benchmark", "converge", "doctor", "ensure_helper",
                         "failure_cause", "fix_keys", "free_gpus", "launch", "memory", "quarantine", "record_good",
                         "regression_gate", "same_night_control", "stop_stale", "swap_decision", "swap_drafter",
                         "verify_acceptance", "wait_gpus_free", "wait_ready"),
    }),
    # the host session, playbooks, locks, fan-out
    ("engine", {
        "deploy.engine": ("__init__", "fanout", "locks", "outcome", "plan", "playbook", "records", "run",
                          "serving", "session"),
    }),
    # run-level phases: router, rolling batches, node groups
    ("fleet", {
        "deploy.fleet": ("__init__", "canary", "doctor", "nodes", "phases", "plan", "rolling", "rollout", "router",
                         "router_package", "router_plan", "router_ports", "router_watch"),
    }),
    # the read-only verbs and sweeps
    ("verbs", {
        "deploy.verbs": ("__init__", "bench", "bench_sweep", "deploy", "inspect", "selection", "status"),
    }),
    # what a person reads
    ("render", {
        "deploy.render": ("__init__", "bench_report", "canary_report", "report", "status"),
    }),
    # one module per verb, and the package"s entry points
    ("cli", {
        "deploy.cli": ("__init__", "bench", "common", "doctor", "down", "fix_keys", "gpu_status", "history",
                       "logs", "main", "nightly", "options", "plan", "restart", "status", "up"),
        "deploy": ("__init__", "__main__"),
    }),
]


#: module -> (floor index, folder), from FLOORS
PLACED = {(folder if name == "__init__" else f"{folder}.{name}"): (i, folder)
          for i, (_, folders) in enumerate(FLOORS) for folder, names in folders.items() for name in names}


def floor_of(module: str) -> int:
    assert module in PLACED, f"{module} is on no floor: add it to FLOORS (and docs/architecture.md)"
    return PLACED[module][0]


def test_every_module_is_on_a_floor():
    """Every module under deploy/ is listed, and every listed module exists: a new module (or a moved
    one) is placed on a floor by whoever adds it, not by a prefix that happens to match."""
    assert sorted(set(MODULES) - set(PLACED)) == []
    assert sorted(set(PLACED) - set(MODULES)) == []


def test_a_floor_is_whole_folders():
    """A module sits in the folder FLOORS says, so a folder's floor is one fact: the folder's path."""
    misplaced = [f"{m} is listed under {listed}" for m, (_, listed) in PLACED.items() if folder(m) != listed]
    assert misplaced == []


def test_the_top_level_holds_only_the_package_entry_points():
    """Issue 25: deploy/ itself holds __init__.py and __main__.py; every other module is in its floor's folder."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"]


def test_floor_of_refuses_an_unlisted_module():
    with pytest.raises(AssertionError, match="deploy.nowhere is on no floor"):
        floor_of("deploy.nowhere")
    assert floor_of("deploy.cli.main") > floor_of("deploy.render.report") > floor_of("deploy.verbs.status") \
        > floor_of("deploy.fleet.rolling") > floor_of("deploy.engine.session") > floor_of("deploy.steps.launch") \
        > floor_of("deploy.facts.server") > floor_of("deploy.ssh.transport") > floor_of("deploy.config.models") \
        > floor_of("deploy.base.errors")
    assert floor_of("deploy.remote.fixer.cli") == floor_of("deploy.base.shell") == 0


def test_no_upward_import():
    bad = []
    for module, targets in graph().items():
        for target in targets:
            if floor_of(target) > floor_of(module):
                bad.append(f"{module} ({FLOORS[floor_of(module)][0]}) imports {target} ({FLOORS[floor_of(target)][0]})")
    assert sorted(bad) == []
