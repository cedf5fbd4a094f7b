"""Hugging Face video classifiers (``--model hf:FOLDER``: VideoMAE, TimeSformer, ViViT...): clips of the config's
``num_frames`` frames, every frame (a config says no frame rate), at its fixed ``image_size``, normalised as the
image processor says (docs/video.md).

transformers' video models take ``pixel_values`` of (N, T, C, H, W); the tool's clips are (N, C, T, H, W), as
torchvision's video models take them, so the model is wrapped in :class:`ClipsFirst`, which moves the frames axis
first and hands the model the rest (its layers are named ``model.<its own name>``: ``model.videomae.encoder...``).
Their token sequences (the prefix tokens their parameters show, then a t x h x w grid of tubelets, time slowest) are
laid out by :mod:`gradcam_cli.cam.reshape`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from .clip_spec import RGB, ClipSpec
from .hub import HubModel


class ClipsFirst(nn.Module):
    """A transformers video model that takes (N, C, T, H, W) clips: ``pixel_values`` of (N, T, C, H, W)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def config(self) -> Any:
        return self.model.config

    def forward(self, clips: torch.Tensor) -> Any:
        return self.model(pixel_values=clips.transpose(1, 2))


def hf_video(described: HubModel) -> HubModel:
    """A transformers video classifier as :func:`~gradcam_cli.models.hf_models.describe_hf` described it, wrapped
    (:class:`ClipsFirst`), with its clips: the config's ``num_frames`` (16 without one) at its ``image_size``."""
    config: Any = described.module.config
    frames = int(getattr(config, "num_frames", 16))
    side = int(getattr(config, "image_size", described.input_spec.size))
    spec = replace(described.input_spec, size=side, fixed_size=(side, side), shape=(RGB, frames, side, side))
    return replace(described, module=ClipsFirst(described.module), input_spec=spec, clip=ClipSpec(frames))
