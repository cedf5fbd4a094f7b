"""Reading weights: state-dict files (``weights_only=True`` only), torchvision's cache, and why loading failed."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError, UsageError


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
        raise ModelLoadError(f"cannot load weights from {path}: {first_line(error)}") from error
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
            first_line(error)
            if result is None
            else (f"missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
        )
        raise ModelLoadError(
            f"weights in {source} do not fit the model ({detail}); check --model and --num-classes"
        ) from error


@contextmanager
def torchvision_weights_only() -> Iterator[None]:
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


def weights_failure(name: str, weights: Any, error: Exception) -> str:
    path = weights_cache_path(weights)
    if path.exists():
        return f"cannot load {path} for {name}: {first_line(error)}"
    return (
        f"could not download the {weights.name} weights for {name} ({first_line(error)}); "
        f"to work offline, copy {path.name} into {path.parent} (or set TORCH_HOME), "
        f"or pass --weights PATH or --weights none"
    )


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
