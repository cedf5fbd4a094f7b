"""Explaining Ultralytics YOLO detectors (``--model yolo:...``): which score each detection is, and where its map lies.

**The tracing rule.** :class:`~gradcam_cli.models.yolo_net.YoloNet` runs the model's own non-maximum suppression
and returns, with each kept detection, the anchor (a cell of P3, P4 or P5; the query of an end-to-end head) its row
came from. A detection of class c from anchor a is scored by that anchor's raw class logit ``z[c, a]`` (before the
sigmoid that makes it the confidence shown), the default; ``--score box``: by the anchor's box extent instead, the
sum of its four predicted distances to the box's sides (in input pixels), which asks what made the box as big as it
is. The combined target is the sum over the explained detections, as for every detector.

**Gradient-free methods.** A YOLO anchor is a fixed cell, so the masked (Score-CAM) and ablated (AblationCAM)
passes read the very same anchor's score in their own output, no box matching needed: Score-CAM its confidence
(the sigmoid of the logit; ``--score box``: the extent), AblationCAM the score itself.

**Geometry.** The letterbox pads the resized image on both sides (:func:`letterbox_region`); the maps' part that
shows the image is stretched over the original image, boxes, masks and keypoints are scaled from the resized input
to the original image's pixels. Each instance's mask is outlined on its overlay and its area (pixels of the original
image) is in its row; each pose's keypoints are drawn and listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .ablation import ScoreReader
from .detection import Detections, DetectionTargets, Geometry, detections_of, picked_detections
from .drise import DetectionVectors
from .maps import Region
from .results import ImageExplanation, Prediction
from .scores import Cams, ClassName, MaskedProbability, sum_or_none

YOLO_SCORES = ("logit", "box")
"""What a YOLO detection is scored by: its anchor's class logit (the default; ``--score logit``) or box extent."""


def yolo_score(
    module: nn.Module, name: str, threshold: float | None, max_detections: int | None, top_k: int | None
) -> YoloScore:
    """The :class:`YoloScore` of ``--score name`` (``logit`` or ``box``), ``--score-threshold`` (not given,
    ``None``: the model's own confidence threshold, 0.25) and ``--max-detections``; the NMS of ``module`` keeps
    detections from that confidence on in the passes run under :func:`pass_settings` (nothing is set on the model).
    ``--top-k`` given at all is refused."""
    from ..errors import UsageError
    from ..options import MAX_DETECTIONS

    if name not in YOLO_SCORES:
        raise UsageError(f"--score {name} is for classifiers; a YOLO detection takes --score logit or --score box")
    if top_k is not None:
        raise UsageError(f"--top-k {top_k} is for classifiers and segmenters; a detector explains each detection")
    if max_detections is not None and max_detections < 1:
        raise UsageError("--max-detections must be at least 1")
    net: Any = module  # a YoloNet (the YOLO family names its adapter: ModelProfile.task)
    if not hasattr(net, "default_conf"):  # the yolo adapter named for another model (it is chosen, never named)
        raise UsageError(f"the yolo task explains models loaded as yolo:..., not a {type(module).__name__}")
    if threshold is None:
        threshold = float(net.default_conf)
    return YoloScore(int(net.stride), threshold, MAX_DETECTIONS if max_detections is None else max_detections, name)


def letterbox_region(height: int, width: int, stride: int) -> Region:
    """The part of the feature maps of a letterboxed (height, width) input that shows it: ``(top, left, height,
    width)`` as fractions of the padded input (:func:`gradcam_cli.models.yolo_net.letterbox_padding`)."""
    from ..models.yolo_net import letterbox_padding

    top, bottom, left, right = letterbox_padding(height, width, stride)
    padded_h, padded_w = height + top + bottom, width + left + right
    return (top / padded_h, left / padded_w, height / padded_h, width / padded_w)


@dataclass(frozen=True)
class YoloScore:
    """A YOLO detector's scores: each detection its NMS kept with a confidence of at least ``threshold`` (at most
    ``max_detections`` per image, most confident first), then their sum; ``kind``: ``logit`` or ``box``."""

    stride: int
    threshold: float
    max_detections: int = 10
    kind: str = "logit"

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> YoloTargets:
        detections = detections_of(output)
        picked = picked_detections(detections, self.threshold, target, self.max_detections)
        height, width = int(inputs.shape[-2]), int(inputs.shape[-1])
        geometry = Geometry(letterbox_region(height, width, self.stride), (height, width))
        return YoloTargets(detections, picked, geometry, self.kind)


