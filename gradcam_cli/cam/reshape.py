"""Turning any layer's output into (N, C, h, w) feature maps: channel-first, channel-last and token sequences.

Inputs of another spatial rank give maps of that rank: a clip's (N, C, T, H, W) or a volume's (N, C, D, H, W) give
(N, C, t, h, w) at a 3-D convolution's output, a sequence's (N, C, L) gives (N, C, l) at a 1-D convolution's. Their
layers are channel-first (N, C, ...) or channel-last (N, ..., C), read by the same rule on the last two sides (the
strides of a clip's frames, a volume's slices and a sequence's positions are free); a clip's tokens (N, L, C) are read
as prefix tokens and a t x h x w grid, time slowest (:func:`_tube_layout`).

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
    """How a layer's output lays out an h x w grid: ``nchw``, ``nhwc`` or ``tokens`` (after ``prefix`` tokens).

    ``leading``: the grid's sides before ``height``, (t,) of a clip's maps or (d,) of a volume's (``nchw``: the
    output is (N, C, t, h, w); ``nhwc``: (N, t, h, w, C)). A sequence's 1-D grid (``ncl``: (N, C, l); ``nlc``:
    (N, l, C)) has ``height`` 1 and ``width`` l. :attr:`grid` is the grid whatever its rank."""

    kind: str
    height: int
    width: int
    prefix: int = 0
    leading: tuple[int, ...] = ()

    @property
    def grid(self) -> tuple[int, ...]:
        """The grid's sides, (h, w), (t, h, w) or (l,): the shape of the layer's maps."""
        if self.kind in LINE_KINDS:
            return (self.width,)
        return (*self.leading, self.height, self.width)

    @property
    def positions(self) -> int:
        """Number of spatial positions, h * w (t * h * w, l)."""
        return math.prod(self.grid)

    def describe(self) -> str:
        """A short human description, e.g. ``tokens 14x14 (+1 class token)``."""
        extra = f" (+{self.prefix} class token{'s' if self.prefix > 1 else ''})" if self.prefix else ""
        return f"{self.kind} {'x'.join(map(str, self.grid))}{extra}"


LINE_KINDS = ("ncl", "nlc")
"""The layouts of a 1-D grid: channel-first (N, C, l) and channel-last (N, l, C)."""


def _mismatch(grid: Sequence[int], size: Sequence[int]) -> float | None:
    """|log(vertical stride / horizontal stride)| of ``grid`` on an input of ``size`` (of the last two sides: a
    clip's frames and a volume's slices may shrink by another stride; a 1-D grid has none: 0); None if it cannot
    fit."""
    if len(grid) != len(size) or not all(1 <= side <= whole for side, whole in zip(grid, size, strict=True)):
        return None
    if len(grid) < 2:
        return 0.0
    (h, w), (height, width) = grid[-2:], size[-2:]
    mismatch = abs(math.log((height / h) / (width / w)))
    return mismatch if mismatch <= math.log(MAX_STRIDE_RATIO) else None


def infer_layout(
    shape: Sequence[int], input_size: Sequence[int], prefix_tokens: int | None = None, tokens: bool = True
) -> Layout | None:
    """The layout of a layer output of ``shape`` for an input of ``input_size`` = (H, W); None if not spatial.

    Any 4-D output is at least readable as channel-first (the layers of a CNN), so 4-D shapes always get a layout.
    An input of another rank ((T, H, W), (D, H, W), (L,)): :func:`_other_rank`.
    ``prefix_tokens``: the model's own count of leading non-spatial tokens (``None``: guessed). ``tokens``: whether
    3-D outputs may be token sequences at all (only in models known to use them:
    :func:`gradcam_cli.cam.layers.reads_tokens`); without, a detector head's (N, anchors, classes) is no grid.
    """
    if len(input_size) != 2:
        if len(shape) == 3 and len(input_size) == 3 and tokens:
            return _tube_layout(shape[1], input_size, prefix_tokens)
        return _other_rank(shape, input_size)
    if len(shape) == 4:
        first = _mismatch((shape[2], shape[3]), input_size)
        last = _mismatch((shape[1], shape[2]), input_size)
        if last is not None and (first is None or last < first - 1e-9):
            return Layout("nhwc", shape[1], shape[2])
        return Layout("nchw", shape[2], shape[3])
    if len(shape) == 3 and tokens:
        return _token_layout(shape[1], input_size, prefix_tokens)
    return None


def _other_rank(shape: Sequence[int], input_size: Sequence[int]) -> Layout | None:
    """The layout of an output of ``shape`` for an input whose grid ``input_size`` is not 2-D: an output with one
    dimension per side of the input besides the sample and channel ones is channel-first unless only the
    channel-last reading fits (or fits strictly better); any other output has no grid here."""
    rank = len(input_size)
    if len(shape) != rank + 2 or rank not in (1, 3):
        return None
    first = _mismatch(shape[2:], input_size)
    last = _mismatch(shape[1:-1], input_size)
    channel_last = last is not None and (first is None or last < first - 1e-9)
    grid = tuple(shape[1:-1]) if channel_last else tuple(shape[2:])
    if rank == 1:
        return Layout("nlc" if channel_last else "ncl", 1, grid[0])
    return Layout("nhwc" if channel_last else "nchw", grid[-2], grid[-1], leading=grid[:-2])


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


def _tube_layout(length: int, input_size: Sequence[int], known: int | None) -> Layout | None:
    """The grid of (N, L, C) tokens of a clip, (T, H, W): prefix tokens, then t x h x w in row-major order, time
    slowest (VideoMAE's tubelets, MViT's patches after their pooling): the model's own prefix (or none) when
    ``known``, else the fewest that fit; t the most frames (at most T) that leave an h x w grid fitting the frames
    (:func:`_token_layout`), so that 8 x 14 x 14 tokens of 16 x 224 x 224 clips are not read as 2 x 28 x 28."""
    prefixes = range(min(MAX_PREFIX_TOKENS, length - 1) + 1) if known is None else [known, *([0] if known else [])]
    for prefix in prefixes:
        count = length - prefix
        for frames in range(min(int(input_size[0]), count), 0, -1):
            plane = _token_layout(count // frames, input_size[-2:], 0) if count % frames == 0 else None
            if plane is not None and plane.prefix == 0:
                return Layout("tokens", plane.height, plane.width, prefix, leading=(frames,))
    return None


def to_spatial(tensor: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Rearrange a layer output (or its gradient) laid out as ``layout`` into (N, C, h, w) ((N, C, t, h, w),
    (N, C, l) for grids of other ranks)."""
    if layout.kind in ("nchw", "ncl"):
        return tensor
    if layout.kind in ("nhwc", "nlc"):
        return tensor.movedim(-1, 1)
    tokens = tensor[:, layout.prefix :, :]
    return tokens.reshape(tensor.shape[0], *layout.grid, tensor.shape[2]).movedim(-1, 1)


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
            f"{'x'.join(map(str, input_size))} input; choose another --layer (see --list-layers)"
        )
    return to_spatial(tensor, layout)
