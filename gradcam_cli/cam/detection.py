"""Explaining detectors: which detections are explained, what is differentiated, and where the maps lie.

**What is differentiated.** A torchvision detector in eval mode chooses its detections with operations that have no
gradient (thresholds, non-maximum suppression, top-k), but the score of each detection it returns is still a
differentiable function of the features it was computed from (a softmax or sigmoid of the head's logits, picked
out by indexing). The explainer runs the detector once with the layer hooked and gradients on, reads the
detections of that very pass, and differentiates the chosen detection's ``scores`` entry: the gradient of that
detection's class score with respect to the layer. Detections are explained by score, highest first, those
scoring at least ``--score-threshold`` and at most ``--max-detections`` of them (only those of ``--target-class``
when it is given). One more target per image, the *combined* one, is the sum of all of them.

**The matching rule.** Where another forward pass must find "the same detection" (Score-CAM's masked inputs, and
``gradcam eval``'s ground-truth boxes), it is the detection of that pass with the same class whose box overlaps
the reference box most, by intersection over union, provided that IoU is at least :data:`MATCH_IOU`; without one,
the score is 0.

**Geometry.** A detector with torchvision's transform (``GeneralizedRCNNTransform``) resizes the input and pads
the batch at its bottom and right to a multiple of 32 (SSD: resizes to a fixed square, no padding). The layer's
feature maps cover the padded batch, so only their top-left part shows the image: that part alone is stretched
over the original image (:func:`gradcam_cli.cam.maps.upsample_region`). Its boxes come back in the coordinates of
the input the detector was given, and are scaled to the original image's pixels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from ..errors import UsageError
from ..models.tasks import describe_output
from .drise import DetectionVectors, class_vectors
from .maps import Region
from .results import ImageExplanation, Prediction
from .scores import Cams, ClassName, MaskedProbability, explanations_of, sum_or_none

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

MATCH_IOU = 0.5
"""Least intersection over union for a detection of another pass to count as the same detection."""
COMBINED = "all detections"
"""The name of a detector's combined target (the sum of every explained detection's score)."""

Detections = Mapping[str, torch.Tensor]


def detections_of(output: object) -> list[Detections]:
    """A detector's output, checked: one dict with ``boxes``, ``labels`` and ``scores`` per image."""
    if isinstance(output, list | tuple) and all(
        isinstance(item, Mapping)
        and all(isinstance(item.get(key), torch.Tensor) for key in ("boxes", "labels", "scores"))
        for item in output
    ):
        return list(output)
    raise UsageError(
        f"the model returned {describe_output(output)}; a detector returns a list of dicts with boxes, labels and "
        "scores (see --task)"
    )


