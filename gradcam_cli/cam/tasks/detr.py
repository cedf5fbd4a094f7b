"""DETR-family detectors (``--model hf:DIR`` of a DETR, Conditional DETR, Deformable DETR or RT-DETR folder, and
ultralytics RT-DETR, ``--model yolo:PATH``): each detection a decoder query scored by its class logit
(:mod:`gradcam_cli.cam.detr`), shown as a detector's are; their own ``--method attention``, the queries'
cross-attention."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from torch import nn

from ...models.detr_net import DETR_TASK, QueryDetector, attending
from ...options import MAX_DETECTIONS, SCORE_THRESHOLD
from ..detr import DETR_ATTENTION, DetrScore
from ..methods import METHODS
from ..scores import Score
from .base import ScoreRequest, register_task
from .detect import DetectTask

if TYPE_CHECKING:
    from ...models.loading import LoadedModel
    from ..methods.registry import CamMethod


class DetrTask(DetectTask):
    """A DETR-family detector's queries: a detector's options, layout and rows; ``attention`` is its own."""

    name = DETR_TASK
    shown = "detect"
    by_name = False
    declared_layer = "last stage of the backbone, the feature map the transformer reads"

    def claims(self, model: LoadedModel) -> bool:
        return model.task == self.name and isinstance(model.module, QueryDetector)

    def score(self, model: LoadedModel, request: ScoreRequest) -> Score:
        self.check_options(request.options)
        options = request.options
        attention = DETR_ATTENTION.name in request.methods  # taken only where dense (takes)
        own = float(getattr(model.module, "default_threshold", SCORE_THRESHOLD))  # its post-processing's default
        threshold = own if options.score_threshold is None else options.score_threshold
        most = MAX_DETECTIONS if options.max_detections is None else options.max_detections
        return DetrScore(threshold, most, attention)

    def takes(self, method: str, tasks: Sequence[str], module: nn.Module) -> bool:
        """A detector's methods, and ``attention`` where the model's cross-attention is dense (DETR, Conditional
        DETR; the others' ``--method attention`` is refused in one line, and ``all`` leaves it out)."""
        if method == DETR_ATTENTION.name:
            return bool(getattr(module, "dense", False))
        return super().takes(method, tasks, module)

    def method(self, name: str) -> CamMethod[Any]:
        return DETR_ATTENTION if name == DETR_ATTENTION.name else METHODS[name]

    def pass_settings(self, score: Score) -> AbstractContextManager[None]:
        """The explained pass records the queries' cross-attention where ``--method attention`` asks for it
        (:func:`~gradcam_cli.models.detr_net.attending`)."""
        chosen: Any = score  # a DetrScore
        return attending(bool(chosen.attention))


register_task(DetrTask())
