"""Explaining DETR-family detectors (``--model hf:DIR``: :mod:`gradcam_cli.models.detr_net`; an ultralytics RT-DETR,
``--model yolo:PATH``: :mod:`gradcam_cli.models.rtdetr_net`): each detection is a decoder query.

**What is differentiated.** A detection from query q of class c is scored by that query's raw class logit
``logits[q, c]`` (before the softmax or sigmoid that makes the score shown); the combined target is the sum over the
explained detections, as for every detector. Grad-CAM and the other layer methods read the backbone's last stage by
default (the feature map the transformer's encoder reads; ``--layer`` takes any other, such as an earlier stage).

**Gradient-free methods.** An RT-DETR query is chosen from the encoder's tokens anew in every pass, so another pass
(Score-CAM's masked inputs, ``gradcam eval``'s perturbed images) finds "the same detection" by the matching rule of
:mod:`gradcam_cli.cam.detection` (same class, best IoU of at least 0.5), for every member of the family alike; D-RISE
compares each query's whole vector of class probabilities (softmax without "no object", or the sigmoids).

**``--method attention``** (the DETR paper's Fig. 6): the query's cross-attention over the encoder's tokens in the
last decoder layer, its heads averaged (:class:`~gradcam_cli.models.detr_net.DetrNet`), on the grid of the
backbone's last stage; the combined map is the sum of the explained queries'. Only DETR and Conditional DETR have
dense weights; the deformable attention of Deformable DETR and RT-DETR samples a few points per query and is refused
in one line.

**Geometry.** The input is the image resized as the image processor resizes it (DETR: shorter side, aspect kept;
RT-DETR, ultralytics' too: a square, stretched), never padded: the feature maps cover the whole input, the boxes
come in its pixels and are scaled to the original image's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .detection import Detections, DetectionTargets, Geometry, detections_of, picked_detections
from .drise import DetectionVectors
from .methods.needs import QUERY_ATTENTION
from .methods.registry import CamMethod
from .scores import sum_or_none


@dataclass(frozen=True)
class DetrScore:
    """A DETR-family detector's scores: each detection scoring at least ``threshold`` (at most ``max_detections``
    per image, highest first), then their sum; ``attention``: the explained pass records the queries'
    cross-attention (``--method attention`` asked)."""

    threshold: float = 0.5
    max_detections: int = 10
    attention: bool = False

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> DetrTargets:
        detections = detections_of(output)
        picked = picked_detections(detections, self.threshold, target, self.max_detections)
        height, width = int(inputs.shape[-2]), int(inputs.shape[-1])
        return DetrTargets(detections, picked, Geometry((1.0, 1.0), (height, width)))


@runtime_checkable
class Attended(Protocol):
    """Targets whose explained pass recorded each detection's attention over the image (a DETR's queries')."""

    def attention(self, k: int) -> torch.Tensor:
        """(N, h, w): target ``k``'s attention in each image (0 where an image has no k-th target)."""
        ...


def query_logit(found: Detections, i: int) -> torch.Tensor:
    """Detection ``i``'s score in ``found``: its query's raw logit of its class."""
    return found["logits"][int(found["queries"][i]), int(found["labels"][i])]


class DetrTargets(DetectionTargets):
    """:class:`~gradcam_cli.cam.detection.DetectionTargets` scored by the query's logit (module docstring)."""

    def value(self, k: int) -> torch.Tensor | None:
        return sum_or_none(
            [query_logit(self.detections[n], i) for n in range(len(self.picked)) for i in self._chosen(n, k)]
        )

    def vectors(self, found: Detections, rows: torch.Tensor) -> DetectionVectors:
        """Detections ``rows`` as D-RISE compares them: each one's class vector its query's class probabilities."""
        queries = found["queries"].reshape(-1)[rows]
        return DetectionVectors(found["boxes"][rows].detach().float(), found["class_scores"][queries].detach().float())

    def attention(self, k: int) -> torch.Tensor:
        maps = []
        for n, found in enumerate(self.detections):
            recorded = found.get("attention")
            if recorded is None:
                raise ValueError("the explained pass recorded no attention")
            chosen = [recorded[int(found["queries"][i])] for i in self._chosen(n, k)]
            maps.append(torch.stack(chosen).sum(dim=0) if chosen else torch.zeros_like(recorded[0]))
        return torch.stack(maps).float()


def query_attention(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    attention: torch.Tensor,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """The DETR paper's map: the explained query's last-layer cross-attention, heads averaged (module docstring)."""
    return attention


DETR_ATTENTION = CamMethod(
    "attention",
    query_attention,
    uses_gradients=False,
    needs=QUERY_ATTENTION,
    tasks=("detect",),
    uses_layer=False,
    formula="mean_heads A_L[q, :], the query's last decoder layer's cross-attention over the encoder's tokens",
    paper="Carion et al., ECCV 2020 (DETR, Fig. 6)",
    cost="none (the explained pass), DETR and Conditional DETR only",
)
"""``--method attention`` for a DETR-family detector (:meth:`gradcam_cli.cam.tasks.detr.DetrTask.method`); the
registry's ``attention`` (a ViT's class-token attention) for every other model."""
