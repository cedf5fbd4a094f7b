"""``gradcam eval --masks DIR`` on scans (docs/volumes.md, "Evaluating maps on scans"): each scan's label mask found
as nnU-Net names its ``labelsTr``, and a map's pointing game, energy and Dice against the explained class's voxels.

- **The mask** of a scan ``CASE_0000.nii.gz`` (its channels ``CASE_0001``, ... beside it) or ``CASE.nii.gz`` (also
  ``.nii``, ``.npy``, a DICOM folder ``CASE``) is ``DIR/CASE.nii.gz``, else ``DIR/CASE.nii``, else ``DIR/CASE.npy``
  (the first found); a scan without one is scored for faithfulness only. It must be one channel on the scan's grid
  (shape and affine, as ``--target region:`` masks are), else that scan is an error row.
- **The class's voxels**: a mask whose values are only 0 and 1 is binary, its 1s the target whatever class is
  explained; otherwise the voxels whose label (rounded) is the explained class's index (nnU-Net's labels: 0 the
  background, 1, 2, ... the classes of dataset.json). A mask without a voxel of the class leaves the scan unscored
  against it (counted as a box no class matched).
- **Pointing**: a hit where the map's peak voxel (the first in C order among equal maxima) is one of the class's
  voxels (no ``--tolerance``: it is in an image's pixels). **Energy**: the share of the map's non-negative mass on
  them. **Dice** of the map's top region: its :data:`top` voxels as many as the mask has (in the map's order, ties in
  C order) against the mask, ``2 |top ∩ mask| / (|top| + |mask|)``: 1 where the map's highest voxels are exactly the
  object.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..cam.results import Prediction
from ..errors import ImageError, UsageError
from ..io.discovery import InputImage, case_name
from ..io.volumes import Volume, read_labels
from . import metrics
from .report import BoxScore

LABEL_SUFFIXES = (".nii.gz", ".nii", ".npy")
"""The label files' suffixes, in the order a scan's mask is looked for."""


def mask_file(folder: Path, scan: InputImage) -> Path | None:
    """``folder``'s label mask of ``scan`` (the module docstring); ``None``: it has none."""
    names = (folder / f"{case_name(scan.path)}{suffix}" for suffix in LABEL_SUFFIXES)
    return next((path for path in names if path.is_file()), None)


def class_voxels(path: Path, volume: Volume, index: int) -> np.ndarray:
    """The (I, J, K) voxels of class ``index`` in the label mask at ``path`` of ``volume`` (the module docstring);
    an :class:`ImageError` (that scan's error row) where it cannot be read or is not on the scan's grid."""
    try:
        labels = read_labels(path, volume, "label mask", ImageError)
    except UsageError as error:
        raise ImageError(str(error)) from None
    values = np.unique(labels)
    if np.isin(values, (0.0, 1.0)).all():
        return np.asarray(labels != 0)
    return np.asarray(np.rint(labels) == index)


def top(saliency: torch.Tensor, count: int) -> torch.Tensor:
    """The map's ``count`` highest voxels as a boolean mask of its shape (ties in C order)."""
    return metrics.importance_ranks(saliency) < count


def mask_scores(saliency: torch.Tensor, inside: torch.Tensor, target: Prediction) -> tuple[BoxScore, float]:
    """The map's pointing game and energy on the class's voxels ``inside`` (a :class:`BoxScore` labelled with the
    class), and the Dice of its top voxels against them (the module docstring)."""
    saliency, inside = saliency.float().cpu(), inside.cpu()
    hit = bool(inside.flatten()[int(torch.argmax(saliency.flatten()))])
    mass = saliency.clamp_min(0.0)
    total = float(mass.sum())
    energy = float(mass[inside].sum()) / total if total > 0 else float("nan")
    count = int(inside.sum())
    dice = 2.0 * float((top(saliency, count) & inside).sum()) / (2 * count)
    return BoxScore(target.name, target, hit, energy), dice