def anchor_score(found: Detections, anchor: int, label: int, kind: str, probability: bool = False) -> torch.Tensor:
    """The score at ``anchor`` of ``found`` (one image's YoloNet output): its logit for class ``label`` (its sigmoid
    with ``probability``), or with ``kind`` ``box`` its box extent."""
    if kind == "box":
        return found["extents"][anchor]
    logit = found["class_logits"][label, anchor]
    return logit.sigmoid() if probability else logit


def detection_score(found: Detections, i: int, kind: str) -> torch.Tensor:
    """Detection ``i``'s score in ``found``: :func:`anchor_score` at the anchor it was traced to, for its class."""
    return anchor_score(found, int(found["anchors"][i]), int(found["labels"][i]), kind)


class YoloTargets(DetectionTargets):
    """:class:`~gradcam_cli.cam.detection.DetectionTargets` scored by the tracing rule (module docstring)."""

    def __init__(self, detections: list[Detections], picked: list[list[int]], geometry: Geometry, kind: str) -> None:
        super().__init__(detections, picked, geometry)
        self.kind = kind

    def value(self, k: int) -> torch.Tensor | None:
        return sum_or_none(
            [
                detection_score(self.detections[n], i, self.kind)
                for n in range(len(self.picked))
                for i in self._chosen(n, k)
            ]
        )

    def _read(self, k: int, probability: bool) -> ScoreReader:
        """Each row's score of target ``k`` of the sample it came from, read at the same anchors of ``output``."""

        def read(output: object, samples: torch.Tensor) -> torch.Tensor:
            found = detections_of(output)
            values = []
            for j, sample in enumerate(samples.tolist()):
                reference = self.detections[sample]
                terms = []
                for i in self._chosen(sample, k):
                    anchor, label = int(reference["anchors"][i]), int(reference["labels"][i])
                    terms.append(anchor_score(found[j], anchor, label, self.kind, probability))
                values.append(torch.stack(terms).sum() if terms else torch.zeros((), device=samples.device))
            return torch.stack(values).float().to(samples.device) if values else torch.zeros(0)

        return read

    def masked(self, k: int) -> MaskedProbability:
        return self._read(k, probability=True)

    def vectors(self, found: Detections, rows: torch.Tensor) -> DetectionVectors:
        """Detections ``rows`` of ``found`` as D-RISE compares them: each one's class vector the sigmoid of the raw
        class logits at the anchor it was traced to (every class's confidence there)."""
        objectness = found.get("objectness")
        anchors = found["anchors"].reshape(-1)[rows]
        return DetectionVectors(
            found["boxes"][rows].detach().float(),
            found["class_logits"][:, anchors].detach().float().sigmoid().T,
            objectness[rows].detach() if objectness is not None else None,
        )

    def ablated(self, k: int) -> tuple[ScoreReader, torch.Tensor]:
        """AblationCAM's reader of target ``k``'s score, and each sample's score with nothing ablated."""
        read = self._read(k, probability=False)
        original = torch.stack(
            [
                sum_or_none([detection_score(found, i, self.kind) for i in self._chosen(n, k)])
                or torch.zeros((), device=found["scores"].device)
                for n, found in enumerate(self.detections)
            ]
        )
        return read, original.detach().float()

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        results = super().results(cams, sizes, class_name)
        for n, (result, (height, width)) in enumerate(zip(results, sizes, strict=True)):
            masks = self._masks(n, (height, width))
            if masks is None:
                continue
            for explanation in result.explanations:
                rank = explanation.rank or 0
                explanation.region = masks[rank - 1] if rank > 0 else masks.any(dim=0)
        return results

    def predictions(self, n: int, size: tuple[int, int], class_name: ClassName) -> list[Prediction]:
        shown = super().predictions(n, size, class_name)
        found = self.detections[n]
        masks = self._masks(n, size)
        (in_h, in_w), (height, width) = self.geometry.input_size, size
        for j, (prediction, i) in enumerate(zip(shown, self.picked[n], strict=True)):
            details = prediction.details = dict(prediction.details or {})
            if masks is not None:
                details["area"] = int(masks[j].sum())
            if "keypoints" in found:
                points = found["keypoints"][i].detach().float().cpu()
                details["keypoints"] = [
                    [round(float(x) * width / in_w, 1), round(float(y) * height / in_h, 1), round(float(v), 3)]
                    for x, y, v in points.tolist()
                ]
            prediction.details = details or None
        return shown

    def _masks(self, n: int, size: tuple[int, int]) -> torch.Tensor | None:
        """Image n's explained instances' masks (K, H, W) at the original image's ``size``; ``None``: no masks."""
        found = self.detections[n]
        if "masks" not in found:
            return None
        masks = found["masks"][self.picked[n]].float()
        if masks.shape[0] == 0:
            return torch.zeros((1, *size), dtype=torch.bool, device=masks.device)
        return F.interpolate(masks[:, None], size=size, mode="nearest")[:, 0].bool()
