"""The package's shape: its layers, each importing only from those below it, no import cycles between its modules
(type-checking imports and imports inside functions count too), no private names used across modules, no module over
the size we agreed on. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "gradcam_cli"
MAX_LINES = 400
LAYERS = (
    ("gradcam_cli", "errors"),
    ("registry", "targets"),
    ("options",),
    ("io",),
    ("models",),
    ("cam",),
    ("render",),
    ("drift", "evaluation"),
    ("pipeline",),
    ("serve",),
    ("cli",),
    ("__main__",),
)
"""The package's layers, lowest first (docs/internals.md, "Package layout"): each top-level module or subpackage of
``gradcam_cli`` (``gradcam_cli`` itself: its ``__init__``, whose exports are loaded by name) imports only from the
layers below its own, never from one beside it or above it."""
TASKS = PACKAGE / "cam" / "tasks"
ASKED_OF_ADAPTERS = re.compile(r"\.ranked|\.faithfulness\b|Task\.DETECT|isinstance\([^)]*Targets")
"""What a task decides, read outside its adapter: a flag of it, the old task enum, a test of a task's targets."""


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


def _unit(module: str) -> str:
    """The layer unit ``module`` belongs to: its top-level module or subpackage of ``gradcam_cli``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _upward(imports: dict[str, list[tuple[str, str, int]]]) -> dict[tuple[str, str], list[str]]:
    """(module, unit imported) -> the lines, for every import of a unit in a layer not below the module's own."""
    level = {unit: index for index, units in enumerate(LAYERS) for unit in units}
    found: dict[tuple[str, str], list[str]] = {}
    for module, edges in imports.items():
        unit = _unit(module)
        for target, name, line in edges:
            other = _unit(target)
            if other != unit and level[other] >= level[unit]:
                found.setdefault((module, other), []).append(f"{module}:{line} imports {target}.{name}")
    return found


@pytest.mark.quick
def test_every_module_is_in_a_layer() -> None:
    units = {_unit(module) for module in _imports()}
    listed = {unit for units in LAYERS for unit in units}
    assert units == listed


@pytest.mark.quick
def test_imports_point_down_the_layers() -> None:
    upward = _upward(_imports())
    assert not upward


def test_an_upward_import_is_caught() -> None:
    imports = {
        "gradcam_cli.cam.results": [("gradcam_cli.render.colour", "blend", 3)],
        "gradcam_cli.render.gallery": [("gradcam_cli.pipeline.records", "Record", 9)],
        "gradcam_cli.drift.page": [("gradcam_cli.evaluation.metrics", "auc", 5)],  # beside it: refused too
        "gradcam_cli.pipeline.batch": [("gradcam_cli.cam.results", "Prediction", 7)],  # down: fine
    }
    assert set(_upward(imports)) == {
        ("gradcam_cli.cam.results", "render"),
        ("gradcam_cli.render.gallery", "pipeline"),
        ("gradcam_cli.drift.page", "evaluation"),
    }


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
        if ASKED_OF_ADAPTERS.search(line)
    ]
    assert not found, found
