"""What a model does (classify, detect or segment), found from the model, and how each task's model is fed.

The task comes from torchvision's namespace for its models (``torchvision.models.detection``, ``.segmentation``;
everything else classifies). A ``file.py:factory`` model is recognised from the structure of its output for one
blank input: ``(N, classes)`` scores classify; a list of dicts with ``boxes``, ``labels`` and ``scores`` detects
(torchvision's detection output); a dict with an ``out`` tensor or an ``(N, classes, H, W)`` tensor segments. A
model with torchvision's detection transform (``GeneralizedRCNNTransform`` as ``.transform``) is a detector
without a forward pass. ``--task`` overrides all this.

Detectors with torchvision's transform get pixels in [0, 1] (the transform normalises them, then resizes and
pads); the image is scaled beforehand as the transform would scale it, so that the transform's own resize is the
identity, and ``--input-size`` sets the transform's shorter side (its longer-side limit follows in proportion).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import UsageError
from ..io.images import InputSpec
from .modes import model_state_preserved

DETECTION_KEYS = ("boxes", "labels", "scores")
"""What each image's dict in a detector's output holds (torchvision's detection output)."""
LAYER_SCOPES = ("backbone.body", "backbone.features", "backbone")
"""Where a detector's or segmenter's default layer is looked for, first match first: the backbone's last stage
(``backbone.body.layer4`` in Faster R-CNN, ``backbone.features`` in SSD, ``backbone.layer4`` in FCN)."""
NAMED_LAYERS = {"ssdlite320_mobilenet_v3_large": "backbone.features.0"}
"""Default layers that the scopes would not find: SSDlite's first head reads ``backbone.features.0``, so a detection
of that head has no gradient at ``backbone.features.1``."""
SEGMENTATION_SIZE = 520
"""Shorter side of torchvision's segmentation models' input (their weights' ``resize_size``)."""
UNIT_SPEC = InputSpec(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
"""Pixels in [0, 1], as torchvision's detectors take them (their transform normalises)."""


CLASSIFY, DETECT, SEGMENT = "classify", "detect", "segment"
"""The built-in tasks a model is found to do (:data:`gradcam_cli.options.TASK_NAMES`), each the name of the task
adapter that explains it (:mod:`gradcam_cli.cam.tasks`)."""
NOUNS = {CLASSIFY: "classifier", DETECT: "detector", SEGMENT: "segmenter"}
"""What a model of each built-in task is called."""


def parse_task(text: str) -> str:
    """``classify``, ``detect`` or ``segment`` (any case)."""
    value = text.strip().lower()
    if value not in NOUNS:
        raise UsageError(f"unknown task {text!r}; use classify, detect or segment")
    return value


def task_facts(task: str) -> dict[str, Any]:
    """A model's profile facts (:class:`~gradcam_cli.models.profile.ModelProfile`) for a built-in ``task`` found
    from it or named by ``--task``: the adapter's name, and whether its output is detections (its input then shaped
    as its detection transform shapes it)."""
    return {"task": task, "detector": task == DETECT}


def torchvision_names(task: str) -> list[str]:
    """The torchvision model names of one built-in task."""
    import torchvision.models

    namespace = {
        CLASSIFY: torchvision.models,
        DETECT: torchvision.models.detection,
        SEGMENT: torchvision.models.segmentation,
    }[task]
    return list(torchvision.models.list_models(module=namespace))


def torchvision_video_names() -> list[str]:
    """torchvision's video classifiers (``r3d_18``, ``s3d``, ``mvit_v2_s``, ``swin3d_t``...): they take clips."""
    import torchvision.models

    return list(torchvision.models.list_models(module=torchvision.models.video))


def torchvision_task(name: str) -> str | None:
    """The task of a torchvision model name (a video classifier's: ``classify``); ``None``: not one of
    torchvision's models."""
    if name in torchvision_video_names():
        return CLASSIFY
    return next((task for task in NOUNS if name in torchvision_names(task)), None)


def detection_transform(module: nn.Module) -> nn.Module | None:
    """The model's torchvision detection transform (``.transform``), if it has one."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    transform = getattr(module, "transform", None)
    return transform if isinstance(transform, GeneralizedRCNNTransform) else None


def detection_spec(module: nn.Module, input_size: int | None) -> InputSpec | None:
    """The input spec of a detector with torchvision's transform (``None``: it has none): pixels in [0, 1] scaled
    as the transform scales them. ``input_size`` (``None``: the transform's own) becomes the transform's shorter
    side, and its longer-side limit keeps its ratio to it (800 and 1333 for Faster R-CNN)."""
    transform: Any = detection_transform(module)
    if transform is None:
        return None
    fixed = getattr(transform, "fixed_size", None)
    if fixed is not None:
        return InputSpec(fixed_size=(int(fixed[0]), int(fixed[1])), mean=UNIT_SPEC.mean, std=UNIT_SPEC.std)
    own_min = int(transform.min_size[-1])
    size = input_size or own_min
    longest = round(int(transform.max_size) * size / own_min)
    if input_size is not None:
        transform.min_size = (size,)
        transform.max_size = longest
    return InputSpec(size=size, max_side=longest, keep_aspect=True, mean=UNIT_SPEC.mean, std=UNIT_SPEC.std)


def task_of_shape(shape: Sequence[int] | None) -> str | None:
    """The task a tensor output's ``shape`` shows: (N, classes) classifies, (N, classes, H, W) segments, and so
    does a volume segmenter's (N, classes, D, H, W)."""
    if shape is None or len(shape) not in (2, 4, 5):
        return None
    return CLASSIFY if len(shape) == 2 else SEGMENT if math.prod(shape[2:]) > 1 else None


def task_of_output(output: object) -> str | None:
    """The task a model's output shows (see the module docstring); ``None``: not recognised."""
    if isinstance(output, torch.Tensor):
        return task_of_shape(tuple(output.shape))
    if isinstance(output, Mapping):
        out = output.get("out")
        return SEGMENT if isinstance(out, torch.Tensor) and out.dim() == 4 else None
    if isinstance(output, Sequence) and output and all(_is_detection(item) for item in output):
        return DETECT
    if isinstance(output, Sequence) and output and isinstance(output[0], torch.Tensor) and output[0].dim() == 2:
        return CLASSIFY  # GoogLeNet's and Inception's named tuples
    logits = getattr(output, "logits", None)
    return CLASSIFY if isinstance(logits, torch.Tensor) and logits.dim() == 2 else None


def _is_detection(item: object) -> bool:
    return isinstance(item, Mapping) and all(isinstance(item.get(key), torch.Tensor) for key in DETECTION_KEYS)


def describe_output(output: object) -> str:
    """A few words on what a model returned: ``a 3-dimensional tensor``, ``a dict with keys a, b``, ``a tuple``."""
    if isinstance(output, torch.Tensor):
        return f"a {output.dim()}-dimensional tensor ({'x'.join(map(str, output.shape))})"
    if isinstance(output, Mapping):
        keys = ", ".join(str(key) for key in list(output)[:4])
        return f"a dict with keys {keys}" if keys else "an empty dict"
    if isinstance(output, list | tuple) and output:
        return f"a {type(output).__name__} of {type(output[0]).__name__}"
    return f"a {type(output).__name__}"


def infer_task(module: nn.Module, spec: InputSpec, name: str) -> str:
    """The task of a model that is not torchvision's, from one forward pass on a blank input in eval mode.

    A model whose forward pass fails is taken for a classifier, so that the dry pass reports the failure with its
    input; one whose output fits no task is a one-line :class:`UsageError` that names what it returned."""
    if detection_transform(module) is not None:
        return DETECT
    height, width = spec.fixed_size or (spec.size, spec.size)
    try:
        with model_state_preserved(module), torch.no_grad():
            output: Any = module(torch.zeros(1, 3, height, width, device=_device_of(module)))
    except Exception:  # the dry pass reports it, with the input size
        return CLASSIFY
    task = task_of_output(output)
    if task is None:
        raise UsageError(
            f"cannot tell what task {name} does: it returns {describe_output(output)}, while a classifier returns "
            "(N, classes) scores, a detector a list of dicts with boxes, labels and scores, and a segmenter "
            "(N, classes, H, W) scores or a dict with 'out'; pass --task classify|detect|segment"
        )
    return task


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters(), torch.empty(0)).device