def box_iou(box: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """Intersection over union of one (4,) box with each of (M, 4) boxes, all ``(x1, y1, x2, y2)``: (M,)."""
    top_left = torch.maximum(box[:2], boxes[:, :2])
    bottom_right = torch.minimum(box[2:], boxes[:, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=1)
    area = (box[2:] - box[:2]).clamp(min=0).prod()
    areas = (boxes[:, 2:] - boxes[:, :2]).clamp(min=0).prod(dim=1)
    union = area + areas - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(union))


def match(box: torch.Tensor, label: int, detections: Detections) -> int | None:
    """The index of the detection in ``detections`` that is the same as (``box``, ``label``) by the matching rule
    (same class, highest IoU, at least :data:`MATCH_IOU`); ``None``: no such detection."""
    boxes, labels = detections["boxes"].detach(), detections["labels"]
    same = (labels == label).nonzero().flatten()
    if same.numel() == 0:
        return None
    ious = box_iou(box.to(boxes.device, boxes.dtype), boxes[same])
    best = int(ious.argmax())
    return int(same[best]) if float(ious[best]) >= MATCH_IOU else None


def matched_score(box: torch.Tensor, label: int, detections: Detections) -> torch.Tensor:
    """The score of the detection matching (``box``, ``label``) in ``detections``, 0 when none does."""
    index = match(box, label, detections)
    scores = detections["scores"]
    return scores[index].float() if index is not None else torch.zeros((), device=scores.device)


@dataclass(frozen=True)
class Geometry:
    """Where a batch's input went inside the detector: the fraction of the feature maps that shows the image
    (``region``, height and width), and the input's size the boxes are given in."""

    region: Region = (1.0, 1.0)
    input_size: tuple[int, int] = (1, 1)


def detector_geometry(transform: nn.Module | None, inputs: torch.Tensor) -> Geometry:
    """The :class:`Geometry` of a batch of equally sized ``inputs``: the detector's transform is run on one blank
    input of their size (resizing and padding depend on the size alone) to see where the image lands."""
    height, width = int(inputs.shape[-2]), int(inputs.shape[-1])
    if transform is None:
        return Geometry((1.0, 1.0), (height, width))
    with torch.no_grad():
        images, _ = transform([torch.zeros(3, height, width, device=inputs.device)])
    (resized_h, resized_w), (padded_h, padded_w) = images.image_sizes[0], images.tensors.shape[-2:]
    return Geometry((resized_h / padded_h, resized_w / padded_w), (height, width))


@dataclass(frozen=True)
class DetectionScore:
    """A detector's scores: each detection scoring at least ``threshold`` (at most ``max_detections`` per image,
    highest first), then their sum. ``transform``: the detector's torchvision transform, if it has one; ``class_count``:
    its class count (0: unknown), the width of D-RISE's class vectors (:mod:`gradcam_cli.cam.drise`)."""

    transform: nn.Module | None = None
    threshold: float = 0.5
    max_detections: int = 10
    class_count: int = 0

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> DetectionTargets:
        detections = detections_of(output)
        picked = picked_detections(detections, self.threshold, target, self.max_detections)
        return DetectionTargets(detections, picked, detector_geometry(self.transform, inputs), self.class_count)


def picked_detections(
    detections: list[Detections], threshold: float, target: int | None, max_detections: int
) -> list[list[int]]:
    """Per image, the indices of the detections explained: scoring at least ``threshold`` (of class ``target``
    where given), best first, at most ``max_detections``."""
    picked = []
    for found in detections:
        scores, labels = found["scores"].detach(), found["labels"]
        keep = scores >= threshold
        if target is not None:
            keep &= labels == target
        order = scores.masked_fill(~keep, -1.0).argsort(descending=True, stable=True)
        picked.append([int(i) for i in order[: int(keep.sum())][:max_detections]])
    return picked


@dataclass
class DetectionTargets:
    """The chosen detections of one pass: ``picked[n]`` indexes image n's detections, highest score first. Target
    ``k`` is each image's ``k``-th detection; the last target (``count - 1``) is the combined one. ``class_count``: the
    detector's class count (0: unknown), for D-RISE's class vectors."""

    detections: list[Detections]
    picked: list[list[int]]
    geometry: Geometry = field(default_factory=Geometry)
    class_count: int = 0

    @property
    def count(self) -> int:
        return max((len(p) for p in self.picked), default=0) + 1

    @property
    def region(self) -> Region:
        return self.geometry.region

    def _chosen(self, n: int, k: int) -> list[int]:
        """Image n's detections scored by target ``k``: its ``k``-th, or all of them for the combined target."""
        picked = self.picked[n]
        return picked if k == self.count - 1 else picked[k : k + 1]

    def value(self, k: int) -> torch.Tensor | None:
        return sum_or_none(
            [self.detections[n]["scores"][i] for n in range(len(self.picked)) for i in self._chosen(n, k)]
        )

    def masked(self, k: int) -> MaskedProbability:
        def probability(output: object, samples: torch.Tensor) -> torch.Tensor:
            found = detections_of(output)
            values = []
            for j, sample in enumerate(samples.tolist()):
                reference = self.detections[sample]
                terms = [
                    matched_score(reference["boxes"][i].detach(), int(reference["labels"][i]), found[j])
                    for i in self._chosen(sample, k)
                ]
                values.append(torch.stack(terms).sum() if terms else torch.zeros((), device=samples.device))
            return torch.stack(values).to(samples.device) if values else torch.zeros(0)

        return probability

    def refound(self, n: int, output: object) -> torch.Tensor:
        """(B, K): image n's K explained detections re-found in each of the B images of ``output`` by the matching
        rule, their scores (0 where one vanished)."""
        reference, picked = self.detections[n], self.picked[n]
        found = detections_of(output)
        rows = [
            [matched_score(reference["boxes"][i].detach(), int(reference["labels"][i]), other) for i in picked]
            for other in found
        ]
        return torch.tensor([[float(score) for score in row] for row in rows]).view(len(found), len(picked))

    def explained_vectors(self, n: int) -> DetectionVectors:
        """Image n's explained detections as D-RISE compares them (:mod:`gradcam_cli.cam.drise`)."""
        found, picked = self.detections[n], self.picked[n]
        return self.vectors(found, torch.tensor(picked, dtype=torch.long, device=found["labels"].device))

    def proposals(self, output: object) -> list[DetectionVectors]:
        """Every detection of each image in another pass's ``output``, as D-RISE compares them."""
        return [
            self.vectors(found, torch.arange(found["labels"].shape[0], device=found["labels"].device))
            for found in detections_of(output)
        ]

    def vectors(self, found: Detections, rows: torch.Tensor) -> DetectionVectors:
        """Detections ``rows`` of ``found``: their boxes, class vectors rebuilt from their labels and scores (a
        torchvision detector returns no others), and their ``objectness`` where the output has it."""
        objectness = found.get("objectness")
        return DetectionVectors(
            found["boxes"][rows].detach().float(),
            class_vectors(found["labels"][rows], found["scores"][rows].detach(), self.class_count),
            objectness[rows].detach() if objectness is not None else None,
        )

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        results = []
        for n, size in enumerate(sizes):
            height, width = size  # an image's: detectors take images
            shown = self.predictions(n, (height, width), class_name)
            explanations = []
            for k in range(self.count):
                combined = k == self.count - 1
                if not combined and k >= len(shown):
                    continue
                target = shown[k] if not combined else _combined_target(shown)
                rank = 0 if combined else k + 1
                explanations += explanations_of(cams, n, k, target, size, self.geometry.region, rank=rank)
            results.append(ImageExplanation(shown, explanations))
        return results

    def predictions(self, n: int, size: tuple[int, int], class_name: ClassName) -> list[Prediction]:
        """Image n's explained detections, boxes scaled to an original image of ``size`` = (H, W)."""
        found = self.detections[n]
        (in_h, in_w), (height, width) = self.geometry.input_size, size
        scale = torch.tensor([width / in_w, height / in_h, width / in_w, height / in_h])
        shown = []
        for i in self.picked[n]:
            box = (found["boxes"][i].detach().float().cpu() * scale).tolist()
            label = int(found["labels"][i])
            x1, y1, x2, y2 = (round(value, 1) for value in box)
            shown.append(Prediction(label, class_name(label), float(found["scores"][i].detach()), box=(x1, y1, x2, y2)))
        return shown


class Thresholded(Protocol):
    """A detector's score (:class:`DetectionScore`, a YOLO model's): the least score of an explained detection."""

    @property
    def threshold(self) -> float: ...


def own_cutoff(module: nn.Module) -> float | None:
    """The least score a detector returns a detection with, its own cut-off (``None``: it has none): torchvision's
    ``box_score_thresh`` (Faster, Mask and Keypoint R-CNN: 0.05) or ``score_thresh`` (RetinaNet 0.05, FCOS 0.2,
    SSD 0.01, SSDlite 0.001)."""
    for owner in (getattr(module, "roi_heads", None), module):
        value = getattr(owner, "score_thresh", None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def no_detection(model: LoadedModel, score: Thresholded, target: int | None = None) -> str:
    """What an image without an explained detection says, naming what removed them: ``--score-threshold``, the
    detector's own cut-off where that is higher (:func:`own_cutoff`), and ``--target-class`` when it is given;
    ``score``: a torchvision detector's :class:`DetectionScore` or a YOLO model's score."""
    which = "detection"
    if target is not None:
        name = model.class_name(target)
        which = f"detection of {name if name != str(target) else f'class {target}'} (--target-class)"
    cutoff = own_cutoff(model.module)
    if cutoff is not None and cutoff > score.threshold:
        lower = f"--score-threshold {score.threshold:g} is lower"
        return f"no {which} above {model.name}'s own cut-off {cutoff:g} ({lower})"
    return f"no {which} above --score-threshold {score.threshold:g}"


def _combined_target(shown: Sequence[Prediction]) -> Prediction:
    """The combined target: index -1, and the highest detection score (0 when there is none)."""
    return Prediction(-1, COMBINED, max((p.probability for p in shown), default=0.0))
