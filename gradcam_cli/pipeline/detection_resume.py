"""Resuming a detector's run (``--skip-existing``): its images are found done by their combined overlays.

A detector's image has as many files as it has detections, which a resumed run cannot know before running the
model; but each method's combined map (``<stem>_<method>_boxes``, written also when nothing was detected) is
written after all of that image's per-detection files. An image is skipped when, for every method, the combined
map's listed files exist. Its rows are the earlier run's rows of that image from the manifest, where it has them;
otherwise one row per method, without a target, listing the combined files (rebuilt: no fingerprint or provenance).
When the manifest being resumed lacks some (:attr:`~gradcam_cli.pipeline.resume.EarlierRows.required`: no row of a
method, or fewer detection rows than detection overlays on disk), the image is explained again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..cam.records import Record
from ..cam.results import Explanation, Prediction
from ..io.discovery import InputImage
from ..io.naming import COMBINED_TAIL
from .resume import ExistingOutputs, FoundExplanation

_COMBINED = Prediction(-1, "all detections", 0.0)
_PROBE_TARGET = Prediction(0, "x", 0.0)
_PROBE_MARK = "_box1_0-x"


@dataclass
class FoundDetections(FoundExplanation):
    """A method's combined map found, and how many per-detection overlays (``<stem>_<method>_box<rank>_...``) lie
    beside it."""

    detections: int = 0


class CombinedOutputs(ExistingOutputs):
    """:class:`ExistingOutputs` for a detector: each method's combined map, all its listed files."""

    def find(self, image: InputImage) -> list[FoundExplanation] | None:
        found: list[FoundExplanation] = []
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
            found.append(FoundDetections(method, COMBINED_TAIL, outputs, self._detections(image, method)))
        return found

    def _detections(self, image: InputImage, method: str) -> int:
        """How many per-detection files of the first listed per-explanation kind (the overlay) ``method`` has: ranks
        1, 2, ... while one is found (a lookup each, in the folder's listing indexed once)."""
        kind = next(kind for kind in self.kinds if kind.listed and kind.per_explanation)
        probe = kind.path(self.options, image, Explanation(method, _PROBE_TARGET, torch.empty(0), rank=1))
        cut = probe.name.rfind(_PROBE_MARK)
        head, ending = probe.name[:cut] + "_box", probe.name[cut + len(_PROBE_MARK) :]
        count = 0
        while self.index.matches(probe.parent, f"{head}{count + 1}", ending):
            count += 1
        return count


def resumed_detection_rows(
    found: Sequence[FoundExplanation],
    earlier: Sequence[dict[str, Any]],
    skipped: Callable[..., Record],
    required: bool = False,
) -> list[Record] | None:
    """The rows of a detector's image whose outputs exist, status ``skipped``: the earlier run's rows of it (their
    targets, predictions, outputs, times, fingerprints and provenance), or, without any, one row per method listing
    its combined files. ``None`` when ``required`` and the earlier rows lack a method's, or some of its detections'
    (the image is explained again)."""
    methods = {entry.method for entry in found}
    usable = [
        Record.from_dict(row) for row in earlier if row["status"] in ("ok", "skipped") and row.get("method") in methods
    ]
    if required and not all(_complete(entry, usable) for entry in found):
        return None
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


def _complete(entry: FoundExplanation, usable: Sequence[Record]) -> bool:
    """Whether ``usable`` has ``entry``'s method's rows: one at least, and one per detection overlay found."""
    own = [row for row in usable if row.method == entry.method]
    if isinstance(entry, FoundDetections) and sum(row.target is not None for row in own) != entry.detections:
        return False
    return bool(own)
