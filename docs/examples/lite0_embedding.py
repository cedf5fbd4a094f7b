"""An embedding model for the examples of docs/targets.md: the pretrained EfficientNet-Lite0 without its classifier,
whose (N, 1280) pooled features are the embedding (``--model docs/examples/lite0_embedding.py:build``)."""

from __future__ import annotations

from torch import nn

from gradcam_cli import load_model


def build() -> nn.Module:
    """EfficientNet-Lite0 with ImageNet weights, its last linear layer replaced by the identity."""
    model = load_model("efficientnet_lite0").module
    model._fc = nn.Identity()
    return model
