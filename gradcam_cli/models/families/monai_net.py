"""MONAI networks by name (``--model monai:NAME``, docs/volumes.md "MONAI networks"), 3-D classifiers and
segmenters, built from ``monai.networks.nets`` with the arguments the spec gives, weights from ``--weights FILE`` (a
state dict, ``torch.load(weights_only=True)`` or safetensors).

``monai:UNet?in_channels=1&out_channels=3&channels=8,16,32&strides=2,2``: after ``?``, ``name=value`` pairs joined by
``&``; a value is read as JSON where it is JSON (``3``, ``0.1``, ``true``, ``[2, 2]``), a comma-separated list as a
tuple of such values (``1,``: one element), anything else as text (``norm=batch``). ``spatial_dims`` is 3 unless given.

A profile, a JSON file named by the spec's ``profile=FILE``, else ``WEIGHTS.json`` beside the weights file
(``model.pt``: ``model.json``), says how the network takes a scan::

    {"network": {"in_channels": 1, "out_channels": 3, "channels": [8, 16, 32], "strides": [2, 2]},
     "patch": [96, 96, 96], "step": 0.5, "spacing": [1.5, 1.5, 2.0],
     "intensity": {"scheme": "range", "low": -57, "high": 164, "lower": 0, "upper": 1, "clip": true},
     "labels": ["background", "liver", "tumour"]}

every key optional: ``network``, the network's arguments (the spec's override them); ``patch``, a segmenter's sliding
window (default 96^3) or the size a classifier's whole volume is resized to (none: the volume as it is); ``step``
between windows (a fraction of the patch); ``intensity``, one :class:`~gradcam_cli.models.volume_spec.Intensity`
(its fields; or a list, one per channel; default: as read); ``labels``, the class names; ``spacing``, the spacing
(mm) the network was trained at (said, never resampled to).
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from torch import nn

from ...errors import ModelLoadError, UsageError, describe
from ...io.images import InputSpec
from ...options import ModelOptions
from ..profile import LoadedModel, ModelProfile
from ..tasks import CLASSIFY, SEGMENT
from ..volume_spec import Intensity, VolumeSpec
from ..weights import apply_state_dict, load_state_dict_file
from .base import Family, chosen_task

CLASSIFIERS = (
    "DenseNet121",
    "DenseNet169",
    "DenseNet201",
    "DenseNet264",
    "ResNet",
    "resnet10",
    "resnet18",
    "resnet34",
    "resnet50",
)
SEGMENTERS = ("UNet", "BasicUNet", "AttentionUnet", "SegResNet", "SwinUNETR", "UNETR", "DynUNet")
DEFAULT_PATCH = (96, 96, 96)
"""A segmenter's window where its profile names none."""
BOTTLENECKS = {"BasicUNet": "down_4", "SwinUNETR": "encoder10", "DynUNet": "bottleneck"}
"""A segmenter's default layer, its bottleneck (UNet's: its innermost ``submodule``; SegResNet's: its last
``down_layers``)."""
PROBE = (32, 32, 32)
"""The size of the dry pass that finds a whole-volume classifier's layers (its profile names no patch)."""


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME?key=value&...`` as (NAME, arguments), each value read as the module docstring says."""
    name, _, query = spec.partition("?")
    arguments = {key: _value(raw) for key, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False)}
    return name, arguments


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        pass
    if "," in raw:
        return tuple(_value(part) for part in raw.split(",") if part)
    return raw


def profile_of(weights: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """The profile (the spec's ``profile=FILE``, else ``WEIGHTS.json`` beside ``--weights``) and its path; ``{}``
    where there is none."""
    named = arguments.pop("profile", None)
    if named is not None:
        path = Path(str(named))
        if not path.is_file():
            raise UsageError(f"the MONAI network profile {path} does not exist")
    elif weights.upper() not in ("DEFAULT", "NONE") and Path(weights).with_suffix(".json").is_file():
        path = Path(weights).with_suffix(".json")
    else:
        return {}, None
    try:
        profile = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read the MONAI network profile {path}: {describe(error)}") from error
    if not isinstance(profile, dict):
        raise UsageError(f"the MONAI network profile {path} is not a JSON object")
    return profile, path


def _network(name: str, arguments: dict[str, Any]) -> nn.Module:
    if importlib.util.find_spec("monai") is None:
        raise UsageError("MONAI networks need monai: pip install 'gradcam-cli[medical]'")
    from monai.networks import nets

    known = (*CLASSIFIERS, *SEGMENTERS)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UsageError(f"unknown MONAI network {name!r}; {hint}monai: takes {', '.join(known)}")
    build = getattr(nets, name)
    taken = inspect.signature(build).parameters
    if "spatial_dims" in taken or any(p.kind is p.VAR_KEYWORD for p in taken.values()):
        arguments = {"spatial_dims": 3} | arguments
    try:
        network = build(**arguments)
    except Exception as error:
        raise ModelLoadError(f"cannot build MONAI's {name}: {describe(error)}") from error
    if not isinstance(network, nn.Module):
        raise ModelLoadError(f"MONAI's {name} is {type(network).__name__}, not a torch.nn.Module")
    return network


def _intensities(given: Any, channels: int) -> tuple[Intensity, ...]:
    """One :class:`Intensity` per channel from the profile's ``intensity`` (an object, or a list of them)."""
    if given is None:
        return (Intensity(),) * channels
    entries = given if isinstance(given, list) else [given] * channels
    if len(entries) != channels or not all(isinstance(entry, dict) for entry in entries):
        raise UsageError(f"a MONAI network profile's intensity is one object or a list of {channels}, one a channel")
    try:
        return tuple(Intensity(**entry) for entry in entries)
    except TypeError as error:
        raise UsageError(f"a MONAI network profile's intensity: {describe(error)}") from error


def bottleneck(name: str, network: nn.Module) -> tuple[str, ...]:
    """The segmenter's bottleneck as its default layer (:data:`BOTTLENECKS`); none for the others."""
    names = [key for key, _ in network.named_modules()]
    if name == "UNet":
        inner = [key for key in names if key.endswith(".submodule")]
        return (max(inner, key=len),) if inner else ()
    if name == "SegResNet":
        down = [key for key in names if key.count(".") == 1 and key.startswith("down_layers.")]
        return (down[-1],) if down else ()
    return (BOTTLENECKS[name],) if BOTTLENECKS.get(name) in names else ()


class MonaiNetwork(Family):
    name = "monai"
    prefix = "monai:"

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        name, arguments = parse_spec(options.model.removeprefix(self.prefix))
        profile, profile_path = profile_of(options.weights, arguments)
        network_arguments = dict(profile.get("network") or {}) | arguments
        network = _network(name, network_arguments).eval()
        weights = "random"
        if not architecture_only and options.weights.upper() not in ("DEFAULT", "NONE"):
            apply_state_dict(network, load_state_dict_file(options.weights), Path(options.weights))
            weights = options.weights
        elif not architecture_only and options.weights.upper() == "DEFAULT":
            raise UsageError(f"monai:{name} has no pretrained weights; pass --weights FILE (a state dict)")
        own = CLASSIFY if name in CLASSIFIERS else SEGMENT
        channels = int(network_arguments.get("in_channels") or network_arguments.get("n_input_channels") or 1)
        patch = tuple(int(side) for side in profile.get("patch") or (() if own == CLASSIFY else DEFAULT_PATCH))
        if patch and len(patch) != 3:
            raise UsageError(f"a MONAI network profile's patch is 3 sides (D, H, W), not {list(patch)}")
        spacing = profile.get("spacing")
        volume = VolumeSpec(
            patch,
            _intensities(profile.get("intensity"), channels),
            spacing=tuple(float(side) for side in spacing) if spacing else None,
            step=float(profile.get("step", 0.5)),
            source=f"MONAI {name}" + (f" (profile {profile_path})" if profile_path else ""),
        )
        labels = profile.get("labels")
        spec = InputSpec(shape=(channels, *(patch or PROBE)))
        task = chosen_task(options, own)
        names = [str(label) for label in labels] if labels else None
        layers = bottleneck(name, network) if own == SEGMENT else ()
        model_profile = ModelProfile(spec, names, task, volume=volume, default_layers=layers)
        return LoadedModel(network, options.model, weights, profile=model_profile)
