"""Records: one row per image, target and method (or per failed or skipped image), as the manifest and --json give."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..io.manifest import MANIFEST_FIELDS
from .results import Prediction, rescaled


@dataclass
class Record:
    """One manifest row: an image with one target and method, or an image that failed or was skipped.

    ``fingerprint``: the map in small (:mod:`gradcam_cli.drift.fingerprint`; images only); ``provenance``: how it
    was made (:mod:`gradcam_cli.drift.provenance`; set by the :class:`~gradcam_cli.pipeline.session.Session`)."""

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
    fingerprint: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready data, in manifest column order (predictions as {index, name, probability},
        with a detection's ``box`` and a segmenter's class ``share`` where they have one; a probability that is not
        finite becomes null, so the JSON stays valid)."""
        row = asdict(self)
        for prediction in [row["target"], *row["predictions"]]:
            if prediction is not None:
                probability = prediction["probability"]
                prediction["probability"] = round(probability, 6) if math.isfinite(probability) else None
                prediction.update(prediction.pop("details") or {})
                for extra in ("box", "share", "score"):
                    if prediction[extra] is None:
                        del prediction[extra]
                if "box" in prediction:
                    prediction["box"] = list(prediction["box"])
                if "share" in prediction:
                    prediction["share"] = round(prediction["share"], 6)
        return {key: row[key] for key in MANIFEST_FIELDS}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Record:
        """A record from a manifest row (:meth:`to_dict`'s form); a null probability becomes NaN."""
        target = _prediction(row.get("target"))
        predictions = [p for p in map(_prediction, row.get("predictions") or []) if p is not None]
        return cls(
            str(row["input"]),
            str(row["status"]),
            str(row.get("model") or ""),
            str(row.get("layer") or ""),
            row.get("method") or None,
            target,
            predictions,
            [str(path) for path in row.get("outputs") or []],
            row.get("error") or None,
            float(row.get("seconds") or 0.0),
            row.get("fingerprint") if isinstance(row.get("fingerprint"), dict) else None,
            row.get("provenance") if isinstance(row.get("provenance"), dict) else None,
        )


def in_original_pixels(rows: list[Record], shown: tuple[int, int], original: tuple[int, int] | None) -> list[Record]:
    """``rows`` of an image explained at ``shown`` (height, width) with their boxes, areas and keypoints in the
    pixels of the ``original`` it was shrunk from (``--max-side``; ``None``: not shrunk), as copies."""
    if original is None or original == shown:
        return rows
    scale = original[0] / shown[0], original[1] / shown[1]
    return [
        replace(
            row,
            target=rescaled(row.target, *scale) if row.target is not None else None,
            predictions=[rescaled(p, *scale) for p in row.predictions],
        )
        for row in rows
    ]


def _prediction(value: Any) -> Prediction | None:
    if not isinstance(value, dict) or not isinstance(value.get("index"), int):
        return None
    probability = value.get("probability")
    box = value.get("box")
    share = value.get("share")
    return Prediction(
        value["index"],
        str(value.get("name", "")),
        math.nan if probability is None else probability,
        box=(float(box[0]), float(box[1]), float(box[2]), float(box[3]))
        if isinstance(box, list) and len(box) == 4
        else None,
        share=float(share) if isinstance(share, int | float) else None,
        score=str(value["score"]) if isinstance(value.get("score"), str) else None,
        details={key: item for key, item in value.items() if key not in _OWN_KEYS} or None,
    )


_OWN_KEYS = frozenset(("index", "name", "probability", "box", "share", "score"))
"""A prediction's keys in a row that are not a task's :attr:`~gradcam_cli.cam.results.Prediction.details`."""
