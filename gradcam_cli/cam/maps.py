"""Turning coarse CAMs into image-sized saliency maps in [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

NORMALISE_EPS = 1.1754944e-38
"""Absolute floor for a map's span (float32's smallest normal number): any larger span is scaled to [0, 1], since
a map's magnitude carries no meaning (random-weight EfficientNet-B0 maps peak at ~1e-15 and are still maps)."""
CONSTANT_RTOL = 1e-5
"""A map whose values differ by less than this fraction of their magnitude counts as constant: bilinear
upsampling of a constant float32 map leaves a few ulps of noise, which min-max scaling would blow up to [0, 1]."""


def normalise(maps: torch.Tensor, eps: float = NORMALISE_EPS) -> torch.Tensor:
    """Min-max normalise each map of an (N, H, W) batch to [0, 1]; a constant (or all-zero) map becomes all zeros."""
    flat = maps.flatten(1)
    low = flat.min(dim=1).values.view(-1, 1, 1)
    high = flat.max(dim=1).values.view(-1, 1, 1)
    span = high - low
    constant = span <= eps + CONSTANT_RTOL * torch.maximum(high.abs(), low.abs())
    scaled = (maps - low) / torch.where(constant, torch.ones_like(span), span)
    return scaled.masked_fill_(constant, 0.0).clamp_(0.0, 1.0)


def upsample(maps: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Bilinearly resize (N, h, w) maps to ``size`` = (H, W) with ``align_corners=False``.

    Feature maps and the network input both cover the whole image (no crop), so stretching the map over any
    (H, W) lines it up with that image's pixels.
    """
    return F.interpolate(maps.unsqueeze(1).float(), size=tuple(size), mode="bilinear", align_corners=False)[:, 0]


def to_image_maps(cams: Sequence[torch.Tensor], size: Sequence[int]) -> torch.Tensor:
    """Upsample and normalise one (N, h, w) CAM per layer; several layers fuse as the mean of normalised maps.

    The fused map is normalised once more so that it, too, spans [0, 1].
    """
    per_layer = [normalise(upsample(cam, size)) for cam in cams]
    if len(per_layer) == 1:
        return per_layer[0]
    return normalise(torch.stack(per_layer).mean(dim=0))
