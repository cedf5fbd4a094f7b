"""An Ultralytics YOLO model as gradcam runs it (``--model yolo:...``): the model's own letterbox padding, the model,
its own non-maximum suppression, and every detection traced to the anchor (or query) it came from.

**Input.** A batch of images resized as ultralytics' letterbox resizes them (the longer side to the model's size,
the aspect kept, OpenCV's bilinear filter: the model's :class:`~gradcam_cli.io.images.InputSpec` does that), pixels
in [0, 1], RGB. :class:`YoloNet` pads it as the letterbox does for ``model.predict``: to the next multiple of the
model's largest stride, the padding split between the two sides (the odd pixel at the bottom or right), grey
(114/255). Boxes, masks and keypoints come back in the coordinates of the unpadded input, boxes clipped to it.

**The tracing rule.** The head's output has one column per anchor: a cell of P3, then P4, then P5, row by row, each
with its decoded box and one raw logit per class (its sigmoid is the class confidence).

- Heads with NMS (YOLOv8, YOLO11, ...): the columns go through ultralytics' own ``non_max_suppression`` with
  ``model.predict``'s settings (confidence at least ``conf``, IoU 0.7, class-aware, each anchor's best class only, at
  most ``max_det``), which returns the index of each kept column: detection j came from that anchor, with the row's
  class c, and its score is that anchor's logit for c (the confidence is its sigmoid).
- End-to-end heads (YOLOv10, YOLO26): the one-to-one head ranks anchors x classes with ultralytics' own top-k
  (``Detect.get_topk_index``, which also returns each row's anchor, the head's *query*); the rows kept by
  ``non_max_suppression`` (confidence above ``conf``, at most ``max_det``) are traced to their query the same way.

Each image's dict holds ``boxes``, ``labels``, ``scores`` (torchvision's detection keys, so the task is found as
for any detector), ``anchors`` (the traced anchor of each detection), ``class_logits`` (classes, anchors) and
``extents`` (anchors,): every anchor's raw logits and box extent (its predicted distances to the box's four sides,
the box's width plus height, in input pixels), differentiable; a segment model's ``masks`` (detections, H, W) and a
pose model's ``keypoints`` (detections, K, 3: x, y, visibility). ultralytics is imported only when the model runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

PAD_VALUE = 114 / 255
"""The letterbox's grey, in [0, 1] pixels."""
IOU = 0.7
"""``model.predict``'s IoU threshold for non-maximum suppression (ultralytics' ``iou`` default)."""
MAX_DET = 300
"""``model.predict``'s most detections per image (ultralytics' ``max_det`` default)."""
CONF = 0.25
"""``model.predict``'s confidence threshold (ultralytics' ``conf`` default): the default ``--score-threshold``."""


def letterbox_padding(height: int, width: int, stride: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) padding that brings (height, width) to the next multiple of ``stride``, split as
    ultralytics' letterbox splits it: the odd pixel goes to the bottom or the right."""
    padded_h, padded_w = math.ceil(height / stride) * stride, math.ceil(width / stride) * stride
    top, left = (padded_h - height) // 2, (padded_w - width) // 2
    return top, padded_h - height - top, left, padded_w - width - left


_CONFIDENCE: ContextVar[float | None] = ContextVar("yolo_confidence", default=None)


@contextmanager
def confidence(threshold: float) -> Iterator[None]:
    """Within, every :class:`YoloNet` forward pass of this thread (or task) keeps detections from ``threshold`` on:
    a pass's own threshold, so that two explainers of one model never change each other's (nothing is set on the
    model)."""
    token = _CONFIDENCE.set(threshold)
    try:
        yield
    finally:
        _CONFIDENCE.reset(token)


