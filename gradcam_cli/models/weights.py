"""Reading weights: state-dict files (``weights_only=True`` only, or safetensors), torchvision's cache, and why
loading failed."""

from __future__ import annotations

import os
import pickle
import re
import struct
import sys
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelLoadError, UsageError, describe

SAVE_HINT = "pass a file saved with torch.save(model.state_dict(), PATH)"
"""What every 'this file is not weights' message ends with."""
SAVE_AGAIN = "save it again with torch.save(model.state_dict(), PATH)"

TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
"""How a file written by torch.save(..., _use_new_zipfile_serialization=False) begins: a pickled magic number."""

SHOWN_KEYS = 3
"""How many missing, unexpected or mismatched names a mismatch message lists before counting the rest."""


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from disk: a ``torch.save`` file read with ``weights_only=True``, or a safetensors file (found
    by its content, whatever its name), which holds nothing but tensors by construction. Unwraps
    {'state_dict': ...} and 'module.' prefixes.

    A file that is not a state dict fails with one sentence saying what the file is and what to pass instead.
    """
    _check_weights_path(path)
    if _looks_like_safetensors(path, _file_start(path)):
        return _unwrapped(read_safetensors(path))
    try:
        with warnings.catch_warnings():  # e.g. torch's "Detected pickle protocol 4" UserWarning: the error says it
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ModelLoadError(_load_failure(path, error)) from error
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    _check_state_dict(path, state)
    return _unwrapped(state)


def _unwrapped(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the 'module.' prefix ``DataParallel`` puts on every key."""
    if state and all(k.startswith("module.") for k in state):
        return {k.removeprefix("module."): v for k, v in state.items()}
    return state


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, on the CPU: a JSON header and raw tensor bytes, no pickled objects."""
    try:
        from safetensors.torch import load_file
    except ImportError as error:
        raise ModelLoadError(
            f"weights file {path} is in the safetensors format: install the safetensors package "
            f"(pip install safetensors) to read it, or {SAVE_HINT}"
        ) from error
    try:
        return load_file(str(path), device="cpu")
    except Exception as error:
        raise ModelLoadError(
            f"weights file {path} is a safetensors file that cannot be read ({describe(error, path)}); "
            f"save it again with safetensors.torch.save_file(model.state_dict(), PATH)"
        ) from error


def _check_weights_path(path: str | Path) -> None:
    """Usage mistakes (no such file, a folder, no permission) before torch sees the path; an empty file."""
    try:
        info = os.stat(path)
    except FileNotFoundError as error:
        raise UsageError(
            f"weights file {path} does not exist; pass a state-dict file, a weights name such as DEFAULT, or none"
        ) from error
    except OSError as error:
        raise UsageError(f"cannot read weights file {path}: {describe(error, path)}") from error
    if os.path.isdir(path):
        raise UsageError(f"weights file {path} is a folder; pass the state-dict file (e.g. a .pth file) itself")
    if not os.access(path, os.R_OK):
        raise UsageError(f"cannot read weights file {path}: permission denied")
    if info.st_size == 0:
        raise ModelLoadError(f"weights file {path} is empty (0 bytes); {SAVE_HINT}")


def _load_failure(path: str | Path, error: Exception) -> str:
    """Why torch.load could not read ``path``, from what the file looks like: one sentence with what to do."""
    start = _file_start(path)
    refused = _refused_global(error)
    if refused is not None:
        return (
            f"weights file {path} is not a plain state dict of tensors: it holds a pickled {refused}, and weights "
            f"are loaded with weights_only=True, which refuses pickled Python objects; save model.state_dict() instead"
        )
    if start.startswith(b"PK\x03\x04"):
        if not zipfile.is_zipfile(path):
            return f"weights file {path} is cut short or damaged (its zip archive has no end); {SAVE_AGAIN}"
        with zipfile.ZipFile(path) as archive:
            written_by_torch = any(name.endswith("data.pkl") for name in archive.namelist())
        if not written_by_torch:
            return f"weights file {path} is a zip archive but not one written by torch.save; {SAVE_HINT}"
        return f"weights file {path} is a torch.save archive that cannot be read ({describe(error, path)}); {SAVE_HINT}"
    if start.startswith(TORCH_LEGACY_MAGIC):
        return f"weights file {path} is cut short or damaged (torch.save's old format); {SAVE_AGAIN}"
    if start[:1] == b"\x80" and start[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return f"weights file {path} is a plain Python pickle, not a file written by torch.save; {SAVE_HINT}"
    if _is_text(start):
        return f"weights file {path} is a text file, not PyTorch weights; {SAVE_HINT}"
    return f"weights file {path} is not in a format PyTorch can load (not a torch.save file); {SAVE_HINT}"


def _file_start(path: str | Path, size: int = 512) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read(size)
    except OSError:
        return b""


def _refused_global(error: Exception) -> str | None:
    """The Python class or function a weights_only load refused (e.g. torch.nn.modules.linear.Linear), if any."""
    if not isinstance(error, pickle.UnpicklingError):
        return None
    found = re.search(r"GLOBAL ([\w.]+)|safe_globals\(\[([\w.]+)\]\)", str(error))
    return (found.group(1) or found.group(2)) if found else None


def _looks_like_safetensors(path: str | Path, start: bytes) -> bool:
    """safetensors: an 8-byte little-endian header length, then a JSON header."""
    if str(path).endswith(".safetensors"):
        return True
    if len(start) < 9:
        return False
    (header,) = struct.unpack("<Q", start[:8])
    return start[8:9] == b"{" and header < os.path.getsize(path)


def _is_text(start: bytes) -> bool:
    for cut in range(4):  # the read may end inside a character
        try:
            text = start[: len(start) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return bool(text) and all(ch.isprintable() or ch in "\r\n\t" for ch in text)
    return False


def _check_state_dict(path: str | Path, state: object) -> None:
    """A state dict maps parameter names to tensors; say what the file holds instead, and where to look."""
    if not isinstance(state, Mapping):
        held = {torch.Tensor: "a single tensor", list: "a list", tuple: "a tuple"}
        what = next((text for kind, text in held.items() if isinstance(state, kind)), _a(type(state).__name__))
        raise ModelLoadError(f"weights file {path} holds {what}, not a state dict; save model.state_dict() instead")
    for key, value in state.items():
        if isinstance(value, torch.Tensor) or str(key).endswith("_extra_state"):
            continue
        nested = [k for k, v in state.items() if isinstance(v, Mapping) and _all_tensors(v)]
        if nested:
            raise ModelLoadError(
                f"weights file {path} holds a checkpoint (keys {_listed(list(state))}), not a state dict; the weights "
                f"look to be under {nested[0]!r}: save them with torch.save(checkpoint[{nested[0]!r}], PATH)"
            )
        raise ModelLoadError(
            f"weights file {path} is not a state dict: its entry {key!r} is {_a(type(value).__name__)}, not a tensor; "
            f"save model.state_dict() instead"
        )


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _all_tensors(mapping: Mapping[Any, Any]) -> bool:
    return bool(mapping) and all(isinstance(v, torch.Tensor) for v in mapping.values())


def apply_state_dict(module: nn.Module, state: dict[str, torch.Tensor], source: str | Path) -> None:
    """Load ``state`` strictly; a mismatch names the first missing and unexpected keys and size mismatches."""
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ModelLoadError(
            f"weights file {source} does not fit the model: {state_dict_mismatch(module, state) or describe(error)}; "
            "check --model and --num-classes"
        ) from error


def state_dict_mismatch(module: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """What differs between ``state`` and ``module``'s own state dict, in a few words ('' when nothing does)."""
    own = module.state_dict()
    missing = [key for key in own if key not in state]
    unexpected = [key for key in state if key not in own]
    resized = [
        f"{key}: file {_shape(value)} vs model {_shape(own[key])}"
        for key, value in state.items()
        if key in own and isinstance(value, torch.Tensor) and value.shape != own[key].shape
    ]
    parts = [
        f"{len(names)} {label}{'' if len(names) == 1 else plural} ({_listed(names)})"
        for label, plural, names in (
            ("size mismatch", "es", resized),
            ("missing key", "s", missing),
            ("unexpected key", "s", unexpected),
        )
        if names
    ]
    return "; ".join(parts)


