"""Turning any layer's output into (N, C, h, w) feature maps: channel-first, channel-last and token sequences.

CAM methods work on (N, C, h, w) maps. CNNs produce them directly; Swin and ConvNeXt blocks produce channel-last
(N, h, w, C) maps; ViTs produce token sequences (N, L, C) whose first tokens (the class token, sometimes also
distillation or register tokens) carry no position. :func:`infer_layout` recognises the layout from the tensor's
shape and the network input's size (H, W), and :func:`to_spatial` applies it, to activations and gradients alike,
before any method runs.

The rule: a spatial grid (h, w) fits the input when both sides shrink by about the same stride (H/h ~ W/w, within
a factor 1.5) and neither exceeds the input. A 4-D tensor is channel-first unless only the channel-last reading
fits (or fits strictly better); a 3-D tensor (N, L, C) is a sequence of ``prefix`` non-spatial tokens followed by
an h x w grid in row-major order (token ``prefix + r * w + c`` sits at row r, column c), as torchvision's, timm's
and Hugging Face's ViTs flatten their patch embeddings. Only models known to use tokens have 3-D outputs read so
(classifiers from timm or Hugging Face, or with an attention module or a patch embedding:
:func:`gradcam_cli.cam.layers.reads_tokens`);
elsewhere a 3-D output is no grid: an SSD head's (N, 3234 anchors, 91 classes) would otherwise read as 49 x 66.

How many prefix tokens there are is the model's own count where the model gives one (``prefix_tokens``: timm's
``num_prefix_tokens``, the class, distillation and register tokens of a Hugging Face model): then only that count
(or none, for the patch embedding before the tokens are prepended) is tried. Otherwise it is guessed: the count,
from 0 to :data:`MAX_PREFIX_TOKENS`, whose grid fits best, which can go wrong (a class token, 8 registers and 4 x 4
patches make 25 tokens, which read best as a 5 x 5 grid).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import UsageError

MAX_STRIDE_RATIO = 1.5
"""How different the vertical and horizontal strides of a grid may be for it to count as spatial."""
MAX_PREFIX_TOKENS = 8
"""At most this many leading non-spatial tokens (class, distillation, register tokens) are dropped."""


@dataclass(frozen=True)
class Layout:
    """How a layer's output lays out an h x w grid: ``nchw``, ``nhwc`` or ``tokens`` (after ``prefix`` tokens)."""

    kind: str
    height: int
    width: int
    prefix: int = 0

    @property
    def positions(self) -> int:
        """Number of spatial positions, h * w."""
        return self.height * self.width

    def describe(self) -> str:
        """A short human description, e.g. ``tokens 14x14 (+1 class token)``."""
        extra = f" (+{self.prefix} class token{'s' if self.prefix > 1 else ''})" if self.prefix else ""
        return f"{self.kind} {self.height}x{self.width}{extra}"


def _mismatch(grid: tuple[int, int], size: Sequence[int]) -> float | None:
    """|log(vertical stride / horizontal stride)| of ``grid`` on an input of ``size``; None if it cannot fit."""
    (h, w), (height, width) = grid, size
    if not (1 <= h <= height and 1 <= w <= width):
        return None
    mismatch = abs(math.log((height / h) / (width / w)))
    return mismatch if mismatch <= math.log(MAX_STRIDE_RATIO) else None


def infer_layout(
    shape: Sequence[int], input_size: Sequence[int], prefix_tokens: int | None = None, tokens: bool = True
) -> Layout | None:
    """The layout of a layer output of ``shape`` for an input of ``input_size`` = (H, W); None if not spatial.

    Any 4-D output is at least readable as channel-first (the layers of a CNN), so 4-D shapes always get a layout.
    ``prefix_tokens``: the model's own count of leading non-spatial tokens (``None``: guessed). ``tokens``: whether
    3-D outputs may be token sequences at all (only in models known to use them:
    :func:`gradcam_cli.cam.layers.reads_tokens`); without, a detector head's (N, anchors, classes) is no grid.
    """
    if len(shape) == 4:
        first = _mismatch((shape[2], shape[3]), input_size)
        last = _mismatch((shape[1], shape[2]), input_size)
        if last is not None and (first is None or last < first - 1e-9):
            return Layout("nhwc", shape[1], shape[2])
        return Layout("nchw", shape[2], shape[3])
    if len(shape) == 3 and tokens:
        return _token_layout(shape[1], input_size, prefix_tokens)
    return None


def _token_layout(length: int, input_size: Sequence[int], known: int | None) -> Layout | None:
    """The best-fitting grid after some prefix: the model's own count (or none) when ``known``, else any count up
    to :data:`MAX_PREFIX_TOKENS`; ties go to the model's count, then to fewer tokens."""
    prefixes = range(min(MAX_PREFIX_TOKENS, length - 1) + 1) if known is None else sorted({known, 0})
    best: tuple[float, bool, int, int, int] | None = None
    for prefix in prefixes:
        count = length - prefix
        for h in range(1, math.isqrt(max(count, 0)) + 1):
            if count % h:
                continue
            for grid in {(h, count // h), (count // h, h)}:
                mismatch = _mismatch(grid, input_size)
                rank = (mismatch, prefix != known, prefix) if mismatch is not None else None
                if rank is not None and (best is None or rank < best[:3]):
                    best = (*rank, *grid)
    if best is None:
        return None
    _, _, prefix, h, w = best
    return Layout("tokens", h, w, prefix)


def to_spatial(tensor: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Rearrange a layer output (or its gradient) laid out as ``layout`` into (N, C, h, w)."""
    if layout.kind == "nchw":
        return tensor
    if layout.kind == "nhwc":
        return tensor.permute(0, 3, 1, 2)
    tokens = tensor[:, layout.prefix :, :]
    return tokens.reshape(tensor.shape[0], layout.height, layout.width, tensor.shape[2]).permute(0, 3, 1, 2)


def spatial(
    tensor: torch.Tensor,
    input_size: Sequence[int],
    layer: str = "",
    prefix_tokens: int | None = None,
    tokens: bool = True,
) -> torch.Tensor:
    """:func:`to_spatial` with the layout inferred from ``tensor``'s shape; UsageError if it has no grid."""
    layout = infer_layout(tuple(tensor.shape), input_size, prefix_tokens, tokens)
    if layout is None:
        shape = "x".join(map(str, tensor.shape))
        raise UsageError(
            f"layer {layer!r} outputs a {shape} tensor with no spatial grid for a "
            f"{input_size[0]}x{input_size[1]} input; choose another --layer (see --list-layers)"
        )
    return to_spatial(tensor, layout)
