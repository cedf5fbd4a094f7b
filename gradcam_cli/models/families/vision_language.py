"""Vision-language models (``--model hf:DIR`` whose configuration is an image-text-to-text model's): asked a
``--prompt``, their answer is explained (docs/vlm.md, :mod:`gradcam_cli.vlm`). The family claims such folders
before the ``hf`` family (:attr:`claim_order` -1); without ``--prompt`` there is nothing to explain, and loading one
as an image model says so."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import UsageError
from ...options import ModelOptions
from ...vlm.families import family_of as vlm_family
from ...vlm.loading import vlm_model_type
from ..profile import LoadedModel
from .base import Family

if TYPE_CHECKING:
    import torch

    from ...vlm.loading import LoadedVlm


class VisionLanguage(Family):
    name = "vision-language"
    claim_order = -1
    answers = True

    def claims(self, model: str) -> bool:
        return vlm_model_type(model) is not None

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        model_type = vlm_model_type(options.model) or "unknown"
        vlm_family(model_type, options.model)  # an unsupported family is refused first, naming the supported ones
        raise UsageError(
            f"{options.model} is a {model_type} vision-language model; ask it about the image with --prompt TEXT"
        )

    def load_answering(self, options: ModelOptions, device: torch.device) -> LoadedVlm:
        from ...vlm.loading import load_vlm

        return load_vlm(options.model, device, options.precision)
