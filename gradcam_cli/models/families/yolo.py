"""Ultralytics YOLO models (``--model yolo:PATH.pt`` or ``yolo:NAME.yaml``): the optional extra ``[yolo]``; see
:mod:`gradcam_cli.models.yolo`. The task is the model's own (``--task`` is checked against it), explained by the
``yolo`` task adapter (its detections: :data:`~gradcam_cli.models.yolo.YOLO_TASK`) or as a classifier, the default
layers its detection head's inputs, and ``--input-size`` a multiple of its stride.

An RT-DETR checkpoint or model file under ``yolo:`` (told by its ``RTDETRDecoder`` head:
:func:`~gradcam_cli.models.rtdetr_net.is_rtdetr`) is a DETR-family detector: explained by the ``detr`` task adapter
(:data:`~gradcam_cli.models.detr_net.DETR_TASK`), each detection a decoder query, the default layer its backbone's
last (:func:`~gradcam_cli.models.rtdetr_net.backbone_last`), as a Hugging Face DETR's is its backbone's last stage."""

from __future__ import annotations

from typing import Any

from ...io.images import InputSpec
from ...options import ModelOptions
from ..detr_net import DETR_TASK
from ..profile import LoadedModel, ModelProfile
from ..rtdetr_net import RTDETR_KIND, backbone_last
from ..tasks import CLASSIFY
from ..yolo import YOLO_PREFIX, YOLO_TASK, load_yolo, with_input_size
from .base import Family


class Yolo(Family):
    name = "yolo"
    prefix = YOLO_PREFIX

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        built = load_yolo(options.model, options.weights, architecture_only, options.task)
        layers = tuple(getattr(built.module, "head_inputs", ()))
        task = YOLO_TASK if built.detector else CLASSIFY  # a YOLO classifier is explained as any other
        if built.kind == RTDETR_KIND:
            net: Any = getattr(built.module, "net")  # noqa: B009  (an RtDetrNet holds the ultralytics model there)
            task, layers = DETR_TASK, (backbone_last(net),)
        profile = ModelProfile(
            built.input_spec,
            built.categories,
            task,
            detector=built.detector,
            default_layers=layers,
            any_shape=built.kind == RTDETR_KIND,  # a square of any multiple of its stride
        )
        return LoadedModel(built.module, options.model, options.weights, profile=profile)

    def resize(self, model: LoadedModel, size: int) -> InputSpec:
        return with_input_size(model.module, model.input_spec, model.name, size)
