"""Every benchmark script imports, and every library name it imports exists (also those imported inside functions,
which a plain import would not reach): a moved or renamed name breaks this test, not ``make bench`` months later."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest
from conftest import ROOT

SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _library_imports(script: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``from gradcam_cli... import name`` in the script, at any depth."""
    found = []
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gradcam_cli":
            found += [(node.module, alias.name) for alias in node.names]
    return found


def test_there_are_benchmarks() -> None:
    assert {path.name for path in SCRIPTS} >= {"run.py", "bench_batch.py", "bench_methods.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_benchmark_imports(script: Path) -> None:
    spec = importlib.util.spec_from_file_location(f"_bench_{script.stem}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # top-level imports and definitions; nothing runs (each has a __main__ guard)
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
    for module_name, name in _library_imports(script):
        assert hasattr(importlib.import_module(module_name), name), f"{script.name}: {module_name}.{name} is gone"
