"""Hugging Face vision models, ``--model hf:PATH``: a folder written by ``save_pretrained``, or a hub id.

A classifier is loaded with ``AutoModelForImageClassification`` (a video classifier with
``AutoModelForVideoClassification``: :mod:`gradcam_cli.models.hf_video`); a folder saved from a base model (its
``architectures`` name no classification head: ``ViTModel``, ``Dinov2Model``) with ``AutoModel``, as an embedding
model (its ``pooler_output`` is the embedding, see docs/targets.md); a ``CLIPModel`` or ``SiglipModel`` as a
CLIP-style model (:mod:`gradcam_cli.models.clip_models`). The image processor (``preprocessor_config.json``) gives the
normalisation, the input size (``height`` x ``width``: a fixed size; ``shortest_edge``: the shorter side) and the
resampling filter, and ``id2label`` the class names. A hub id is read from the local cache, and downloaded into it
only when missing (:func:`gradcam_cli.models.hub.hub_snapshot`); everything is then loaded from that folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from PIL import Image
from torch import nn

from ..errors import ModelLoadError, UsageError, describe
from ..io.images import IMAGENET_MEAN, IMAGENET_STD, InputSpec
from .clip_models import HF_CLIP_TYPES, hf_clip
from .hf_video import hf_video
from .hub import (
    HF_PREFIX,
    HubModel,
    HubUnavailable,
    check_num_classes,
    hub_configuration,
    hub_snapshot,
    missing_extra,
    not_cached,
)
from .weights import apply_state_dict, load_state_dict_file

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""What a hub id looks like: ``name`` or ``organisation/name``."""
TOKEN_PARAMETERS = ("cls_token", "distillation_token", "register_tokens")
"""The learned tokens Hugging Face ViTs put before the patch tokens (BEiT, DeiT, DINOv2 with registers...)."""
NO_HUB_ID = "or pass hf:FOLDER, a folder saved with save_pretrained"
"""How to go without the hub when a hub id is not cached (``--weights`` does not help: the configuration is needed)."""
GENERIC_LABEL = re.compile(r"LABEL_\d+")
"""transformers' placeholder class names: a config without real ones is shown by class index."""


def load_hf(model: str, weights: str, num_classes: int | None, architecture_only: bool = False) -> HubModel:
    """Load ``hf:PATH`` with ``weights``: DEFAULT (the folder's own), none (random) or a state-dict file.
    ``architecture_only``: the model its configuration describes, with random parameters; a hub id then needs only
    its configuration files (no weights are downloaded or read)."""
    try:
        from transformers import (
            AutoConfig,
            AutoImageProcessor,
            AutoModel,
            AutoModelForImageClassification,
            AutoModelForVideoClassification,
        )
    except ImportError as error:
        raise missing_extra(model, "hf") from error
    check_num_classes(model, weights, num_classes)
    own_weights = weights.upper() == "DEFAULT" and not architecture_only
    folder = hf_folder(model, own_weights)
    with quiet_transformers():
        config = _load(model, lambda: AutoConfig.from_pretrained(folder))
        kind = _kind(model, config)
        auto: Any = AutoModel if kind != "classify" else _teacher_class(config) or AutoModelForImageClassification
        auto = AutoModelForVideoClassification if kind == "video" else auto
        if num_classes and kind not in ("classify", "video"):
            raise UsageError(f"--num-classes does not apply to {model}: it has no class head (it embeds images)")
        if own_weights:
            module = _load(model, lambda: auto.from_pretrained(folder))
        else:
            if num_classes:
                config.num_labels = num_classes
            build = auto.from_config if hasattr(auto, "from_config") else auto  # a model class builds from a config
            module = _load(model, lambda: build(config))
        try:
            processor = AutoImageProcessor.from_pretrained(folder)
        except Exception:  # no preprocessor_config.json: the defaults apply (docs/models.md)
            processor = None
    if weights.lower() not in ("default", "none") and not architecture_only:
        apply_state_dict(module, load_state_dict_file(weights), weights)
    if kind == "clip":
        return hf_clip(module, folder, input_spec(processor, config.vision_config), weights)
    described = describe_hf(module, processor, weights)
    described.embeds = kind == "embed"
    return hf_video(described) if kind == "video" else described


def describe_hf(module: nn.Module, processor: Any = None, weights: str = "DEFAULT") -> HubModel:
    """What the tool needs to know about a transformers image classifier: the preprocessing its image processor
    describes (ImageNet's normalisation and the config's ``image_size`` without one), its ``id2label`` names and its
    prefix-token count (its class, distillation and register tokens)."""
    config: Any = module.config
    labels = [str(config.id2label[i]) for i in range(config.num_labels)] if config.id2label else []
    categories = labels if labels and not all(GENERIC_LABEL.fullmatch(label) for label in labels) else None
    prefix = sum(
        int(parameter.shape[-2])
        for name, parameter in module.named_parameters()
        if name.rpartition(".")[2] in TOKEN_PARAMETERS and parameter.dim() == 3
    )
    return HubModel(module, weights, categories, input_spec(processor, config), prefix)


