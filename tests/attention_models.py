"""Tiny random-weight transformers for the tests: :func:`tiny_vit`, the one timm ViT configuration they vary,
:data:`HF_TINY`, Hugging Face's, and :func:`build_vit` for the attention methods' command line (``--model
tests/attention_models.py:build_vit``): a timm ViT with a class token, two registers and any input size."""

from __future__ import annotations

import torch
from torch import nn

SIZE, PATCH = 32, 8
"""The tiny ViTs' input side and patch side: a 4 x 4 patch grid."""
HF_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
"""A Hugging Face transformer's tiny configuration: two blocks of two heads, 32 wide."""


def tiny_vit(name: str = "vit_tiny_patch16_224", **options: object) -> nn.Module:
    """timm's ``name`` with random weights, 32 px input, 8 px patches, 3 blocks of 4 heads 32 wide; ``options``
    override or add to these (``depth``, ``num_classes``, ``reg_tokens``, ...). Seed before calling."""
    import timm

    tiny: dict[str, object] = {"img_size": SIZE, "patch_size": PATCH, "embed_dim": 32, "depth": 3, "num_heads": 4}
    return timm.create_model(name, pretrained=False, **{**tiny, **options})


def build_vit() -> nn.Module:
    """A 3-block timm ViT, 8-pixel patches, class token + 2 registers (``num_prefix_tokens`` 3), any input size."""
    torch.manual_seed(0)
    return tiny_vit(num_classes=4, reg_tokens=2, dynamic_img_size=True).eval()
