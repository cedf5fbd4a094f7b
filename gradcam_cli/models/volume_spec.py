"""How a volume model takes a scan: its windows' size, each channel's intensity normalisation, the spacing it was
trained at, as its family reads them (an nnU-Net plans file, a MONAI bundle's inference config).

:class:`VolumeSpec` is what a volume model's :class:`~gradcam_cli.models.profile.ModelProfile` carries as ``volume``;
:meth:`VolumeSpec.normalise` turns a (C, D, H, W) scan, as read, into what the network takes. Nothing here resamples:
``spacing`` is the model's, for the caller to compare with the scan's and say so.

Intensity schemes (:class:`Intensity`), each nnU-Net's or MONAI's transform of the same name:

- ``zscore``: (x - mean) / max(std, 1e-8) with the scan's own mean and (population) std (nnU-Net's
  ``ZScoreNormalization``; MONAI's ``NormalizeIntensity``); ``nonzero``: over the voxels where any channel is
  non-zero only, the others left as they are (nnU-Net's ``use_mask_for_norm``, without its hole filling).
- ``ct``: clipped to [low, high], then (x - mean) / max(std, 1e-8) with the dataset's foreground statistics
  (nnU-Net's ``CTNormalization``: its plans' ``percentile_00_5``, ``percentile_99_5``, ``mean``, ``std``).
- ``range``: [low, high] mapped linearly onto [lower, upper], clipped there with ``clip`` (MONAI's
  ``ScaleIntensityRange``: ``a_min``, ``a_max``, ``b_min``, ``b_max``).
- ``minmax``: the scan's own [min, max] onto [lower, upper] (nnU-Net's ``RescaleTo01Normalization``, MONAI's
  ``ScaleIntensity``); ``rgb``: x / 255 (nnU-Net's ``RGBTo0_1Normalization``); ``none``: as read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UsageError

SCHEMES = ("zscore", "ct", "range", "minmax", "rgb", "none")
STD_FLOOR = 1e-8
"""The smallest std a z-score divides by (nnU-Net's)."""


@dataclass(frozen=True)
class Intensity:
    """One channel's normalisation (see the module docstring for each ``scheme``)."""

    scheme: str = "none"
    mean: float | None = None
    std: float | None = None
    low: float | None = None
    high: float | None = None
    lower: float = 0.0
    upper: float = 1.0
    clip: bool = True
    nonzero: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise UsageError(f"unknown intensity normalisation {self.scheme!r}; use {', '.join(SCHEMES)}")
        needs = {"ct": ("mean", "std", "low", "high"), "range": ("low", "high")}.get(self.scheme, ())
        missing = [name for name in needs if getattr(self, name) is None]
        if missing:
            raise UsageError(f"the {self.scheme} normalisation needs {', '.join(missing)}")

    def apply(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """One (D, H, W) channel normalised, as float32; ``mask``: the voxels a ``nonzero`` z-score reads."""
        x = x.float()
        if self.scheme == "zscore":
            inside = x[mask] if self.nonzero and mask is not None else x
            mean, std = inside.double().mean(), inside.double().std(correction=0)
            scaled = ((x.double() - mean) / max(float(std), STD_FLOOR)).float()
            return torch.where(mask, scaled, x) if self.nonzero and mask is not None else scaled
        if self.scheme == "ct":
            assert self.mean is not None and self.std is not None and self.low is not None and self.high is not None
            return x.clamp(self.low, self.high).sub_(self.mean).div_(max(self.std, STD_FLOOR))  # one new tensor
        if self.scheme in ("range", "minmax"):
            low = float(x.min()) if self.low is None else self.low
            high = float(x.max()) if self.high is None else self.high
            span = high - low
            scaled = x - low  # one new tensor, scaled in place
            if span:
                scaled.div_(span).mul_(self.upper - self.lower)
            scaled.add_(self.lower)
            return scaled.clamp_(self.lower, self.upper) if self.clip and self.scheme == "range" else scaled
        if self.scheme == "rgb":
            return x / 255.0
        return x

    def describe(self) -> str:
        """A few words: ``zscore``, ``ct [-1000, 1200], mean 80.1 std 150.2``, ``range [-57, 164] -> [0, 1]``."""
        if self.scheme == "ct":
            return f"ct [{self.low:g}, {self.high:g}], mean {self.mean:g} std {self.std:g}"
        if self.scheme == "range":
            return f"range [{self.low:g}, {self.high:g}] -> [{self.lower:g}, {self.upper:g}]"
        return self.scheme + (" (non-zero voxels)" if self.nonzero else "")


@dataclass(frozen=True)
class VolumeSpec:
    """A volume model's input: ``patch`` (D, H, W) windows, ``step`` between them as a fraction of the patch, one
    :class:`Intensity` per channel (``channel_names``: what each is, ``CT``, ``T1``), the ``spacing`` (mm, in the
    model's axis order) it was trained at, ``transpose``: the axis order it takes the scan's axes in (nnU-Net's
    ``transpose_forward``); ``source``: where these facts were read; ``itk``: it reads scans as SimpleITK arrays
    (nnU-Net's ``SimpleITKIO``), a NIfTI's axes reversed (:meth:`axes`)."""

    patch: tuple[int, ...]
    intensities: tuple[Intensity, ...] = (Intensity(),)
    channel_names: tuple[str, ...] = ()
    spacing: tuple[float, ...] | None = None
    step: float = 0.5
    transpose: tuple[int, ...] | None = None
    source: str = ""
    itk: bool = False

    def axes(self, nifti: bool) -> tuple[int, ...]:
        """The scan's voxel axes (as read: a NIfTI's nibabel order) in the order the network takes them: reversed
        for a NIfTI where the model reads SimpleITK arrays (``itk``: SimpleITK's array order is nibabel's reversed;
        a DICOM series is read in that order already, (slice, row, column)), then ``transpose``."""
        order = (2, 1, 0) if self.itk and nifti else (0, 1, 2)
        return tuple(order[axis] for axis in self.transpose) if self.transpose else order

    @property
    def channels(self) -> int:
        return len(self.intensities)

    def normalise(self, volume: torch.Tensor) -> torch.Tensor:
        """A (C, D, H, W) scan as the network takes it (float32): each channel by its :class:`Intensity`."""
        if volume.dim() != 4 or volume.shape[0] != self.channels:
            shape = "x".join(map(str, volume.shape))
            raise UsageError(f"the model takes {self.channels}-channel (C, D, H, W) volumes, not {shape}")
        mask = (volume != 0).any(dim=0) if any(i.nonzero for i in self.intensities) else None
        if len(volume) == 1:  # no stacked copy of a large scan
            return self.intensities[0].apply(volume[0], mask)[None]
        return torch.stack(
            [intensity.apply(channel, mask) for intensity, channel in zip(self.intensities, volume, strict=True)]
        )
