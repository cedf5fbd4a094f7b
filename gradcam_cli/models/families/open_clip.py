"""open_clip models (``--model open_clip:ARCH``): the image tower explained, the text tower beside it for ``text:``
targets; the optional extra ``[clip]``. See :mod:`gradcam_cli.models.clip_models`."""

from __future__ import annotations

from ...errors import UsageError
from ...options import ModelOptions
from ..clip_models import load_open_clip
from ..hub import OPEN_CLIP_PREFIX
from ..profile import LoadedModel
from .base import Family, hub_model


class OpenClip(Family):
    name = "open_clip"
    prefix = OPEN_CLIP_PREFIX
    counts_classes = True

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        if options.num_classes is not None:
            raise UsageError(
                f"--num-classes does not apply to {options.model}: it has no class head (it embeds images)"
            )
        built = load_open_clip(options.model, options.weights, architecture_only)
        return hub_model(built, options, tokens=False)
