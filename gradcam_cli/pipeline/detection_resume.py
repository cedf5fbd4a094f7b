"""Resuming a detector's run (``--skip-existing``): its images are found done by their combined overlays.

A detector's image has as many files as it has detections, which a resumed run cannot know before running the
model; but each method's combined map (``<stem>_<method>_boxes``, written also when nothing was detected) is
written after all of that image's per-detection files. An image is skipped when, for every method, the combined
map's listed files exist. Its rows are the earlier run's rows of that image from the manifest, where it has them;
otherwise one row per method, without a target, listing the combined files (rebuilt: no fingerprint or provenance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..cam.results import Explanation, Prediction
from ..io.discovery import InputImage
from .records import Record
from .resume import ExistingOutputs, FoundExplanation

_COMBINED = Prediction(-1, "all detections", 0.0)
COMBINED_TAIL = "boxes"
"""How a :class:`FoundExplanation` of a combined map is marked."""


class CombinedOutputs(ExistingOutputs):
    """:class:`ExistingOutputs` for a detector: each method's combined map, all its listed files."""

    def find(self, image: InputImage) -> list[FoundExplanation] | None:
        found = []
        for method in self.methods:
            combined = Explanation(method, _COMBINED, torch.empty(0), rank=0)
            outputs = []
            for kind in self.kinds:
                if not kind.listed:
                    continue
                path = kind.path(self.options, image, combined if kind.per_explanation else None)
                if path.name not in self.index.names(path.parent):
                    return None
                outputs.append(str(path))
            found.append(FoundExplanation(method, COMBINED_TAIL, outputs))
        return found


def resumed_detection_rows(
    found: Sequence[FoundExplanation], earlier: Sequence[dict[str, Any]], skipped: Callable[..., Record]
) -> list[Record]:
    """The rows of a detector's image whose outputs exist, status ``skipped``: the earlier run's rows of it (their
    targets, predictions, outputs, times, fingerprints and provenance), or, without any, one row per method listing
    its combined files."""
    methods = {entry.method for entry in found}
    usable = [
        Record.from_dict(row) for row in earlier if row["status"] in ("ok", "skipped") and row.get("method") in methods
    ]
    if usable:
        return [
            skipped(
                method=row.method,
                target=row.target,
                predictions=row.predictions,
                outputs=row.outputs,
                seconds=row.seconds,
                fingerprint=row.fingerprint,
                provenance=row.provenance,
            )
            for row in usable
        ]
    return [skipped(method=entry.method, outputs=list(entry.outputs)) for entry in found]
