"""docs/methods.md's table of methods, made from the registrations (tests/project/test_docs.py holds the page to it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...options import DEFAULT_METHOD
from .registry import CamMethod

HEADER = "| `--method` | map | paper | extra cost | grids |\n|---|---|---|---|---|\n"


def methods_table(methods: Iterable[CamMethod[Any]]) -> str:
    """The Markdown table of ``methods``: each one's ``--method`` name (the default marked), its map, paper and extra
    cost (:attr:`CamMethod.formula`, :attr:`CamMethod.paper`, :attr:`CamMethod.cost`), and the ranks of the grids its
    maps may have (:attr:`CamMethod.ranks`: ``1-D, 2-D, 3-D`` or ``2-D``)."""
    rows = []
    for method in methods:
        name = f"`{method.name}`" + (" (default)" if method.name == DEFAULT_METHOD else "")
        grids = ", ".join(f"{rank}-D" for rank in sorted(method.ranks))
        rows.append(f"| {name} | {method.formula} | {method.paper} | {method.cost} | {grids} |\n")
    return HEADER + "".join(rows)
