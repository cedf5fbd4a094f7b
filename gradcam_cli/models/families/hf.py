"""Hugging Face transformers models (``--model hf:FOLDER`` or ``hf:HUB_ID``): image classifiers, embedders, and
CLIP or SigLIP folders (image tower explained, text tower beside it); the optional extra ``[hf]``. See
:mod:`gradcam_cli.models.hf_models` and :mod:`gradcam_cli.models.clip_models`."""

from __future__ import annotations

from ...options import ModelOptions
from ..hf_models import load_hf
from ..hub import HF_PREFIX
from ..profile import LoadedModel
from .base import Family, hub_model


class HuggingFace(Family):
    name = "hf"
    prefix = HF_PREFIX
    counts_classes = True

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        built = load_hf(options.model, options.weights, options.num_classes, architecture_only)
        return hub_model(built, options, tokens=True)
