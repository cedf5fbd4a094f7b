"""nnU-Net v2 trained model folders (``--model nnunet:DIR``, or a folder holding ``plans.json`` and ``dataset.json``).

A trained model folder (``Dataset001_X/nnUNetTrainer__nnUNetPlans__3d_fullres``) holds the plans, the dataset
description and one folder per fold (``fold_0`` ... ``fold_4``, ``fold_all``) with ``checkpoint_final.pth``. The
model loaded is one fold's: the folder's lowest-numbered one with a final checkpoint, or the fold folder named
(``nnunet:DIR/fold_2``); ``--weights FILE`` reads another checkpoint of that format instead.

The network is built as nnU-Net builds it (``get_network_from_plans``): the configuration named by the folder (its
name's last ``__`` part; else ``3d_fullres``), its inheritance resolved, the class and keyword arguments of its
``architecture`` (``dynamic_network_architectures``' classes and ``torch.nn``'s operations only: the plans are data,
never code), deep supervision off, the checkpoint's ``network_weights`` read with ``torch.load(weights_only=True)``.
The profile carries the configuration's patch size and spacing, each channel's normalisation
(:mod:`gradcam_cli.models.volume_spec`: ``ZScoreNormalization``, ``CTNormalization`` with the plans'
``foreground_intensity_properties_per_channel``, ...), ``transpose_forward``, the labels of ``dataset.json`` as class
names, and the bottleneck (``encoder.stages.<last>``) as the default layer. dynamic_network_architectures is imported
only here, when such a folder is loaded.
"""

from __future__ import annotations

import importlib.util
import json
import pydoc
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ...errors import ModelLoadError, UsageError, describe
from ...io.images import InputSpec
from ...options import ModelOptions
from ..profile import LoadedModel, ModelProfile
from ..tasks import SEGMENT
from ..volume_spec import Intensity, VolumeSpec
from ..weights import apply_state_dict
from .base import Family, chosen_task

FILES = ("plans.json", "dataset.json")
CHECKPOINT = "checkpoint_final.pth"
FOLD = re.compile(r"fold_(\d+|all)$")
CLASS_PREFIX = "dynamic_network_architectures."
IMPORTABLE = (CLASS_PREFIX, "torch.nn.")
"""What a plans file's names may import: its network class, and its operations (``conv_op``, ``norm_op``, ...)."""
SCHEMES = {
    "ZScoreNormalization": "zscore",
    "CTNormalization": "ct",
    "NoNormalization": "none",
    "RescaleTo01Normalization": "minmax",
    "RGBTo0_1Normalization": "rgb",
}


def is_model_folder(path: Path) -> bool:
    """A trained model folder (its plans and dataset description), or one of its fold folders."""
    return path.is_dir() and any(all((folder / name).is_file() for name in FILES) for folder in (path, path.parent))


class NnUNet(Family):
    name = "nnunet"
    prefix = "nnunet:"

    def claims(self, model: str) -> bool:
        return model.startswith(self.prefix) or is_model_folder(Path(model))

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        folder, fold = model_folders(options.model.removeprefix(self.prefix))
        plans, dataset = read_json(folder / "plans.json"), read_json(folder / "dataset.json")
        name = configuration_name(folder, plans)
        configuration = resolved_configuration(plans, name)
        labels, channels = class_names(dataset), channel_names(dataset)
        network = build_network(configuration, len(channels), len(labels))
        weights = "none"
        if not architecture_only:
            given = options.weights.upper() not in ("DEFAULT", "NONE")
            checkpoint = Path(options.weights) if given else fold / CHECKPOINT
            apply_state_dict(network, checkpoint_weights(checkpoint), checkpoint)
            weights = str(checkpoint)
        patch = tuple(int(side) for side in configuration["patch_size"])
        volume = VolumeSpec(
            patch,
            intensities(plans, configuration, len(channels)),
            tuple(channels),
            tuple(float(s) for s in configuration.get("spacing", ())) or None,
            transpose=tuple(plans.get("transpose_forward", ())) or None,
            source=f"nnU-Net plans {folder / 'plans.json'} ({name})",
            itk=not str(dataset.get("overwrite_image_reader_writer", "")).startswith("Nibabel"),
        )
        stages = getattr(getattr(network, "encoder", None), "stages", None)
        bottleneck = (f"encoder.stages.{len(stages) - 1}",) if isinstance(stages, nn.Sequential) else ()
        profile = ModelProfile(
            InputSpec(shape=(len(channels), *patch)),
            labels,
            chosen_task(options, SEGMENT),
            default_layers=bottleneck,
            volume=volume,
        )
        return LoadedModel(network, options.model, weights, profile=profile)


