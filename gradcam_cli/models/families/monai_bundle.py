"""MONAI bundle folders (``--model bundle:DIR``, or a folder holding ``configs/inference.json`` or ``.yaml``).

A bundle (MONAI's model zoo format) holds ``configs/inference.json`` (or ``.yaml``), ``configs/metadata.json`` and
``models/model.pt``. Its config is read with MONAI's own ``ConfigParser`` (``bundle_root`` set to the folder) and
only ``network_def`` is instantiated: its ``$`` expressions are Python, run as MONAI runs them, so load only bundles
you trust (as a ``file.py:factory``). The weights are ``models/model.pt`` (or ``--weights FILE``), a state dict read
with ``torch.load(weights_only=True)``; TorchScript bundles (``model.ts``) are not taken.

The profile carries, from the config: the window (``inferer``'s ``roi_size``; its ``overlap`` as the step, 1 -
overlap), the intensity normalisation of ``preprocessing``'s transforms (:mod:`gradcam_cli.models.volume_spec`:
``ScaleIntensityRange(d)`` as ``range``, ``NormalizeIntensity(d)`` as ``zscore``, ``ScaleIntensity(d)`` as
``minmax``; the others, such as ``Orientationd``, are not applied) and ``Spacingd``'s ``pixdim`` as the spacing;
from the metadata, the class names (``network_data_format.outputs.pred.channel_def``) and the input channels. A
bundle whose output is no image (``outputs.pred.type``) is a classifier, explained on the whole volume.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from torch import nn

from ...errors import ModelLoadError, UsageError, describe
from ...io.images import InputSpec
from ...options import ModelOptions
from ..profile import LoadedModel, ModelProfile
from ..tasks import CLASSIFY, SEGMENT
from ..volume_spec import Intensity, VolumeSpec
from ..weights import apply_state_dict, load_state_dict_file
from .base import Family, chosen_task

CONFIGS = ("inference.json", "inference.yaml", "inference.yml")
WEIGHTS = Path("models") / "model.pt"
DEFAULT_PATCH = (96, 96, 96)
"""The window of a bundle whose config names none (no ``inferer#roi_size``, no metadata ``spatial_shape``)."""


def bundle_config(path: Path) -> Path | None:
    """The bundle's inference config, if ``path`` is a bundle folder."""
    return next((path / "configs" / name for name in CONFIGS if (path / "configs" / name).is_file()), None)


class MonaiBundle(Family):
    name = "monai-bundle"
    prefix = "bundle:"

    def claims(self, model: str) -> bool:
        return model.startswith(self.prefix) or (Path(model).is_dir() and bundle_config(Path(model)) is not None)

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        folder = Path(options.model.removeprefix(self.prefix))
        config = bundle_config(folder)
        if config is None:
            raise UsageError(f"{folder} is not a MONAI bundle folder: it has no configs/inference.json or .yaml")
        parser = _parser(folder, config)
        network = _parsed(parser, "network_def")
        if not isinstance(network, nn.Module):
            raise ModelLoadError(f"{config}'s network_def is {type(network).__name__}, not a torch.nn.Module")
        weights = "none"
        if not architecture_only:
            given = options.weights.upper() not in ("DEFAULT", "NONE")
            path = Path(options.weights) if given else folder / WEIGHTS
            if not path.is_file():
                raise UsageError(f"bundle weights {path} do not exist; pass --weights FILE (a state dict)")
            apply_state_dict(network, load_state_dict_file(path), path)
            weights = str(path)
        meta = parser.get("_meta_", {}) or {}
        formats = meta.get("network_data_format", {})
        pred = formats.get("outputs", {}).get("pred", {})
        image = formats.get("inputs", {}).get("image", {})
        channels = int(image.get("num_channels") or _parsed(parser, "network_def#in_channels", 1))
        patch = _patch(parser, image)
        overlap = float(_parsed(parser, "inferer#overlap", 0.5))
        target = str(parser.get("network_def#_target_", type(network).__name__))
        volume = VolumeSpec(
            patch,
            (_intensity(parser),) * channels,
            spacing=_spacing(parser),
            step=max(1.0 - overlap, 1e-3),
            source=f"MONAI bundle {folder} ({target.rsplit('.', 1)[-1]})",
        )
        names = pred.get("channel_def") or {}
        labels = [str(names[key]) for key in sorted(names, key=int)] if isinstance(names, dict) and names else None
        own = SEGMENT if pred.get("type", "image") == "image" else CLASSIFY
        profile = ModelProfile(InputSpec(shape=(channels, *patch)), labels, chosen_task(options, own), volume=volume)
        return LoadedModel(network, options.model, weights, profile=profile)


def _parser(folder: Path, config: Path) -> Any:
    if importlib.util.find_spec("monai") is None:
        raise UsageError("MONAI bundles need monai: pip install 'gradcam-cli[medical]'")
    from monai.bundle.config_parser import ConfigParser

    parser = ConfigParser()
    try:
        parser.read_config(str(config))
        metadata = folder / "configs" / "metadata.json"
        if metadata.is_file():
            parser.read_meta(str(metadata))
    except Exception as error:
        raise ModelLoadError(f"cannot read bundle config {config}: {describe(error)}") from error
    parser["bundle_root"] = str(folder)
    return parser


def _parsed(parser: Any, key: str, default: Any = None) -> Any:
    """``key``'s content, references and expressions resolved; ``default`` where the config has no such key."""
    if parser.get(key) is None:
        if default is None:
            raise ModelLoadError(f"the bundle's inference config has no {key.replace('#', '.')}")
        return default
    try:
        return parser.get_parsed_content(key)
    except Exception as error:
        raise ModelLoadError(f"the bundle's {key.replace('#', '.')} fails: {describe(error)}") from error


def _patch(parser: Any, image: dict[str, Any]) -> tuple[int, ...]:
    roi = _parsed(parser, "inferer#roi_size", ()) or image.get("spatial_shape") or DEFAULT_PATCH
    if not all(isinstance(side, int) for side in roi):  # metadata's "spatial_shape" may hold "16*n"
        return DEFAULT_PATCH
    return tuple(int(side) for side in roi)


def _transforms(parser: Any) -> list[tuple[str, str]]:
    """(id, short class name) of each of ``preprocessing``'s transforms."""
    found = []
    for index, transform in enumerate(parser.get("preprocessing#transforms", []) or []):
        if isinstance(transform, dict) and isinstance(transform.get("_target_"), str):
            found.append((f"preprocessing#transforms#{index}", transform["_target_"].rsplit(".", 1)[-1]))
    return found


def _intensity(parser: Any) -> Intensity:
    """The intensity normalisation among the preprocessing transforms (the last one found); none: as read."""
    chosen = Intensity()
    for key, name in _transforms(parser):
        name = name.removesuffix("d")

        def value(field: str, default: Any, key: str = key) -> Any:
            return _parsed(parser, f"{key}#{field}", default)

        if name == "ScaleIntensityRange":
            low, high = float(value("a_min", None)), float(value("a_max", None))
            lower, upper = float(value("b_min", 0.0)), float(value("b_max", 1.0))
            chosen = Intensity("range", low=low, high=high, lower=lower, upper=upper, clip=bool(value("clip", False)))
        elif name == "NormalizeIntensity":
            chosen = Intensity("zscore", nonzero=bool(value("nonzero", False)))
        elif name == "ScaleIntensity":
            chosen = Intensity("minmax", lower=float(value("minv", 0.0)), upper=float(value("maxv", 1.0)))
    return chosen


def _spacing(parser: Any) -> tuple[float, ...] | None:
    for key, name in _transforms(parser):
        if name in ("Spacingd", "Spacing"):
            pixdim = _parsed(parser, f"{key}#pixdim", ())
            return tuple(float(side) for side in pixdim) or None
    return None
