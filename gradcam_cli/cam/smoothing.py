"""Smoothing CAMs: eigen-smooth (first principal component) and aug-smooth (test-time flips and scales).

``--eigen-smooth`` replaces a method's final channel sum sum_k W_k (the per-channel weighted activations) with
their first principal component, as pytorch-grad-cam's ``get_2d_projection``: treat the h*w positions as samples
of C features, centre each feature, and project onto the first right singular vector. The sign of a singular
vector is arbitrary; here it is fixed so that the component's channel loadings sum to a positive number, which is
the same as saying the smoothed map correlates positively with the plain channel sum (for a centred matrix X with
first right singular vector v, <X v, X 1> = sigma_1^2 <v, 1>). pytorch-grad-cam leaves the sign to LAPACK.

``--aug-smooth`` explains each input several times, flipped horizontally and rescaled, maps every result back to
the original geometry (a flipped map is flipped back; a rescaled input covers the whole image, so its map is
resized to the original size), normalises each to [0, 1] and averages them. Models with a fixed input size (ViT)
get the flips only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .maps import normalise, upsample

AUG_SCALES = (1.0, 0.75, 1.25)
"""Input scales tried by ``--aug-smooth`` (each with and without a horizontal flip)."""


def first_component(weighted: torch.Tensor) -> torch.Tensor:
    """(N, C, h, w) -> (N, h, w): projection of the centred positions onto their first principal direction; the
    positions of any grid alike ((N, C, l) -> (N, l), (N, C, t, h, w) -> (N, t, h, w)).

    Oriented so that the result correlates positively with ``weighted.sum(dim=1)`` (see the module docstring).
    """
    n, grid = weighted.shape[0], weighted.shape[2:]
    samples = torch.nan_to_num(weighted.float()).flatten(2).transpose(1, 2)  # (N, h*w, C)
    centred = samples - samples.mean(dim=1, keepdim=True)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    direction = vh[:, 0, :]  # (N, C)
    sign = torch.where(direction.sum(dim=1, keepdim=True) < 0, -1.0, 1.0)
    projection: torch.Tensor = (centred @ (direction * sign).unsqueeze(-1)).squeeze(-1)
    return projection.view(n, *grid).to(weighted.dtype)


def spatial_dims(tensor: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of an (N, C, ...) tensor's grid: (2, 3) of (N, C, h, w), (2,) of (N, C, l), (2, 3, 4) of
    (N, C, t, h, w). The Grad-CAM family's channel weights average (or sum) over every one of them."""
    return tuple(range(2, tensor.dim()))


def per_channel(weights: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(N, C) channel weights shaped to broadcast over ``like``'s (N, C, ...) grid: (N, C, 1, 1) for (N, C, h, w)."""
    return weights.view(*weights.shape, *(1,) * (like.dim() - 2))


def combine(weighted: torch.Tensor, eigen_smooth: bool = False) -> torch.Tensor:
    """ReLU(sum_k W_k), or ReLU(first principal component of W) with ``eigen_smooth``: (N, C, h, w) -> (N, h, w),
    and (N, C, ...) -> (N, ...) for a grid of any rank."""
    cam = first_component(weighted) if eigen_smooth else weighted.sum(dim=1)
    return torch.relu(cam)


@dataclass(frozen=True)
class Augmentation:
    """One test-time view of the input: optionally mirrored left-right, then resized by ``scale``."""

    flip: bool = False
    scale: float = 1.0

    def apply(self, inputs: torch.Tensor) -> torch.Tensor:
        """The augmented (N, 3, H', W') batch."""
        if self.flip:
            inputs = inputs.flip(-1)
        if self.scale != 1.0:
            height, width = inputs.shape[-2:]
            size = (max(1, round(height * self.scale)), max(1, round(width * self.scale)))
            inputs = F.interpolate(inputs, size=size, mode="bilinear", align_corners=False, antialias=self.scale < 1)
        return inputs

    def invert(self, maps: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
        """Coarse (N, h, w) maps of the augmented input, back in the original geometry at ``size`` = (H, W)."""
        maps = upsample(maps, size)
        return maps.flip(-1) if self.flip else maps


IDENTITY = Augmentation()


def augmentations(fixed_size: bool = False) -> list[Augmentation]:
    """The views ``--aug-smooth`` averages, the identity first; flips only for fixed-size models."""
    scales = (1.0,) if fixed_size else AUG_SCALES
    return [Augmentation(flip, scale) for scale in scales for flip in (False, True)]


def average_views(views: Sequence[tuple[Augmentation, torch.Tensor]], size: Sequence[int]) -> torch.Tensor:
    """Mean of the [0, 1]-normalised maps of every view, each mapped back to ``size`` first: (N, H, W)."""
    return torch.stack([normalise(view.invert(maps, size)) for view, maps in views]).mean(dim=0)
