"""Tiny random-weight transformers for the tests: :func:`tiny_vit`, the one timm ViT configuration they vary,
:data:`HF_TINY`, Hugging Face's, and :func:`build_vit` for the attention methods' command line (``--model
tests/attention_models.py:build_vit``): a timm ViT with a class token, two registers and any input size; and
:func:`save_tiny_clip`, a Hugging Face CLIP folder for ``text:`` targets."""

from __future__ import annotations

import json
from pathlib import Path

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


def save_tiny_clip(folder: Path) -> None:
    """A tiny transformers CLIPModel (seeded) saved to ``folder`` with a character-level tokenizer and an image
    processor (32 px): ``hf:FOLDER``'s ``text:`` targets without a download."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    torch.manual_seed(0)
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for code in range(ord("a"), ord("z") + 1):
        vocab.setdefault(chr(code), len(vocab))
        vocab.setdefault(chr(code) + "</w>", len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    text = {"vocab_size": len(vocab), "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
    text |= {"num_attention_heads": 2, "max_position_embeddings": 24, "bos_token_id": 0, "eos_token_id": 1}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
    vision |= {"image_size": 32, "patch_size": 8}
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(folder)
    CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
