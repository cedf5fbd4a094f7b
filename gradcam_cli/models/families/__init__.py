"""The model families ``--model`` names, one module each, in one registry (:data:`FAMILIES`).

=============== ======================================= =================================================
family          ``--model``                             module
=============== ======================================= =================================================
``yolo``        ``yolo:best.pt``, ``yolo:yolo11n.yaml`` :mod:`~gradcam_cli.models.families.yolo`
``timm``        ``timm:convnext_tiny``                  :mod:`~gradcam_cli.models.families.timm`
``hf``          ``hf:FOLDER``, ``hf:org/name``          :mod:`~gradcam_cli.models.families.hf`
``open_clip``   ``open_clip:ViT-B-32``                  :mod:`~gradcam_cli.models.families.open_clip`
``lite0``       ``efficientnet_lite0``                  :mod:`~gradcam_cli.models.families.lite0`
``custom``      ``file.py:factory``, ``pkg.mod:factory`` :mod:`~gradcam_cli.models.families.custom`
``torchvision`` ``resnet50``, ``fasterrcnn_resnet50_fpn`` :mod:`~gradcam_cli.models.families.torchvision`
``vision-language`` ``hf:DIR`` of an image-text-to-text model :mod:`~gradcam_cli.models.families.vision_language`
``nnunet``      ``nnunet:DIR``, an nnU-Net v2 model folder :mod:`~gradcam_cli.models.families.nnunet`
``monai-bundle`` ``bundle:DIR``, a MONAI bundle folder  :mod:`~gradcam_cli.models.families.monai_bundle`
``monai``       ``monai:UNet?in_channels=1&...``        :mod:`~gradcam_cli.models.families.monai_net`
``hf-detr``     ``hf:DIR`` of a DETR-family detector    :mod:`~gradcam_cli.models.families.hf_detr`
=============== ======================================= =================================================

Third-party packages add families through the ``gradcam_cli.families`` entry-point group: an entry point names a
module that registers its families on import, or a :class:`Family` instance, registered under the entry point's
name (docs/internals.md, "Writing a plugin").
"""

from __future__ import annotations

from types import ModuleType

from ...errors import UsageError
from ...registry import FAMILIES_GROUP, Registry
from .base import Family
from .custom import Custom
from .hf import HuggingFace
from .hf_detr import HuggingFaceDetector
from .lite0 import Lite0
from .monai_bundle import MonaiBundle
from .monai_net import MonaiNetwork
from .nnunet import NnUNet
from .open_clip import OpenClip
from .timm import Timm
from .torchvision import Torchvision
from .vision_language import VisionLanguage
from .yolo import Yolo

__all__ = ["FAMILIES", "Family", "available_models", "family_of", "no_head_families"]


def _register_plugin(name: str, loaded: object) -> None:
    if isinstance(loaded, Family):
        FAMILIES.register(name, loaded)
    elif not isinstance(loaded, ModuleType):  # a module registered its families when it was imported
        raise UsageError(f"the model family plugin {name!r} is {type(loaded).__name__}, not a Family or a module")


FAMILIES: Registry[Family] = Registry("model family", FAMILIES_GROUP, _register_plugin)
"""Every model family by name: the package's own, then plugins'."""

for _family in (
    Yolo(),
    Timm(),
    HuggingFace(),
    OpenClip(),
    Lite0(),
    Custom(),
    Torchvision(),
    VisionLanguage(),
    NnUNet(),
    MonaiBundle(),
    MonaiNetwork(),
    HuggingFaceDetector(),
):
    FAMILIES.register(_family.name, _family)


def family_of(model: str) -> Family:
    """The family that claims ``--model model``: families of a lower :attr:`~Family.claim_order` asked first, each
    order in registration order (the torchvision family claims any name left, and refuses unknown ones)."""
    families = sorted(FAMILIES.values(), key=lambda family: family.claim_order)
    family = next((family for family in families if family.claims(model)), None)
    if family is None:
        raise UsageError(f"no model family takes --model {model}; see --list-models")
    return family


def available_models() -> list[str]:
    """Every model name ``--model`` accepts besides specs a family takes after its prefix (``timm:NAME``,
    ``file.py:factory``): torchvision's classifiers, detectors and segmenters, ``efficientnet_lite0``, and any a
    plugin family lists."""
    return sorted(name for family in FAMILIES.values() for name in family.names())


def no_head_families() -> str:
    """The prefixes of the families whose models can be built without a head (``--num-classes 0``)."""
    return " or ".join(family.prefix or family.name for family in FAMILIES.values() if family.headless)
