"""The DETR family of transformers detectors (``--model hf:DIR`` of a DETR, Conditional DETR, Deformable DETR or
RT-DETR folder) wrapped as a detector the tool explains: :class:`DetrNet` takes the normalised (N, 3, H, W) input and
returns one dict per image, as torchvision's detectors do, of every detection the model's image processor would
return before its ``threshold`` (``post_process_object_detection``), with what explains it.

**Detections** (each one a decoder query, ``queries``):

- DETR (softmax classes with a "no object" class): every query is a detection, its label the most probable class
  other than "no object" and its score that probability (``DetrImageProcessor``).
- Conditional DETR, Deformable DETR, RT-DETR (sigmoid classes, focal loss): the best ``top`` (query, class) pairs of
  the sigmoid scores, a query possibly twice with different classes (RT-DETR: as many pairs as queries; the others:
  100, as their processors take).

Boxes (the predicted centre, width and height, as fractions of the input) become ``(x1, y1, x2, y2)`` in the input's
pixels. Besides ``boxes``, ``labels`` and ``scores``: ``queries`` (each detection's query), ``logits`` (Q, classes:
the raw class logits, what Grad-CAM differentiates), ``class_scores`` (Q, C: every class's probability, what D-RISE
compares) and, within :func:`attending`, ``attention`` (Q, h, w): each query's cross-attention over the
encoder's tokens in the last decoder layer, its heads averaged, on the grid of the feature map the encoder reads
(DETR and Conditional DETR: the backbone's last stage; the deformable ones sample a few points per query and have no
dense weights: :attr:`DetrNet.dense`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from ..options import SCORE_THRESHOLD

DETR_TASK = "detr"
"""The task adapter that explains a DETR-family detector (:mod:`gradcam_cli.cam.tasks.detr`), as its profile names
it."""
SOFTMAX_TYPES = ("detr",)
"""Model types whose classes are a softmax with a "no object" class (every query one detection)."""
SIGMOID_TYPES = {"conditional_detr": 100, "deformable_detr": 100, "rt_detr": 0, "rt_detr_v2": 0}
"""Model types whose classes are sigmoids, and how many (query, class) pairs their processor keeps (0: one per
query)."""
DENSE_TYPES = ("detr", "conditional_detr")
"""Model types whose decoder cross-attention has dense weights over the encoder's tokens (``--method attention``)."""
DETR_TYPES = (*SOFTMAX_TYPES, *SIGMOID_TYPES)
"""Every DETR-family ``model_type`` the family loads."""


_ATTENDING: ContextVar[bool] = ContextVar("detr_attending", default=False)


@contextmanager
def attending(wanted: bool = True) -> Iterator[None]:
    """Within, every :class:`DetrNet` forward pass of this thread (or task) returns each query's ``attention`` where
    ``wanted``, computed on the plain (eager) attention path: the explained pass's own setting (nothing is set on the
    model, so two explainers of one model never change each other's)."""
    token = _ATTENDING.set(wanted)
    try:
        yield
    finally:
        _ATTENDING.reset(token)


class QueryDetector(nn.Module):
    """A detector whose every detection is a decoder query, returning :func:`query_detections`' dicts, explained by the
    ``detr`` task adapter: :class:`DetrNet` and ultralytics' RT-DETR
    (:class:`~gradcam_cli.models.rtdetr_net.RtDetrNet`). ``dense``: its cross-attention has dense weights (``--method
    attention``); ``default_threshold``: the least score explained when no ``--score-threshold`` is given (its own
    post-processing's default)."""

    dense: bool = False
    default_threshold: float = SCORE_THRESHOLD


class DetrNet(QueryDetector):
    """A transformers ``...ForObjectDetection`` of the DETR family as a detector (module docstring); ``detr``: the
    model, ``model_type`` its configuration's."""

    def __init__(self, detr: nn.Module, model_type: str) -> None:
        super().__init__()
        self.detr = detr
        self.model_type = model_type
        self.softmax = model_type in SOFTMAX_TYPES
        self.top = SIGMOID_TYPES.get(model_type, 0)
        self.dense = model_type in DENSE_TYPES

    def forward(self, pixel_values: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        config: Any = self.detr.config
        grids: list[tuple[int, int]] = []
        hook = None
        implementation, attend = config._attn_implementation, self.dense and _ATTENDING.get()
        if attend:
            config._attn_implementation = "eager"  # sdpa returns no weights
            projection: Any = self.detr.get_submodule("model.input_projection")
            hook = projection.register_forward_hook(lambda _m, _i, out: grids.append(tuple(out.shape[-2:])))
        try:
            output: Any = self.detr(pixel_values=pixel_values, output_attentions=attend)
        finally:
            config._attn_implementation = implementation
            if hook is not None:
                hook.remove()
        attention = None
        if attend and grids:
            height, width = grids[-1]
            last = output.cross_attentions[-1].mean(dim=1).detach()  # (N, Q, h * w), heads averaged
            attention = last.reshape(*last.shape[:2], height, width)
        size = (int(pixel_values.shape[-1]), int(pixel_values.shape[-2]))
        attended = [None] * int(pixel_values.shape[0]) if attention is None else list(attention)
        return [
            query_detections(logits, boxes, size, self.softmax, self.top, maps)
            for logits, boxes, maps in zip(output.logits, output.pred_boxes, attended, strict=True)
        ]


def query_detections(
    logits: torch.Tensor,
    centred: torch.Tensor,
    size: tuple[int, int],
    softmax: bool,
    top: int = 0,
    attention: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """One image's detections (module docstring) from its (Q, classes) logits and (Q, 4) centred boxes (fractions of
    the input); ``size``: the input's (width, height); ``softmax``: DETR's classes (else sigmoids, the best ``top``
    (query, class) pairs, 0: as many as queries)."""
    if softmax:
        class_scores = logits.detach().softmax(dim=-1)[:, :-1]
        scores, labels = class_scores.max(dim=-1)
        queries = torch.arange(logits.shape[0], device=logits.device)
    else:
        class_scores = logits.detach().sigmoid()
        classes = int(class_scores.shape[1])
        count = min(top or int(logits.shape[0]), class_scores.numel())
        scores, index = class_scores.flatten().topk(count)
        labels, queries = index % classes, torch.div(index, classes, rounding_mode="floor")
    width, height = size
    cx, cy, w, h = centred.detach().float().unbind(dim=-1)
    corners = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)
    scale = torch.tensor([width, height, width, height], device=corners.device, dtype=corners.dtype)
    found = {
        "boxes": corners[queries] * scale,
        "labels": labels,
        "scores": scores,
        "queries": queries,
        "logits": logits,
        "class_scores": class_scores,
    }
    if attention is not None:
        found["attention"] = attention
    return found


def last_stage(detr: nn.Module) -> str:
    """The name (inside :class:`DetrNet`) of the backbone's last stage, the default layer: a transformers backbone's
    ``encoder.stages`` last, a timm backbone's last feature module (``layer4`` of a ResNet)."""
    backbone = detr.get_submodule("model.backbone.model")
    prefix = "detr.model.backbone.model"
    stages = getattr(getattr(backbone, "encoder", None), "stages", None)
    if isinstance(stages, nn.ModuleList) and len(stages):
        return f"{prefix}.encoder.stages.{len(stages) - 1}"
    children = [name for name, _ in backbone.named_children()]
    return f"{prefix}.{children[-1]}"
