"""timm models (``--model timm:NAME``): the optional extra ``[timm]``; see :mod:`gradcam_cli.models.timm_models`."""

from __future__ import annotations

from ...options import ModelOptions
from ..hub import TIMM_PREFIX
from ..profile import LoadedModel
from ..timm_models import load_timm
from .base import Family, hub_model


class Timm(Family):
    name = "timm"
    prefix = TIMM_PREFIX
    headless = True
    counts_classes = True

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        built = load_timm(options.model, options.weights, options.num_classes, architecture_only)
        return hub_model(built, options, tokens=True)