def input_spec(processor: Any, config: Any) -> InputSpec:
    """The image processor's size, normalisation and resampling as an :class:`InputSpec` (no crop, as always)."""
    image_size = getattr(config, "image_size", None)
    if processor is None:  # the config's image_size: one side, or a (height, width) pair
        pair = tuple(image_size) if isinstance(image_size, list | tuple) and len(image_size) == 2 else None
        fixed = (image_size, image_size) if isinstance(image_size, int) else None
        fixed = (int(pair[0]), int(pair[1])) if pair is not None else fixed
        return InputSpec(size=min(fixed) if fixed else InputSpec.size, fixed_size=fixed)
    size = processor.size if hasattr(processor, "size") else None
    height, width, shortest = (_size_value(size, key) for key in ("height", "width", "shortest_edge"))
    mean, std = IMAGENET_MEAN, IMAGENET_STD
    if getattr(processor, "do_normalize", True):
        mean = _triple(getattr(processor, "image_mean", None) or mean)
        std = _triple(getattr(processor, "image_std", None) or std)
    else:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    # The model sees the 0..255 pixel times rescale_factor (1/255 by default; 1 without rescaling), normalised; the
    # tool's pixels are 0..1, so mean and std are divided by 255 * rescale_factor.
    factor = float(getattr(processor, "rescale_factor", 1 / 255)) if getattr(processor, "do_rescale", True) else 1.0
    scale = 255 * factor
    resample = getattr(processor, "resample", None)
    return InputSpec(
        size=shortest or min(height or InputSpec.size, width or InputSpec.size),
        fixed_size=(height, width) if height and width else None,
        mean=_triple(m / scale for m in mean),
        std=_triple(s / scale for s in std),
        interpolation=Image.Resampling(int(resample)).name.lower() if resample is not None else "bilinear",
    )


def _size_value(size: Any, key: str) -> int | None:
    if isinstance(size, int):
        return size if key == "shortest_edge" else None
    value = size.get(key) if isinstance(size, Mapping) else getattr(size, key, None)
    return int(value) if value else None


def _triple(values: Any) -> tuple[float, float, float]:
    first, second, third = (float(value) for value in values)
    return first, second, third


def config_type(model: str) -> str:
    """The ``model_type`` of ``hf:PATH``'s configuration (its configuration files alone read, or downloaded for an
    uncached hub id); the error loading the model would give when there is none to read: no such folder, a folder
    without ``config.json``, a configuration transformers cannot read, a hub id neither cached nor downloadable."""
    try:
        from transformers import AutoConfig
    except ImportError as error:
        raise missing_extra(model, "hf") from error
    folder = hf_folder(model, weights=False)
    with quiet_transformers():
        config = _load(model, lambda: AutoConfig.from_pretrained(folder))
    return str(getattr(config, "model_type", "") or "unknown")


def hf_folder(model: str, weights: bool = True) -> str:
    """The local folder of ``hf:PATH``: PATH itself, or the cached (else downloaded) snapshot of hub id PATH (its
    configuration files alone when ``weights`` are not needed)."""
    target = model.removeprefix(HF_PREFIX)
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UsageError(f"{path} has no config.json; save the model there with model.save_pretrained(FOLDER)")
        return str(path)
    if path.exists():
        raise UsageError(f"{model} is a file; pass the folder the model was saved to with save_pretrained, or a hub id")
    if not HUB_ID.fullmatch(target):
        raise UsageError(f"folder {target} does not exist; pass a folder saved with save_pretrained or a hub id")
    try:
        return str(hub_snapshot(target) if weights else hub_configuration(target))
    except HubUnavailable as error:
        raise not_cached(f"{model} (not a folder here, so a hub id)", target, str(error), NO_HUB_ID) from error


def _load(model: str, load: Any) -> Any:
    try:
        return load()
    except Exception as error:
        raise ModelLoadError(f"transformers could not load {model}: {describe(error)}") from error


TEACHER = "ForImageClassificationWithTeacher"
"""A distilled classifier's architecture (DeiT's): class and distillation heads, whose mean is its logits."""


def _teacher_class(config: Any) -> Any:
    """The class of a distilled classifier (``DeiTForImageClassificationWithTeacher``), which
    AutoModelForImageClassification would load without its two heads; ``None`` for any other model."""
    import transformers

    names = [str(name) for name in getattr(config, "architectures", None) or [] if str(name).endswith(TEACHER)]
    return getattr(transformers, names[0], None) if names else None


def _kind(model: str, config: Any) -> str:
    """``clip`` (a CLIP or SigLIP model), ``video`` (a video classifier), ``embed`` (a vision model saved without a
    classification head) or ``classify``; a UsageError for a model that is none of transformers' vision models."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES as KNOWN
    from transformers.models.auto.modeling_auto import MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES as VIDEO

    kind = getattr(config, "model_type", "")
    if kind in VIDEO:  # VideoMAE, TimeSformer, ViViT: clips (docs/video.md)
        return "video"
    architectures = [str(name) for name in getattr(config, "architectures", None) or []]
    headed = any(name.endswith(("ForImageClassification", TEACHER)) for name in architectures)
    if kind in HF_CLIP_TYPES and not headed:
        return "clip"
    if kind not in KNOWN:
        raise UsageError(
            f"{model} is a {kind or 'model of unknown type'} model, not one of the image classifiers transformers "
            "loads with AutoModelForImageClassification (nor a vision backbone, CLIP or SigLIP model)"
        )
    return "embed" if architectures and not headed else "classify"


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars and no warnings from transformers while loading: stderr is for the tool's own messages."""
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
