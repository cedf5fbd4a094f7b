"""The token layouts of the supported vision-language families: their default layer and their geometry
(docs/vlm.md). Which ``model_type`` has which layout is the ``vision-language`` model family's data
(:mod:`gradcam_cli.models.families.vision_language`), carried by each loaded model's profile.

Each :class:`TokenLayout` names the layer whose output is the image tokens as the language model receives them, and
says where those tokens lie on the photo (:class:`~gradcam_cli.models.tiles.Tile`s) from the processor's own
settings and what it returned for the photo:

- LLaVA-1.5 (``llava``): the multi-modal projector's output, a patch grid (after the vision tower's class token,
  where the processor keeps one) of the processor's input: the photo padded to a square (``do_pad``), resized
  (shortest edge, or height x width) and centre-cropped, so the grid covers the crop's box of the photo.
- LLaVA-NeXT (``llava_next``): the projector's output, one patch grid per frame: first the whole photo squeezed
  into one frame, then the tiles of the best of ``image_grid_pinpoints`` for the photo (resized into it keeping its
  aspect, padded evenly), row-major; the language model then drops the padding's tokens, which the map never shows.
- Qwen2-VL and Qwen2.5-VL (``qwen2_vl``, ``qwen2_5_vl``): the vision merger's output, one token per 2 x 2 patches
  of the photo resized whole to multiples of 28 (dynamic resolution): a (h / 2) x (w / 2) grid over the whole photo
  for an ``image_grid_thw`` of (1, h, w). A video (the processor's video path) is t x (h / 2) x (w / 2) tokens,
  time first, for a ``video_grid_thw`` of (t, h, w): each of the t a temporal patch of ``temporal_patch_size``
  sampled frames (:func:`qwen2_vl_video_grid`).
  Qwen2.5-VL's merger sees the tokens window by window (``window_size`` pixels square), and its output is put
  back in row-major order only after it: :func:`qwen2_5_vl_order`.
- Idefics3 and SmolVLM (``idefics3``, ``smolvlm``): the connector's output, one grid per tile (pixel-shuffled
  patches): the photo split into rows x cols tiles, then the whole photo again as a global image; each tile's frame
  may be padded at its bottom and right (``pixel_attention_mask``), so its grid reaches past the part it shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import UsageError
from .tiles import Box, Tile, frame_box

Tiler = Callable[[Any, Any, Mapping[str, torch.Tensor], tuple[int, int], int], list[Tile]]
"""``tiles(processor, config, inputs, (height, width), tokens)``: where the layer's ``tokens`` lie on the photo."""
Order = Callable[[Any, Mapping[str, torch.Tensor]], torch.Tensor]
"""``order(config, inputs)``: for the layer's tokens in another order than the tiles' (Qwen2.5-VL's windows), the
row-major token each of them is."""
VideoGrid = Callable[[Any, Mapping[str, torch.Tensor]], tuple[int, int, int]]
"""``grid(config, inputs)``: the (t, h, w) grid of a video's tokens at the layer, time first, for the processor's
video tensors in ``inputs`` (a family with a video path: Qwen2-VL's ``video_grid_thw``)."""


@dataclass(frozen=True)
class TokenLayout:
    """One family's layout: its name, its default layer (a module name) and what that layer is, its
    :data:`Tiler`, where the layer's tokens come in another order than the tiles', its :data:`Order`, and for a
    family whose processor takes videos, its :data:`VideoGrid` (``None``: it answers about images only)."""

    name: str
    default_layer: str
    layer_description: str
    tiles: Tiler
    order: Order | None = None
    video: VideoGrid | None = None


def _resized(size: Mapping[str, int], height: float, width: float) -> tuple[float, float]:
    """A transformers image processor's ``size`` applied to (height, width): exact, or the shortest edge."""
    if "height" in size and "width" in size:
        return float(size["height"]), float(size["width"])
    short = int(size["shortest_edge"])
    if height <= width:
        return float(short), float(int(short * width / height))
    return float(int(short * height / width)), float(short)