class YoloNet(nn.Module):
    """A YOLO detect, segment or pose model (ultralytics' ``DetectionModel`` and subclasses) that takes resized images
    and returns each image's traced detections (see the module docstring). ``conf``: the least confidence kept.

    The wrapped model's layers are this module's ``model`` (ultralytics' own names: ``model.16`` is layer 16); the
    wrapped model itself is held outside the module tree, so that ``.to()`` reaches its head's strides and anchors.
    """

    def __init__(self, net: Any, task: str, conf: float = CONF) -> None:
        super().__init__()
        self.model: Any = net.model
        object.__setattr__(self, "net", net)
        self.net: Any
        self.task = task
        self.conf = conf
        self.default_conf = conf
        self.stride = model_stride(net)
        self.padding = (0, 0, 0, 0)
        """The (top, bottom, left, right) padding of the last forward pass."""

    @property
    def head(self) -> Any:
        return self.model[-1]

    @property
    def head_inputs(self) -> list[str]:
        """The names of the layers whose outputs enter the head: P3, P4, P5 (``model.16``, ``model.19``, ...)."""
        return [f"model.{i}" for i in self.head.f]

    def _apply(self, fn: Any, recurse: bool = True) -> YoloNet:
        self.net._apply(fn)  # ultralytics' own: also moves the head's strides and anchors
        return self

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Each image's traced detections, kept from the confidence :func:`confidence` sets for this pass (by
        default ``conf``)."""
        height, width = int(images.shape[-2]), int(images.shape[-1])
        self.padding = top, bottom, left, right = letterbox_padding(height, width, self.stride)
        padded = F.pad(images, (left, right, top, bottom), value=PAD_VALUE)
        head = self.head
        anchors = getattr(head, "anchors", None)
        if isinstance(anchors, torch.Tensor) and anchors.is_inference():
            head.shape = None  # cached under inference mode (model.predict): rebuilt, or autograd refuses them
        output = self.net(padded)
        raw = output[1]
        decoded, proto = output[0] if self.task == "segment" else (output[0], None)
        if isinstance(raw, dict) and "one2one" in raw:
            raw = raw["one2one" if head.end2end else "one2many"]
        logits = raw["scores"]  # (N, classes, anchors)
        extents = head.dfl(raw["boxes"]).sum(dim=1) * head.strides.view(1, -1)  # (N, anchors)
        kept, traced = self._suppress(decoded, logits)
        detections = []
        for n, (rows, anchor) in enumerate(zip(kept, traced, strict=True)):
            boxes = rows[:, :4].detach().clone()
            boxes[:, 0::2] = (boxes[:, 0::2] - left).clamp(0, width)
            boxes[:, 1::2] = (boxes[:, 1::2] - top).clamp(0, height)
            found = {
                "boxes": boxes,
                "labels": rows[:, 5].long(),
                "scores": rows[:, 4].detach(),
                "anchors": anchor.long(),
                "class_logits": logits[n],
                "extents": extents[n],
            }
            if proto is not None:
                found = self._with_masks(found, rows, proto[n], padded.shape[-2:], (height, width))
            elif self.task == "pose":
                found["keypoints"] = self._keypoints(rows)
            detections.append(found)
        return detections

    def _suppress(self, decoded: torch.Tensor, logits: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Ultralytics' own NMS (or an end-to-end head's top-k) on ``decoded``: each image's kept rows (x1, y1, x2,
        y2, confidence, class, extra...) in padded-input pixels, and the anchor each came from."""
        from ultralytics.utils.nms import non_max_suppression

        head = self.head
        nc = int(logits.shape[1])
        rows, kept = non_max_suppression(
            decoded.detach(),
            self.conf if (threshold := _CONFIDENCE.get()) is None else threshold,
            IOU,
            max_det=MAX_DET,
            nc=nc,
            end2end=bool(head.end2end),
            return_idxs=True,
        )
        if not head.end2end:
            return rows, list(kept)
        scores = logits.detach().sigmoid().permute(0, 2, 1)  # (N, anchors, classes), as the head ranks them
        _, _, queries = head.get_topk_index(scores, min(head.max_det, scores.shape[1]))
        return rows, [queries[n, index.long()] for n, index in enumerate(kept)]

    def _with_masks(
        self,
        found: dict[str, torch.Tensor],
        rows: torch.Tensor,
        proto: torch.Tensor,
        padded: torch.Size,
        size: tuple[int, int],
    ) -> dict[str, torch.Tensor]:
        """``found`` with each detection's instance mask (``model.predict``'s: the prototypes weighted by its
        coefficients, upsampled to the padded input, cut to its box), cropped to the image; detections whose mask is
        empty are dropped, as ``model.predict`` drops them."""
        from ultralytics.utils.ops import process_mask

        masks = process_mask(proto.detach(), rows[:, 6:].detach(), rows[:, :4].detach(), tuple(padded), True)
        top, _, left, _ = self.padding
        masks = masks[:, top : top + size[0], left : left + size[1]].bool()
        keep = masks.flatten(1).any(dim=1)
        kept = {key: value[keep] if key not in ("class_logits", "extents") else value for key, value in found.items()}
        kept["masks"] = masks[keep]
        return kept

    def _keypoints(self, rows: torch.Tensor) -> torch.Tensor:
        """Each detection's keypoints (detections, K, 3): x and y in the unpadded input, and the visibility (1 where
        the model predicts none)."""
        count, dims = (int(v) for v in self.head.kpt_shape)
        points = rows[:, 6 : 6 + count * dims].detach().reshape(-1, count, dims).clone()
        top, _, left, _ = self.padding
        points[..., 0] -= left
        points[..., 1] -= top
        if dims == 2:
            points = torch.cat([points, torch.ones_like(points[..., :1])], dim=-1)
        return points


class YoloClassifier(nn.Module):
    """A YOLO classification model (ultralytics' ``ClassificationModel``) returning its (N, classes) logits (the model
    itself returns their softmax in eval mode). Its layers are this module's ``model``, as in :class:`YoloNet`."""

    def __init__(self, net: Any) -> None:
        super().__init__()
        self.model: Any = net.model
        object.__setattr__(self, "net", net)
        self.net: Any

    def _apply(self, fn: Any, recurse: bool = True) -> YoloClassifier:
        self.net._apply(fn)
        return self

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        output = self.net(images)
        logits: torch.Tensor = output[1] if isinstance(output, tuple | list) else output
        return logits


def model_stride(net: Any) -> int:
    """An ultralytics model's largest stride: its input sides are multiples of it."""
    return int(max(float(s) for s in net.stride))