def _listed(names: list[str]) -> str:
    shown = ", ".join(str(name) for name in names[:SHOWN_KEYS])
    return f"{shown} and {len(names) - SHOWN_KEYS} more" if len(names) > SHOWN_KEYS else shown


def _shape(tensor: torch.Tensor) -> str:
    return "x".join(str(size) for size in tensor.shape) or "a scalar"


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
    WeightsEnum.get_state_dict = get_state_dict
    try:
        yield
    finally:
        WeightsEnum.get_state_dict = original


class _NoWeights(dict[str, Any]):
    """What torchvision's builders are handed instead of a checkpoint under :func:`torchvision_architecture_only`."""


@contextmanager
def torchvision_architecture_only() -> Iterator[None]:
    """Within, torchvision's builders build the model their weights describe (class count, image size, auxiliary
    heads, whatever the builder derives from the weights) but download and load nothing: the parameters keep their
    random initialisation. For ``--list-layers``, which needs the architecture only."""
    from torch.nn.modules.module import _IncompatibleKeys
    from torchvision.models._api import WeightsEnum

    def get_state_dict(self: WeightsEnum, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return _NoWeights()

    def load_state_dict(module: nn.Module, state_dict: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        if isinstance(state_dict, _NoWeights):
            return _IncompatibleKeys([], [])
        return original_load(module, state_dict, *args, **kwargs)

    original_get, original_load = WeightsEnum.get_state_dict, nn.Module.load_state_dict
    WeightsEnum.get_state_dict = get_state_dict
    setattr(nn.Module, "load_state_dict", load_state_dict)  # noqa: B010 (mypy refuses assigning to a method)
    try:
        yield
    finally:
        WeightsEnum.get_state_dict = original_get
        setattr(nn.Module, "load_state_dict", original_load)  # noqa: B010


def weights_cache_path(weights: Any) -> Path:
    """Where torchvision looks for ``weights`` before downloading: $TORCH_HOME/hub/checkpoints/<file>."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def weights_failure(name: str, weights: Any, error: Exception) -> str:
    path = weights_cache_path(weights)
    if path.exists():
        return (
            f"cannot load the cached {weights.name} weights for {name} from {path} ({describe(error, path)}); "
            "delete that file to download it again, or pass --weights PATH or --weights none"
        )
    return (
        f"could not download the {weights.name} weights for {name} ({describe(error)}); "
        f"to work offline, copy {path.name} into {path.parent} (or set TORCH_HOME), "
        f"or pass --weights PATH or --weights none"
    )
