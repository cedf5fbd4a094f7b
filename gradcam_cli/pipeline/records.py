"""Records: one row per image, target and method (or per failed or skipped image), as the manifest and --json give."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..cam.results import Prediction
from ..io.manifest import MANIFEST_FIELDS


@dataclass
class Record:
    """One manifest row: an image with one target and method, or an image that failed or was skipped."""

    input: str
    status: str
    model: str
    layer: str
    method: str | None = None
    target: Prediction | None = None
    predictions: list[Prediction] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready data, in manifest column order (predictions as {index, name, probability};
        a probability that is not finite becomes null, so the JSON stays valid)."""
        row = asdict(self)
        for prediction in [row["target"], *row["predictions"]]:
            if prediction is not None:
                probability = prediction["probability"]
                prediction["probability"] = round(probability, 6) if math.isfinite(probability) else None
        return {key: row[key] for key in MANIFEST_FIELDS}