def llava_tiles(
    processor: Any, config: Any, inputs: Mapping[str, torch.Tensor], size: tuple[int, int], tokens: int
) -> list[Tile]:
    """LLaVA-1.5: one grid over the processor's (padded, resized, centre-cropped) input."""
    image_processor = processor.image_processor
    height, width = float(size[0]), float(size[1])
    left, top = 0.0, 0.0
    if getattr(image_processor, "do_pad", False):  # LlavaImageProcessor: padded to a square, centred, first
        side = max(height, width)
        left, top = (side - width) / 2, (side - height) / 2
        height = width = side
    resized_h, resized_w = height, width
    if getattr(image_processor, "do_resize", True):
        resized_h, resized_w = _resized(image_processor.size, height, width)
    crop_top, crop_left = 0.0, 0.0
    pixel_h, pixel_w = (int(v) for v in inputs["pixel_values"].shape[-2:])
    if getattr(image_processor, "do_center_crop", False):
        crop_top, crop_left = float((resized_h - pixel_h) // 2), float((resized_w - pixel_w) // 2)
    scale_y, scale_x = height / resized_h, width / resized_w
    box: Box = (
        crop_left * scale_x - left,
        crop_top * scale_y - top,
        (crop_left + pixel_w) * scale_x - left,
        (crop_top + pixel_h) * scale_y - top,
    )
    patch = int(config.vision_config.patch_size)
    rows, cols = pixel_h // patch, pixel_w // patch
    return [Tile(tokens - rows * cols, rows, cols, box)]


def llava_next_tiles(
    processor: Any, config: Any, inputs: Mapping[str, torch.Tensor], size: tuple[int, int], tokens: int
) -> list[Tile]:
    """LLaVA-NeXT ("anyres"): the whole photo squeezed into one frame, then the tiles of the best resolution among
    ``image_grid_pinpoints`` (the photo resized into it keeping its aspect and padded evenly to it), row-major."""
    from transformers.image_processing_utils import select_best_resolution

    height, width = size
    frame_h, frame_w = (int(v) for v in inputs["pixel_values"].shape[-2:])
    pinpoints = getattr(processor.image_processor, "image_grid_pinpoints", None) or config.image_grid_pinpoints
    best_h, best_w = (int(v) for v in select_best_resolution((height, width), pinpoints))
    if best_w / width < best_h / height:
        new_w, new_h = best_w, min(math.ceil(height * best_w / width), best_h)
    else:
        new_h, new_w = best_h, min(math.ceil(width * best_h / height), best_w)
    left, top = (best_w - new_w) // 2, (best_h - new_h) // 2
    scale_x, scale_y = width / new_w, height / new_h
    rows, cols = best_h // frame_h, best_w // frame_w
    per_frame = tokens // (1 + rows * cols)
    patch = int(config.vision_config.patch_size)
    grid_h, grid_w = frame_h // patch, frame_w // patch
    start = per_frame - grid_h * grid_w  # after a class token the vision tower keeps
    tiles = [Tile(start, grid_h, grid_w, (0.0, 0.0, float(width), float(height)))]
    for r in range(rows):
        for c in range(cols):
            box: Box = (
                (c * frame_w - left) * scale_x,
                (r * frame_h - top) * scale_y,
                ((c + 1) * frame_w - left) * scale_x,
                ((r + 1) * frame_h - top) * scale_y,
            )
            tiles.append(Tile((1 + r * cols + c) * per_frame + start, grid_h, grid_w, box))
    return tiles


def qwen2_vl_tiles(
    processor: Any, config: Any, inputs: Mapping[str, torch.Tensor], size: tuple[int, int], tokens: int
) -> list[Tile]:
    """Qwen2-VL: the merged (h / m) x (w / m) grid over the whole photo (m: the merge size, 2)."""
    merge = int(getattr(config.vision_config, "spatial_merge_size", 2))
    _, rows, cols = (int(v) for v in inputs["image_grid_thw"][0])
    return [Tile(0, rows // merge, cols // merge, (0.0, 0.0, float(size[1]), float(size[0])))]


def qwen2_vl_video_grid(config: Any, inputs: Mapping[str, torch.Tensor]) -> tuple[int, int, int]:
    """Qwen2-VL's video tokens at the merger: (t, h / m, w / m) for a ``video_grid_thw`` of (t, h, w), time first
    (m: the merge size, 2; each of the t a temporal patch of ``temporal_patch_size`` frames)."""
    merge = int(getattr(config.vision_config, "spatial_merge_size", 2))
    frames, rows, cols = (int(v) for v in inputs["video_grid_thw"][0])
    return frames, rows // merge, cols // merge


def qwen2_5_vl_order(config: Any, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Qwen2.5-VL's window order: the row-major merged token that each merger output is (the merged grid cut into
    windows of ``window_size // patch_size // merge`` tokens a side, row-major, each window row-major; a video's
    frames one after the other)."""
    vision = config.vision_config
    merge = int(vision.spatial_merge_size)
    side = int(vision.window_size) // merge // int(vision.patch_size)
    grid = inputs["image_grid_thw"] if "image_grid_thw" in inputs else inputs["video_grid_thw"]
    frames, rows, cols = (int(v) for v in grid[0])
    rows, cols = rows // merge, cols // merge
    index = torch.arange(frames * rows * cols).reshape(frames, rows, cols)
    padded = torch.nn.functional.pad(index, (0, -cols % side, 0, -rows % side), value=-1)
    windows = padded.reshape(frames, padded.shape[1] // side, side, padded.shape[2] // side, side)
    order = windows.permute(0, 1, 3, 2, 4).reshape(-1)
    return order[order >= 0]


def idefics3_tiles(
    processor: Any, config: Any, inputs: Mapping[str, torch.Tensor], size: tuple[int, int], tokens: int
) -> list[Tile]:
    """Idefics3: rows x cols tiles over the photo (row-major), then the global image over all of it."""
    height, width = float(size[0]), float(size[1])
    frames = int(inputs["pixel_values"].shape[1])
    per_frame = tokens // frames
    side = round(per_frame**0.5)
    rows, cols = _tile_counts(processor, inputs, frames)
    masks = inputs.get("pixel_attention_mask")
    frame_h, frame_w = (int(v) for v in inputs["pixel_values"].shape[-2:])
    regions: list[Box] = [
        (c * width / cols, r * height / rows, (c + 1) * width / cols, (r + 1) * height / rows)
        for r in range(rows)
        for c in range(cols)
    ]
    regions.append((0.0, 0.0, width, height))
    tiles = []
    for index, region in enumerate(regions):
        valid_h, valid_w = float(frame_h), float(frame_w)
        if masks is not None:
            mask = masks[0, index]
            valid_h, valid_w = float(mask.any(dim=1).sum()), float(mask.any(dim=0).sum())
        box = frame_box(region, (valid_h, valid_w), (float(frame_h), float(frame_w)))
        tiles.append(Tile(index * per_frame, side, side, box))
    return tiles


def _tile_counts(processor: Any, inputs: Mapping[str, torch.Tensor], frames: int) -> tuple[int, int]:
    """The rows and columns of tiles the processor split the photo into (0 x 0: the global image alone), read from
    the ``<row_R_col_C>`` tokens it put in the prompt (its ``row_col_ids``, 6 x 6 of them, row-major)."""
    ids = list(getattr(processor, "row_col_ids", []))
    present = {ids.index(int(token)) for token in inputs["input_ids"][0].tolist() if int(token) in ids}
    if not present:
        if frames != 1:
            raise UsageError("the processor's tiles are unknown (no <row_R_col_C> tokens); cannot place the map")
        return 0, 0
    side = round(len(ids) ** 0.5)
    return max(k // side for k in present) + 1, max(k % side for k in present) + 1
