"""Turning coarse CAMs into input-sized saliency maps in [0, 1].

A map has 1, 2 or 3 spatial dimensions, as the layer it comes from: (L,) along a sequence, (H, W) over an image,
(T, H, W) over a clip or (D, H, W) over a volume; a batch of them has the sample first. Upsampling is linear,
bilinear or trilinear by that rank, normalisation is per sample over all of them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F

NORMALISE_EPS = 1.1754944e-38
"""Absolute floor for a map's span (float32's smallest normal number): any larger span is scaled to [0, 1], since
a map's magnitude carries no meaning (random-weight EfficientNet-B0 maps peak at ~1e-15 and are still maps)."""
CONSTANT_RTOL = 1e-5
"""A map whose values differ by less than this fraction of their magnitude counts as constant: bilinear
upsampling of a constant float32 map leaves a few ulps of noise, which min-max scaling would blow up to [0, 1]."""


INTERPOLATION = {1: "linear", 2: "bilinear", 3: "trilinear"}
"""How :func:`upsample` resizes maps, by their number of spatial dimensions."""


def normalise(maps: torch.Tensor, eps: float = NORMALISE_EPS) -> torch.Tensor:
    """Min-max normalise each map of an (N, ...) batch ((N, H, W), (N, L), (N, T, H, W)) to [0, 1] over all its
    positions; a constant (or all-zero) map becomes all zeros."""
    flat = maps.flatten(1)
    per_sample = (-1,) + (1,) * (maps.dim() - 1)
    low = flat.min(dim=1).values.view(per_sample)
    high = flat.max(dim=1).values.view(per_sample)
    span = high - low
    constant = span <= eps + CONSTANT_RTOL * torch.maximum(high.abs(), low.abs())
    scaled = (maps - low) / torch.where(constant, torch.ones_like(span), span)
    return scaled.masked_fill_(constant, 0.0).clamp_(0.0, 1.0)


def normalise_(maps: torch.Tensor, eps: float = NORMALISE_EPS) -> torch.Tensor:
    """:func:`normalise` in place, with no copy of ``maps`` (a view, such as a volume's maps cut out of their padded
    sums, included): the same values, for maps too large to hold twice."""
    dims = tuple(range(1, maps.dim()))
    low, high = maps.amin(dim=dims, keepdim=True), maps.amax(dim=dims, keepdim=True)
    span = high - low
    constant = span <= eps + CONSTANT_RTOL * torch.maximum(high.abs(), low.abs())
    maps.sub_(low).div_(torch.where(constant, torch.ones_like(span), span))
    return maps.masked_fill_(constant, 0.0).clamp_(0.0, 1.0)


