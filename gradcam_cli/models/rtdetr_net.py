"""Ultralytics RT-DETR as gradcam runs it (``--model yolo:PATH.pt`` of a checkpoint whose model is an
``RTDETRDetectionModel``, or ``yolo:rtdetr-l.yaml``): a DETR-family detector, each detection a decoder query
(:class:`~gradcam_cli.models.detr_net.QueryDetector`), explained by the ``detr`` task adapter.

**Input.** The image stretched to the model's square size, as ultralytics' RT-DETR predictor stretches it
(``scale_fill``: no letterbox padding), OpenCV's bilinear filter, pixels in [0, 1], RGB (:func:`rtdetr_spec`).

**Detections.** The decoder's eval output: per query its box (centre, width and height as fractions of the input)
and raw class logits, from its evaluation layer (``eval_idx``: the last by default). They are chosen as ultralytics
chooses them (``RTDETRDecoder.postprocess`` and ``RTDETRPredictor.postprocess``): the best (query, class) pairs of
the sigmoid scores, as many as there are queries (a query possibly twice, with two classes), kept from the confidence
threshold on (ultralytics' ``conf``, 0.25: the default ``--score-threshold``), no non-maximum suppression. The
dicts are :func:`~gradcam_cli.models.detr_net.query_detections`' (boxes in the input's pixels, ``queries``,
``logits``, ``class_scores``), as for a Hugging Face DETR.

**Layers.** The wrapped model's layers are this module's ``model`` (ultralytics' own names: ``model.9`` is layer
9); the default is the backbone's last layer (:func:`backbone_last`), the feature map the hybrid encoder reads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..io.images import OPENCV_LINEAR, InputSpec
from .detr_net import QueryDetector, query_detections
from .yolo_net import CONF

RTDETR_KIND = "rtdetr"
"""What gradcam calls an ultralytics RT-DETR model among the YOLO family's kinds (ultralytics' own task: detect)."""
RTDETR_HEAD = "RTDETRDecoder"
"""The head of an RT-DETR model file: what tells it from a YOLO detector's (``guess_model_task`` knows neither)."""


def is_rtdetr(model: object) -> bool:
    """Whether ``model``, an ultralytics model or a model file's contents, is an RT-DETR (its head an
    :data:`RTDETR_HEAD`)."""
    if isinstance(model, dict):
        head = model.get("head")
        last = head[-1] if isinstance(head, list) and head else None
        return isinstance(last, list | tuple) and len(last) > 2 and last[2] == RTDETR_HEAD
    layers = getattr(model, "model", None)
    if isinstance(layers, nn.Sequential) and len(layers):
        return type(layers[-1]).__name__ == RTDETR_HEAD
    return False


def rtdetr_spec(size: int) -> InputSpec:
    """The input spec of an RT-DETR at ``size``: the image stretched to a ``size`` square, OpenCV's bilinear resize,
    pixels in [0, 1]."""
    return InputSpec(
        size=size,
        fixed_size=(size, size),
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        interpolation=OPENCV_LINEAR,
    )


def backbone_last(net: Any) -> str:
    """The name (inside :class:`RtDetrNet`) of the last layer of the model file's ``backbone`` (``model.9`` of
    ``rtdetr-l.yaml``: HGNetv2's last stage, P5/32)."""
    config = getattr(net, "yaml", None)
    backbone = config.get("backbone") if isinstance(config, dict) else None
    count = len(backbone) if isinstance(backbone, list) and backbone else len(net.model) - 1
    return f"model.{count - 1}"


class RtDetrNet(QueryDetector):
    """An ultralytics ``RTDETRDetectionModel`` that takes stretched images and returns each image's queries as
    detections (module docstring). The wrapped model itself is held outside the module tree, so that ``.to()``
    reaches its head's cached anchors through ultralytics' own ``_apply``."""

    default_threshold = CONF

    def __init__(self, net: Any) -> None:
        super().__init__()
        self.model: Any = net.model
        object.__setattr__(self, "net", net)
        self.net: Any

    @property
    def head(self) -> Any:
        return self.model[-1]

    def _apply(self, fn: Any, recurse: bool = True) -> RtDetrNet:
        self.net._apply(fn)
        return self

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        head = self.head
        anchors = getattr(head, "anchors", None)
        if isinstance(anchors, torch.Tensor) and (anchors.is_inference() or anchors.dtype != images.dtype):
            head.shapes = []  # cached under inference mode or another precision: rebuilt, or autograd refuses them
        output = self.net(images)
        boxes, logits = output[1][0][-1], output[1][1][-1]  # the evaluation layer's (N, Q, 4) and (N, Q, classes)
        size = (int(images.shape[-1]), int(images.shape[-2]))
        return [query_detections(scores, centred, size, False) for scores, centred in zip(logits, boxes, strict=True)]
