"""The JSON Schema of ``gradcam eval --rank --json``'s output (docs/rank.schema.json; docs/evaluation.md, "Ranking"),
generated from the rows' dataclasses: one JSON object per line, either a ranking row (:class:`RankRow`, ``"kind":
"rank"``) or, with ``--meta``, a metric's meta-evaluation (:class:`MetaRow`, ``"kind": "meta"``). NaN is written as
null, so every number may be null.

``python -m gradcam_cli.evaluation.rank_schema`` writes docs/rank.schema.json (a test checks that it is current).
Within a :data:`SCHEMA_VERSION`, fields are only added, never renamed, removed or retyped.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from .meta import MetaRow
from .rank import RankRow

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "rank.schema.json"
ENUMS = {"better": ["lower", "higher"]}
"""Fields whose values are one of a few strings."""


def _type(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a field's type hint (floats nullable: NaN is written as null)."""
    if hint is float:
        return {"type": ["number", "null"]}
    simple = {str: "string", bool: "boolean", int: "integer"}
    if hint in simple:
        return {"type": simple[hint]}
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        kinds = [_type(arg) for arg in args if arg is not type(None)]
        assert len(kinds) == 1, hint
        return {"type": [*_as_list(kinds[0]["type"]), "null"]}
    if origin is list:
        return {"type": "array", "items": _type(args[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type(args[1])}
    raise TypeError(f"no JSON Schema for {hint!r}")


def _as_list(kind: str | list[str]) -> list[str]:
    return [kind] if isinstance(kind, str) else [k for k in kind if k != "null"]


def _row(cls: type, kind: str, description: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {"kind": {"const": kind}}
    for field in dataclasses.fields(cls):
        properties[field.name] = {
            **_type(hints[field.name]),
            **({"enum": ENUMS[field.name]} if field.name in ENUMS else {}),
        }
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def schema() -> dict[str, Any]:
    """The schema of one line of ``gradcam eval --rank --json``."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "gradcam eval --rank --json: one object per line",
        "description": "A ranking row (kind rank: one method on one metric) or a metric's meta-evaluation (kind "
        "meta, with --meta). NaN is written as null. docs/evaluation.md, 'Ranking' and 'Meta-evaluation', says "
        "what each field means.",
        "version": SCHEMA_VERSION,
        "oneOf": [{"$ref": "#/$defs/rank"}, {"$ref": "#/$defs/meta"}],
        "$defs": {
            "rank": _row(RankRow, "rank", "One method's place on one metric (gradcam_cli.evaluation.rank.RankRow)."),
            "meta": _row(MetaRow, "meta", "One metric's meta-evaluation (gradcam_cli.evaluation.meta.MetaRow)."),
        },
    }


def schema_text() -> str:
    """docs/rank.schema.json's text."""
    return json.dumps(schema(), indent=2) + "\n"


if __name__ == "__main__":  # pragma: no cover - the writer of docs/rank.schema.json
    SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
    sys.stdout.write(f"wrote {SCHEMA_PATH}\n")
