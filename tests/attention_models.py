"""Tiny random-weight transformers for the attention methods' command-line tests (``--model
tests/attention_models.py:build_vit``): a timm ViT with a class token, two registers and any input size."""

from __future__ import annotations

import timm
import torch
from torch import nn


def build_vit() -> nn.Module:
    """A 3-block timm ViT, 8-pixel patches, class token + 2 registers (``num_prefix_tokens`` 3), any input size."""
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=4,
        num_classes=4,
        reg_tokens=2,
        dynamic_img_size=True,
    )
    return model.eval()
