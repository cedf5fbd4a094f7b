"""Tiny DETR-family detectors saved as Hugging Face folders (``--model hf:DIR``): a DETR, a Conditional DETR, a
Deformable DETR and an RT-DETR with a tiny transformers ResNet backbone (no timm, nothing downloaded), random weights
seeded, their object queries, cross-attention and heads drawn again wider so that the queries differ, saved with
their image processors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

CLASSES = ["red", "blue", "green"]
SIZE = 128
"""The processors' shorter side (DETR: longest side 192) and RT-DETR's fixed square."""


def _backbone(kind: str, stages: list[str]) -> object:
    from transformers import ResNetConfig, RTDetrResNetConfig

    build = ResNetConfig if kind == "detr" else RTDetrResNetConfig
    return build(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1], layer_type="basic", out_features=stages
    )


def _spread_heads(model: torch.nn.Module, seed: int) -> None:
    """The object queries, the decoder's cross-attention projections of queries and keys and the class and box
    heads' last layers drawn again (normal, std 0.5): queries that attend to different places, whose boxes and scores
    differ."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            heads = ("class_labels_classifier.", "bbox_predictor.layers.2.", "class_embed.", "model.query_position")
            projections = (
                "q_proj.weight",
                "k_proj.weight",
                "_content_proj.weight",
                "pos_proj.weight",
                "sine_proj.weight",
            )
            attends = "encoder_attn." in name and name.endswith(projections)
            if name.startswith(heads) or attends:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def save_detr(folder: Path) -> Path:
    """A DETR (softmax classes, 10 queries, 3 classes) in ``folder``."""
    from transformers import DetrConfig, DetrForObjectDetection, DetrImageProcessor

    return _save_detr_like(folder, DetrConfig, DetrForObjectDetection, DetrImageProcessor, ["stage4"])


def save_conditional_detr(folder: Path) -> Path:
    """A Conditional DETR (sigmoid classes, 10 queries, 3 classes) in ``folder``."""
    from transformers import ConditionalDetrConfig, ConditionalDetrForObjectDetection, ConditionalDetrImageProcessor

    return _save_detr_like(
        folder, ConditionalDetrConfig, ConditionalDetrForObjectDetection, ConditionalDetrImageProcessor, ["stage4"]
    )


def save_deformable_detr(folder: Path) -> Path:
    """A Deformable DETR (three feature levels, two sampling points, 10 queries, 3 classes) in ``folder``."""
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection, DeformableDetrImageProcessor

    stages = ["stage2", "stage3", "stage4"]
    return _save_detr_like(
        folder,
        DeformableDetrConfig,
        DeformableDetrForObjectDetection,
        DeformableDetrImageProcessor,
        stages,
        d_model=32,  # its group norms take 32 groups
        num_feature_levels=3,
        encoder_n_points=2,
        decoder_n_points=2,
    )


def _save_detr_like(folder: Path, config: Any, detector: Any, processor: Any, stages: list[str], **more: Any) -> Path:
    torch.manual_seed(0)
    shape = {"d_model": 16, **more}
    built = config(
        use_timm_backbone=False,
        backbone_config=_backbone("detr", stages),
        use_pretrained_backbone=False,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        num_queries=10,
        id2label=dict(enumerate(CLASSES)),
        label2id={name: i for i, name in enumerate(CLASSES)},
        **shape,
    )
    model = detector(built).eval()
    _spread_heads(model, 1)
    model.save_pretrained(folder)
    processor(size={"shortest_edge": SIZE, "longest_edge": 192}).save_pretrained(folder)
    return folder


def save_rt_detr(folder: Path, version: int = 1) -> Path:
    """An RT-DETR (``version`` 1 or 2; sigmoid classes, 10 queries, 3 classes, a 128 x 128 input) in ``folder``."""
    import transformers
    from transformers import RTDetrImageProcessor

    build: Any = transformers.RTDetrConfig if version == 1 else transformers.RTDetrV2Config
    detector: Any = transformers.RTDetrForObjectDetection if version == 1 else transformers.RTDetrV2ForObjectDetection
    torch.manual_seed(0)
    config = build(
        backbone_config=_backbone("rt_detr", ["stage2", "stage3", "stage4"]),
        use_pretrained_backbone=False,
        encoder_hidden_dim=16,
        encoder_in_channels=[16, 16, 32],
        d_model=16,
        hidden_expansion=0.5,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        decoder_layers=2,
        decoder_in_channels=[16, 16, 16],
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=10,
        num_denoising=0,
        id2label=dict(enumerate(CLASSES)),
        label2id={name: i for i, name in enumerate(CLASSES)},
    )
    model = detector(config).eval()
    model.save_pretrained(folder)
    RTDetrImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return folder
