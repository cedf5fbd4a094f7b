"""How a video model takes its clips: frames per clip and the rate they are sampled at, from the model's profile.

A clip model's :class:`~gradcam_cli.io.images.InputSpec` says each frame's size and normalisation (and its
``shape``, (3, T, H, W), the dry pass's); its :class:`ClipSpec` says how a video becomes clips: ``frames`` (T) frames
sampled at ``rate`` frames per second (``None``: every frame of the video). torchvision's video weights say both in
their documentation (``frame_rate=15``, ``clip_len=16`` for R3D-18), and their transform the size (its crop, here
the shorter side: nothing is cropped away) and normalisation (:func:`torchvision_clip`). A model with a 3-channel
(3, T, H, W) ``shape`` and no spec of its own (a bare 3-D CNN) takes clips of T frames, every frame
(:func:`bare_clip`, :attr:`~gradcam_cli.models.profile.ModelProfile.clips`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..io.images import InputSpec

RGB = 3
"""The channels of a clip's frames."""


@dataclass(frozen=True)
class ClipSpec:
    """A clip model's clips: ``frames`` per clip, sampled at ``rate`` frames per second (``None``: every frame)."""

    frames: int
    rate: float | None = None

    def step(self, fps: float) -> float:
        """Source frames per sampled frame for a video of ``fps`` frames per second (below 1: frames repeat)."""
        if self.rate is None or not math.isfinite(fps) or fps <= 0:
            return 1.0
        return fps / self.rate

    def span(self, fps: float) -> int:
        """How many of the video's frames one clip covers: ``frames`` x :meth:`step`, at least 1."""
        return max(1, round(self.frames * self.step(fps)))


def sample_offsets(frames: int, span: int) -> list[int]:
    """The offset in a clip of ``span`` video frames of each of its ``frames`` samples: the frame at the centre of
    each of ``frames`` equal parts of the span (the frames a linear resampling with ``align_corners=False`` lines
    up with, so that a map resized from ``frames`` to ``span`` in time falls on the frames it was made from)."""
    return [min(span - 1, math.floor((i + 0.5) * span / frames)) for i in range(frames)]


def clip_starts(total: int, span: int, stride: int) -> list[int]:
    """The first video frame of each clip of a video of ``total`` frames: every ``stride`` frames while a whole
    ``span`` fits, then one clip ending on the last frame where those leave the end uncovered (a video shorter than
    a clip: one clip from its first frame); what :class:`~gradcam_cli.pipeline.clips.ClipRunner` explains."""
    starts = list(range(0, total - span + 1, stride)) if total >= span else []
    covered = starts[-1] + span if starts else 0
    return [*starts, max(0, total - span)] if covered < total else starts


def bare_clip(spec: InputSpec) -> ClipSpec | None:
    """The clips of a model whose input ``shape`` is (3, T, H, W) and that says nothing more (a bare 3-D CNN): T
    frames, every frame; ``None`` for any other shape."""
    shape = spec.shape
    if shape is None or len(shape) != 4 or shape[0] != RGB:
        return None
    return ClipSpec(shape[1])


_DOCS_NUMBER = r"`{0}=([0-9.]+)`"


def torchvision_clip(name: str, weights: Any) -> tuple[InputSpec, ClipSpec]:
    """A torchvision video model's input and clips from its weights: the transform's crop size as the frames'
    shorter side (MViT: exactly that square, its position embeddings fix it), its normalisation; the frame rate and
    clip length its documentation states (``frame_rate=15``, ``clip_len=16``)."""
    transforms = weights.transforms()
    crop = int(transforms.crop_size[0])
    docs = str(weights.meta.get("_docs", ""))
    rate = re.search(_DOCS_NUMBER.format("frame_rate"), docs)
    length = re.search(_DOCS_NUMBER.format("clip_len"), docs)
    frames = int(length.group(1)) if length else 16
    fixed = (crop, crop) if name.startswith("mvit") else None
    spec = InputSpec(
        size=crop,
        fixed_size=fixed,
        mean=tuple(transforms.mean),
        std=tuple(transforms.std),
        shape=(RGB, frames, crop, crop),
    )
    return spec, ClipSpec(frames, float(rate.group(1)) if rate else None)