def model_folders(spec: str) -> tuple[Path, Path]:
    """(the trained model folder, the fold folder) ``spec`` names."""
    path = Path(spec)
    if not path.is_dir():
        raise UsageError(f"nnU-Net model folder {spec} does not exist")
    if FOLD.match(path.name) and all((path.parent / name).is_file() for name in FILES):
        return path.parent, path
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing:
        raise UsageError(f"{spec} is not an nnU-Net trained model folder: it has no {' or '.join(missing)}")
    folds = sorted(
        (p for p in path.iterdir() if FOLD.match(p.name) and (p / CHECKPOINT).is_file()),
        key=lambda p: (p.name == "fold_all", int(p.name[5:]) if p.name[5:].isdigit() else 0),
    )
    if not folds:
        raise UsageError(f"{spec} has no fold_N/{CHECKPOINT}; name a fold folder or pass --weights CHECKPOINT")
    return path, folds[0]


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read {path}: {describe(error)}") from error
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def configuration_name(folder: Path, plans: dict[str, Any]) -> str:
    """The configuration a trained model folder is of: its name's last ``__`` part (``3d_fullres``)."""
    named = folder.name.split("__")[-1]
    configurations = plans.get("configurations", {})
    if named in configurations:
        return named
    if "3d_fullres" in configurations:
        return "3d_fullres"
    raise ModelLoadError(f"{folder} names no configuration of its plans ({', '.join(configurations) or 'none'})")


