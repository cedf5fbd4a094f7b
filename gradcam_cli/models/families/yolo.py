"""Ultralytics YOLO models (``--model yolo:PATH.pt`` or ``yolo:NAME.yaml``): the optional extra ``[yolo]``; see
:mod:`gradcam_cli.models.yolo`. The task is the model's own (``--task`` is checked against it), explained by the
``yolo`` task adapter (its detections: :data:`~gradcam_cli.models.yolo.YOLO_TASK`) or as a classifier, the default
layers its detection head's inputs, and ``--input-size`` a multiple of its stride."""

from __future__ import annotations

from ...io.images import InputSpec
from ...options import ModelOptions
from ..profile import LoadedModel, ModelProfile
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
        profile = ModelProfile(built.input_spec, built.categories, task, detector=built.detector, default_layers=layers)
        return LoadedModel(built.module, options.model, options.weights, profile=profile)

    def resize(self, model: LoadedModel, size: int) -> InputSpec:
        return with_input_size(model.module, model.input_spec, model.name, size)
