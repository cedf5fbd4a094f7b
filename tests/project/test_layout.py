"""The package's shape: no import cycles between its modules (type-checking imports and imports inside functions
count too), no private names used across modules, no module over the size we agreed on. Read from the source with
``ast``; nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "gradcam_cli"
MAX_LINES = 400
TASKS = PACKAGE / "cam" / "tasks"
ASKED_OF_ADAPTERS = re.compile(r"\.ranked|\.faithfulness|Task\.DETECT|isinstance\([^)]*Targets")
"""What a task decides, read outside its adapter: a flag of it, the old task enum, a test of a task's targets."""
MODULE_NAMES = re.compile(r"vlm\.faithfulness")
"""Modules named like a flag (the answer's deletion and insertion), not a read of it."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports() -> dict[str, list[tuple[str, str, int]]]:
    """module -> [(imported module, imported name, line)] for every import of a module of the package."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    found: dict[str, list[tuple[str, str, int]]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges = found.setdefault(module, [])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(module, path.name == "__init__.py", node)
                for alias in node.names:
                    target = f"{source}.{alias.name}"
                    edges.append((target if target in modules else source, alias.name, node.lineno))
            elif isinstance(node, ast.Import):
                edges += [(alias.name, "", node.lineno) for alias in node.names]
    return {m: [e for e in edges if e[0] in modules and e[0] != m] for m, edges in found.items()}


def test_no_import_cycles() -> None:
    graph = {module: {target for target, _, _ in edges} for module, edges in _imports().items()}
    # A package's __init__ that re-exports its modules is not a cycle with them: drop edges to ancestors.
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_no_private_names_across_modules() -> None:
    used = [
        f"{module}:{line} uses {target}.{name}"
        for module, edges in _imports().items()
        for target, name, line in edges
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not used, used


@pytest.mark.quick
def test_modules_stay_small() -> None:
    sizes = {
        path.relative_to(ROOT): len(path.read_text(encoding="utf-8").splitlines()) for path in PACKAGE.rglob("*.py")
    }
    assert not {path: lines for path, lines in sizes.items() if lines > MAX_LINES}


@pytest.mark.quick
def test_tasks_own_their_behaviour() -> None:
    """Outside the task adapters (cam/tasks/) nothing reads an adapter's ``ranked`` or ``faithfulness``, tests for a
    detector by the task enum, or asks which kind of targets it holds: each is a method of the adapter or of the
    targets (docs/internals.md, "Task adapters")."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if TASKS not in path.parents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ASKED_OF_ADAPTERS.search(MODULE_NAMES.sub("", line))
    ]
    assert not found, found
