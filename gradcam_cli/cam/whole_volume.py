"""Maps of a volume classifier: the whole volume in one pass, as the model takes it (docs/volumes.md, "Volume
classifiers").

The (C, D, H, W) volume, normalised as the model takes it, is resized trilinearly (``align_corners=False``) to the
model's ``size`` where its profile names one, else given as it is; each class's map is computed on that input at the
explained layers and upsampled trilinearly to the volume's own grid (:meth:`~gradcam_cli.cam.explainer.Explainer.
explain_batch` with the grid as the size), so that it lies over the scan voxel for voxel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .explainer import Explainer
from .results import Prediction


@dataclass
class ClassifiedVolume:
    """A volume classifier's maps: ``maps[method]`` (K, D, H, W) on the volume's grid, in [0, 1], map k explaining
    ``targets[k]``; ``predictions``: the classes it predicts, most probable first."""

    targets: list[Prediction]
    maps: dict[str, torch.Tensor]
    predictions: list[Prediction]


def model_input(volume: torch.Tensor, size: Sequence[int] = ()) -> torch.Tensor:
    """(1, C, ...) : ``volume`` resized to ``size`` where one is given, else as it is."""
    x = volume[None].float()
    if size and tuple(size) != tuple(volume.shape[1:]):
        x = F.interpolate(x, size=tuple(size), mode="trilinear", align_corners=False)
    return x


def explain_classified(
    explainer: Explainer,
    volume: torch.Tensor,
    size: Sequence[int] = (),
    classes: Sequence[int] | None = None,
    top_k: int = 1,
) -> ClassifiedVolume:
    """Explain a (C, D, H, W) ``volume`` with a classifier: ``classes``, else its ``top_k`` most probable ones;
    ``size``: the (D, H, W) it takes the volume at (empty: the volume's own)."""
    x = model_input(volume, size)
    grid = tuple(volume.shape[1:])
    if classes:
        found = [explainer.explain_batch(x, sizes=[grid], target=c)[0] for c in classes]
    else:
        found = [explainer.explain_batch(x, sizes=[grid], top_k=top_k)[0]]
    targets: list[Prediction] = []
    maps: dict[str, list[torch.Tensor]] = {method: [] for method in explainer.chosen.methods}
    for result in found:
        for explanation in result.explanations:
            if all(explanation.target.index != t.index for t in targets):
                targets.append(explanation.target)
            maps[explanation.method].append(explanation.saliency.detach().float().cpu())
    predictions = sorted(
        {p.index: p for result in found for p in result.predictions}.values(), key=lambda p: -p.probability
    )
    stacked = {method: torch.stack(each) if each else torch.zeros((0, *grid)) for method, each in maps.items()}
    return ClassifiedVolume(targets, stacked, predictions)
