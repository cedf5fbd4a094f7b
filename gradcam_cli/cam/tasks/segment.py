"""Segmenters: a class's score is the sum of its logits over the pixels predicted as it
(:mod:`gradcam_cli.cam.segmentation`); each explained class shows its share of the pixels and its region."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...models.tasks import LAYER_SCOPES
from ...options import ExplainOptions
from ..scores import Score
from ..segmentation import SegmentationScore
from .base import Explained, Pair, ScoreRequest, TaskAdapter, check_class_score, label_box_pairs, register_task

if TYPE_CHECKING:
    from ...io.boxes import GroundTruthBox
    from ...models.loading import LoadedModel
    from ..results import ImageExplanation, Prediction


class SegmentTask(TaskAdapter):
    """A segmenter's predicted classes other than the background, largest first."""

    name = "segment"
    noun = "segmenter"
    videos = False
    listed = "Classes"
    methods_of = "segment"
    scans = True
    default_layer = "last stage of the backbone"
    layer_scopes = LAYER_SCOPES
    tokens = False
    nothing = "only the background"

    def check_options(self, options: ExplainOptions) -> None:
        check_class_score(options)
        TaskAdapter.check_options(self, options)

    def score(self, model: LoadedModel, request: ScoreRequest) -> Score:
        self.check_options(request.options)
        return SegmentationScore()

    def nothing_found(self, model: LoadedModel, score: Score, target: int | None) -> str | None:
        return "no class other than the background"

    def located(self, prediction: Prediction) -> str | None:
        return f"on {prediction.share:.1%} of the {_units(prediction)}" if prediction.share is not None else None

    def how_much(self, prediction: Prediction) -> str:
        """The class's share of the pixels (``12.3% of the pixels``; a scan's: ``of the voxels``): what a
        segmenter's target is measured by."""
        if prediction.share is None:
            return super().how_much(prediction)
        return f"{prediction.share:.1%} of the {_units(prediction)}"

    def box_pairs(
        self, explainer: Explained, image: Any, result: ImageExplanation, boxes: Sequence[GroundTruthBox]
    ) -> tuple[list[Pair], int]:
        """The boxes of one label against the map of the class of that name (:func:`label_box_pairs`); a class
        predicted nowhere (its map is empty) is undetected."""
        return label_box_pairs(explainer, image, result, boxes, lambda target: bool(target.share))


register_task(SegmentTask())


def _units(prediction: Prediction) -> str:
    """What a segmenter's class's share is a share of: a scan's ``voxels`` (its prediction's details count them),
    else ``pixels``."""
    return "voxels" if "voxels" in (prediction.details or {}) else "pixels"
