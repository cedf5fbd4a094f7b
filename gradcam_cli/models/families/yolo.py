"""Ultralytics YOLO models (``--model yolo:PATH.pt`` or ``yolo:NAME.yaml``): the optional extra ``[yolo]``; see
:mod:`gradcam_cli.models.yolo`. The task is the model's own (``--task`` is checked against it), the default layers
its detection head's inputs, and ``--input-size`` a multiple of its stride."""

from __future__ import annotations

from ...io.images import InputSpec
from ...options import ModelOptions
from ..profile import LoadedModel, ModelProfile
from ..yolo import YOLO_PREFIX, load_yolo, with_input_size
from .base import Family


class Yolo(Family):
    name = "yolo"
    prefix = YOLO_PREFIX

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        built = load_yolo(options.model, options.weights, architecture_only, options.task)
        layers = tuple(getattr(built.module, "head_inputs", ()))
        profile = ModelProfile(built.input_spec, built.categories, built.task, default_layers=layers)
        return LoadedModel(built.module, options.model, options.weights, profile=profile)

    def resize(self, model: LoadedModel, size: int) -> InputSpec:
        return with_input_size(model.module, model.input_spec, model.name, size)