def upsample(maps: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Resize (N, h, w) maps to ``size`` = (H, W) bilinearly with ``align_corners=False``; (N, l) maps to (L,)
    linearly and (N, t, h, w) maps to (T, H, W) trilinearly, alike (:data:`INTERPOLATION`).

    Feature maps and the network input both cover the whole input (no crop), so stretching the map over any
    (H, W) lines it up with that image's pixels (and a clip's frames, a volume's slices).
    """
    size = tuple(int(side) for side in size)
    if maps.dim() - 1 != len(size) or len(size) not in INTERPOLATION:
        shape = "x".join(map(str, maps.shape[1:]))
        raise ValueError(f"cannot resize {shape} maps to {'x'.join(map(str, size))}: their ranks differ")
    mode = INTERPOLATION[len(size)]
    return F.interpolate(maps.unsqueeze(1).float(), size=size, mode=mode, align_corners=False)[:, 0]


Region = tuple[float, ...]
"""The part of a layer's maps that shows the image, as fractions of their height and width: ``(height, width)``
of the top-left part (a torchvision detector pads at the bottom and right), or ``(top, left, height, width)`` (a
YOLO letterbox pads on both sides)."""


def upsample_region(maps: torch.Tensor, size: Sequence[int], region: Region = (1.0, 1.0)) -> torch.Tensor:
    """:func:`upsample` of (N, h, w) maps of which only the ``region`` (:data:`Region`) shows the image (a
    detector's padded batch): that part alone is stretched over ``size``, the padding never is.

    One bilinear resampling (``grid_sample``, ``align_corners=False``, border clamping): output pixel centre
    ``y + 0.5`` of H reads the map at ``(top + (y + 0.5) * fy / H) * h - 0.5``, as :func:`upsample` does for
    ``top = 0, fy = 1``. Maps of another rank than 2 have no region (only a detector's do): :func:`upsample`.
    """
    if tuple(region) in ((1.0, 1.0), (0.0, 0.0, 1.0, 1.0)) or maps.dim() != 3:
        return upsample(maps, size)
    height, width = int(size[0]), int(size[1])
    top, left, fy, fx = region if len(region) == 4 else (0.0, 0.0, *region)
    device = maps.device
    ys = (torch.arange(height, device=device) + 0.5) * (2 * fy / height) + 2 * top - 1
    xs = (torch.arange(width, device=device) + 0.5) * (2 * fx / width) + 2 * left - 1
    ys, xs = ys.view(height, 1).expand(height, width), xs.view(1, width).expand(height, width)
    grid = torch.stack([xs, ys], dim=-1).unsqueeze(0).expand(maps.shape[0], height, width, 2)
    sampled = F.grid_sample(
        maps.unsqueeze(1).float(), grid, mode="bilinear", padding_mode="border", align_corners=False
    )
    return sampled[:, 0]


Fusion = Literal["mean", "product"]
"""How a method's maps of several layers make one map (:attr:`~gradcam_cli.cam.methods.registry.CamMethod.fusion`):
``mean``, the mean of the per-layer maps (every method's); ``product``, their elementwise product (RefineCAM's).
Either way each layer's map is first upsampled to the same size and normalised to [0, 1], and the fused map is
normalised again (:func:`fuse`)."""
FUSIONS: tuple[Fusion, ...] = ("mean", "product")


def fuse(per_layer: Sequence[torch.Tensor], fusion: Fusion = "mean") -> torch.Tensor:
    """One map from (N, ...) maps of several layers, each already at the same size and normalised to [0, 1]: their
    mean or product (:data:`Fusion`), normalised again; a single layer's map as it is."""
    if len(per_layer) == 1:
        return per_layer[0]
    stacked = torch.stack(list(per_layer))
    return normalise(stacked.prod(dim=0) if fusion == "product" else stacked.mean(dim=0))


def to_image_maps(
    cams: Sequence[torch.Tensor], size: Sequence[int], region: Region = (1.0, 1.0), fusion: Fusion = "mean"
) -> torch.Tensor:
    """Upsample and normalise one (N, h, w) CAM per layer (or (N, l), (N, t, h, w): any rank :func:`upsample`
    takes); several layers fuse at ``size`` as ``fusion`` says (:func:`fuse`: the mean of the normalised maps, or
    their product), normalised once more so that the fused map, too, spans [0, 1]. ``region``: see
    :func:`upsample_region`.
    """
    return fuse([normalise(upsample_region(cam, size, region)) for cam in cams], fusion)


def pad_to_region(maps: torch.Tensor, region: Region = (1.0, 1.0)) -> torch.Tensor:
    """(N, H, W) maps of the whole input, zero-padded so that they fill the ``region`` (:data:`Region`), as a
    detector's layer maps do: RISE's and occlusion's maps, which cover the input alone, then line up with the image
    as the layers' maps do."""
    top, left, fy, fx = region if len(region) == 4 else (0.0, 0.0, *region)
    if (fy, fx) == (1.0, 1.0) or maps.dim() != 3:
        return maps
    height, width = maps.shape[-2:]
    padded_h, padded_w = max(height, round(height / fy)), max(width, round(width / fx))
    above, before = min(round(top * padded_h), padded_h - height), min(round(left * padded_w), padded_w - width)
    return F.pad(maps, (before, padded_w - width - before, above, padded_h - height - above))