def resolved_configuration(plans: dict[str, Any], name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Configuration ``name`` with what it ``inherits_from`` filled in (nnU-Net's ``PlansManager``)."""
    configuration = dict(plans["configurations"][name])
    parent = configuration.pop("inherits_from", None)
    if parent is None:
        return configuration
    if parent in seen or parent not in plans["configurations"]:
        raise ModelLoadError(f"configuration {name} inherits from {parent}, which cannot be resolved")
    return {**resolved_configuration(plans, parent, (*seen, name)), **configuration}


def class_names(dataset: dict[str, Any]) -> list[str]:
    """dataset.json's labels in index order (``{"background": 0, "liver": 1}``); region-based labels refused."""
    labels = dataset.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise ModelLoadError("dataset.json has no labels")
    if any(not isinstance(value, int) for value in labels.values()):
        raise UsageError("this nnU-Net model is trained on regions (labels with several values): not supported yet")
    by_index = {int(value): str(name) for name, value in labels.items()}
    if sorted(by_index) != list(range(len(by_index))):
        raise ModelLoadError(f"dataset.json's labels are not 0 to {len(by_index) - 1}: {sorted(by_index)}")
    return [by_index[i] for i in range(len(by_index))]


def channel_names(dataset: dict[str, Any]) -> list[str]:
    """dataset.json's input channels in order (``channel_names``, formerly ``modality``)."""
    channels = dataset.get("channel_names", dataset.get("modality"))
    if not isinstance(channels, dict) or not channels:
        raise ModelLoadError("dataset.json has no channel_names")
    return [str(channels[key]) for key in sorted(channels, key=int)]


def intensities(plans: dict[str, Any], configuration: dict[str, Any], channels: int) -> tuple[Intensity, ...]:
    """Each channel's normalisation from the configuration's schemes and the plans' intensity properties."""
    schemes = configuration.get("normalization_schemes", ["ZScoreNormalization"] * channels)
    masks = configuration.get("use_mask_for_norm", [False] * channels)
    properties = plans.get("foreground_intensity_properties_per_channel", {})
    found = []
    for channel, (scheme, masked) in enumerate(zip(schemes, masks, strict=True)):
        if scheme not in SCHEMES:
            raise UsageError(f"nnU-Net normalisation {scheme} is not supported; use {', '.join(SCHEMES)}")
        if SCHEMES[scheme] != "ct":
            found.append(Intensity(SCHEMES[scheme], nonzero=bool(masked)))
            continue
        p = properties.get(str(channel))
        if not isinstance(p, dict):
            raise ModelLoadError(f"the plans have no foreground intensity properties for channel {channel}")
        found.append(Intensity("ct", p["mean"], p["std"], p["percentile_00_5"], p["percentile_99_5"]))
    if len(found) != channels:
        raise ModelLoadError(f"the plans normalise {len(found)} channels; dataset.json has {channels}")
    return tuple(found)


def _located(name: object, allowed: tuple[str, ...]) -> Any:
    if not isinstance(name, str) or not name.startswith(allowed):
        raise UsageError(f"the plans name {name!r}; only {' and '.join(allowed)} names are imported from plans")
    found = pydoc.locate(name)
    if found is None:
        raise ModelLoadError(f"the plans name {name}, which cannot be imported here")
    return found


def build_network(configuration: dict[str, Any], channels: int, classes: int) -> nn.Module:
    """The configuration's network, as nnU-Net's ``get_network_from_plans`` builds it, without deep supervision."""
    if importlib.util.find_spec("dynamic_network_architectures") is None:
        raise UsageError("nnU-Net models need dynamic_network_architectures: pip install 'gradcam-cli[medical]'")
    architecture = configuration.get("architecture")
    if not isinstance(architecture, dict):
        raise UsageError("these nnU-Net plans predate the 'architecture' entry (nnU-Net < 2.4): re-plan or upgrade")
    kwargs = dict(architecture["arch_kwargs"])
    for key in architecture.get("_kw_requires_import", ()):
        if kwargs.get(key) is not None:
            kwargs[key] = _located(kwargs[key], IMPORTABLE)
    network_class = _located(architecture["network_class_name"], (CLASS_PREFIX,))
    kwargs["deep_supervision"] = False
    try:
        network: nn.Module = network_class(input_channels=channels, num_classes=classes, **kwargs)
    except Exception as error:
        raise ModelLoadError(f"building {architecture['network_class_name']} failed: {describe(error)}") from error
    return network


def checkpoint_weights(path: Path) -> dict[str, torch.Tensor]:
    """An nnU-Net checkpoint's ``network_weights`` (``torch.load(weights_only=True)``, the numpy scalars of its
    training log allowed), without ``module.`` and ``_orig_mod.`` prefixes (DDP, ``torch.compile``)."""
    import numpy as np

    if not path.is_file():
        raise UsageError(f"checkpoint {path} does not exist")
    scalar = getattr(np, "_core", np.core).multiarray.scalar
    allowed = [scalar, np.dtype, *{type(np.dtype(kind)) for kind in (np.float64, np.float32, np.int64, np.bool_)}]
    try:
        with torch.serialization.safe_globals(allowed):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ModelLoadError(f"cannot read nnU-Net checkpoint {path}: {describe(error)}") from error
    weights = checkpoint.get("network_weights") if isinstance(checkpoint, dict) else None
    if not isinstance(weights, dict):
        raise ModelLoadError(f"{path} is not an nnU-Net checkpoint: it has no network_weights")
    return {key.removeprefix("module.").removeprefix("_orig_mod."): value for key, value in weights.items()}
