"""Maps of any rank: which methods a layer's grid takes, checked before any work.

A layer's maps have as many spatial dimensions as the input it reads: (l,) for a sequence (N, C, L), (h, w) for an
image, (t, h, w) for a clip (N, C, T, H, W) or (d, h, w) for a volume (see :mod:`gradcam_cli.cam.reshape`). Each
method declares the ranks its formula is defined for (:attr:`~gradcam_cli.cam.methods.registry.CamMethod.ranks`);
the others are refused here, in one line, when the explainer is built.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import UsageError
from ..io.images import InputSpec
from .layers import LayerInfo
from .methods.registry import METHODS


def input_rank(spec: InputSpec) -> int:
    """The number of spatial dimensions of the inputs ``spec`` describes: 2 for images, else its ``shape``'s less
    the channels."""
    return 2 if spec.shape is None else len(spec.shape) - 1


def check_ranks(
    methods: Sequence[str], infos: Sequence[LayerInfo], layers: Sequence[str], spec: InputSpec, aug_smooth: bool
) -> None:
    """A one-line UsageError for the first of ``methods`` not defined for the maps it would make: those of each of
    ``layers`` (their grids from the dry pass ``infos``), or the input's own for a method that reads no layer
    (RISE, occlusion); and for ``aug_smooth`` (flips and rescales of images) on inputs that are no images."""
    rank = input_rank(spec)
    if aug_smooth and rank != 2:
        raise UsageError(f"--aug-smooth flips and rescales images; these inputs are {rank}-D, so run without it")
    by_name = {info.name: info for info in infos}
    grids = {name: _grid(by_name.get(name), rank) for name in layers}
    for name in methods:
        method = METHODS[name]
        where = grids.items() if method.uses_layer else [("", (rank, ""))]
        for layer, (layer_rank, described) in where:
            if layer_rank in method.ranks:
                continue
            shown = ", ".join(f"{r}-D" for r in sorted(method.ranks))
            maps = f"the maps of layer {layer!r} are" if layer else "its maps, at the input's resolution, are"
            shape = " x ".join(map(str, spec.shape)) if spec.shape else "3 x H x W"
            described = described or f"{rank}-D ({shape})"
            raise UsageError(f"{name} is defined for {shown} maps only; {maps} {described}")


def _grid(info: LayerInfo | None, rank: int) -> tuple[int, str]:
    """A layer's rank and its maps' shape as the message shows it, ``3-D (64 x 4 x 14 x 14)``; the input's rank
    where the dry pass saw no grid (the engine reports that layer)."""
    if info is None or info.layout is None or info.output_shape is None:
        return rank, ""
    grid = info.layout.grid
    channels = info.output_shape[-1] if info.layout.kind in ("nhwc", "nlc", "tokens") else info.output_shape[1]
    return len(grid), f"{len(grid)}-D ({' x '.join(map(str, (channels, *grid)))})"
