"""torchvision's classifiers, detectors and segmenters, by name (``resnet50``, ``fasterrcnn_resnet50_fpn``), and
its video classifiers (``r3d_18``: clips, :mod:`gradcam_cli.models.clip_spec`): the family asked last, for any name
no other family claims."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import ModelLoadError, UsageError, suggest
from ...io.images import InputSpec
from ...options import ModelOptions
from ..clip_spec import ClipSpec, torchvision_clip
from ..profile import LoadedModel, ModelProfile
from ..tasks import (
    CLASSIFY,
    NOUNS,
    SEGMENT,
    SEGMENTATION_SIZE,
    task_facts,
    torchvision_names,
    torchvision_task,
    torchvision_video_names,
)
from ..weights import (
    apply_state_dict,
    load_state_dict_file,
    torchvision_architecture_only,
    torchvision_weights_only,
    weights_failure,
)
from .base import Family, chosen_task

AUXILIARY = ("googlenet", "inception_v3")
"""Classifiers built with auxiliary heads, which gradcam leaves out."""
CLASS_TOKEN = ("mvit_v1_b", "mvit_v2_s")
"""Video models whose token sequences start with a class token (then a t x h x w grid: MViT)."""


class Torchvision(Family):
    name = "torchvision"
    claim_order = 2

    def claims(self, model: str) -> bool:
        return True  # the last family asked: an unknown name is refused by load, with close matches

    def names(self) -> list[str]:
        return [name for task in NOUNS for name in torchvision_names(task)] + torchvision_video_names()

    def resize(self, model: LoadedModel, size: int) -> InputSpec:
        """Its input spec at ``--input-size size``; a video model's dry pass at that size too."""
        spec = super().resize(model, size)
        if model.profile.clip is not None and spec.shape is not None:
            spec = replace(spec, shape=(*spec.shape[:2], size, size))
        return spec

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        loaded = _load_torchvision(options.model, options.weights, options.num_classes, architecture_only)
        return loaded.with_profile(**task_facts(chosen_task(options, loaded.task)))


def imagenet_categories() -> list[str]:
    """The 1,000 ImageNet class names in torchvision's order (shipped in code, no download)."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def _load_torchvision(name: str, weights: str, num_classes: int | None, architecture_only: bool) -> LoadedModel:
    import torchvision.models

    from . import available_models

    task = torchvision_task(name)
    if task is None:
        names = available_models()
        raise UsageError(f"unknown model {name!r}.{suggest(name, names)} See --list-models.")
    weights_enum = torchvision.models.get_model_weights(name)
    default = weights_enum.DEFAULT
    spec, clip = _input_spec(name, default)
    if weights.lower() == "none" or _looks_like_path(weights):
        kwargs: dict[str, Any] = {"num_classes": num_classes} if num_classes else {}
        if name in AUXILIARY:
            kwargs.setdefault("aux_logits", False)
            kwargs.setdefault("init_weights", True)
        if task != CLASSIFY:
            kwargs["weights_backbone"] = None  # --weights none downloads nothing, backbone included
        module = torchvision.models.get_model(name, weights=None, **kwargs)
        if weights.lower() != "none" and not architecture_only:
            state = load_state_dict_file(weights)
            if name in AUXILIARY:
                state = {k: v for k, v in state.items() if not k.startswith(("aux1.", "aux2.", "AuxLogits."))}
            apply_state_dict(module, state, weights)
        classes = num_classes or len(default.meta["categories"])
        categories = list(default.meta["categories"]) if classes == len(default.meta["categories"]) else None
        return LoadedModel(module, name, weights, profile=_profile(name, spec, categories, task, clip))
    members = list(weights_enum.__members__)
    if weights not in members:
        raise UsageError(
            f"unknown weights {weights!r} for {name}.{suggest(weights, members)} "
            f"Use one of: {', '.join(members)}, none, or a file path."
        )
    if num_classes:
        raise UsageError("--num-classes needs --weights PATH (pretrained torchvision weights fix the class count)")
    chosen = weights_enum[weights]
    with torchvision_architecture_only() if architecture_only else torchvision_weights_only():
        try:
            module = torchvision.models.get_model(name, weights=chosen)
        except Exception as error:
            raise ModelLoadError(weights_failure(name, chosen, error)) from error
    categories = list(chosen.meta["categories"])
    spec, clip = _input_spec(name, chosen)
    return LoadedModel(module, name, chosen.name, profile=_profile(name, spec, categories, task, clip))


def _profile(
    name: str, spec: InputSpec, categories: list[str] | None, task: str, clip: ClipSpec | None
) -> ModelProfile:
    prefix = 1 if name in CLASS_TOKEN else None
    return ModelProfile(spec, categories, task, clip=clip, prefix_tokens=prefix)


def _input_spec(name: str, weights: Any) -> tuple[InputSpec, ClipSpec | None]:
    """The model's input spec from its weights' transform, and a video model's clips."""
    if name in torchvision_video_names():
        return torchvision_clip(name, weights)
    return _image_spec(name, weights), None


def _image_spec(name: str, weights: Any) -> InputSpec:
    transforms = weights.transforms()
    mean = tuple(getattr(transforms, "mean", InputSpec.mean))
    std = tuple(getattr(transforms, "std", InputSpec.std))
    fixed = None
    if name.startswith(("vit_", "maxvit_")):
        crop = getattr(transforms, "crop_size", [224])
        fixed = (crop[0], crop[0])
    if name in torchvision_names(SEGMENT):
        return InputSpec(size=SEGMENTATION_SIZE, mean=mean, std=std)
    return InputSpec(fixed_size=fixed, mean=mean, std=std)


def _looks_like_path(value: str) -> bool:
    return any(ch in value for ch in "/\\.") or Path(value).exists()
