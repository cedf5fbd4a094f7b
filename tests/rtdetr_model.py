"""A tiny ultralytics RT-DETR (``RTDETRDetectionModel``) with random weights, seeded, saved as ultralytics saves a
checkpoint (``--model yolo:PATH``): five strided convolutions (P1/2 .. P5/32), an input projection and ultralytics'
``AIFI`` encoder layer on P5, and its ``RTDETRDecoder`` on P3, P4 and the encoder's output (hidden width 16, 10
queries, 2 decoder layers, 2 heads, 2 sampling points), three classes, the decoder's class and box heads drawn wider
so that its queries differ; nothing downloaded."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

CLASSES = ["red", "blue", "green"]
SIZE = 64
"""The model's input square (its checkpoint's ``imgsz``)."""
BACKBONE_LAST = "model.4"
"""The last layer of the model file's backbone (P5/32): the family's default layer."""


def tiny_rtdetr_config() -> dict[str, object]:
    """An RT-DETR model file's contents (see the module docstring)."""
    return {
        "nc": len(CLASSES),
        "backbone": [
            [-1, 1, "Conv", [8, 3, 2]],
            [-1, 1, "Conv", [16, 3, 2]],
            [-1, 1, "Conv", [16, 3, 2]],
            [-1, 1, "Conv", [32, 3, 2]],
            [-1, 1, "Conv", [32, 3, 2]],
        ],
        "head": [
            [-1, 1, "Conv", [16, 1, 1, None, 1, 1, False]],
            [-1, 1, "AIFI", [32, 2]],
            [[2, 3, 6], 1, "RTDETRDecoder", ["nc", 16, 10, 2, 2, 2, 32]],
        ],
    }


def tiny_rtdetr(seed: int = 0) -> torch.nn.Module:
    """The tiny RT-DETR, random weights drawn from ``seed``, in eval mode, its classes named."""
    from gradcam_cli.models.yolo import offline_ultralytics

    offline_ultralytics()  # as gradcam imports it (ultralytics patches PIL.Image.open on import)
    from ultralytics.nn.tasks import RTDETRDetectionModel

    torch.manual_seed(seed)
    net = RTDETRDetectionModel(tiny_rtdetr_config(), verbose=False)
    net.names = dict(enumerate(CLASSES))
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # the decoder's class and box heads drawn wider: queries whose classes and boxes differ
        for name, parameter in net.named_parameters():
            if ".dec_score_head." in name or (".dec_bbox_head." in name and ".layers.2." in name):
                scale = 0.0 if name.endswith("bias") and ".dec_score_head." in name else 0.5
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return net.eval()


def save_rtdetr(path: Path, seed: int = 0) -> Path:
    """:func:`tiny_rtdetr` saved to ``path`` as ultralytics saves a trained model (``model`` and ``train_args``)."""
    net = copy.deepcopy(tiny_rtdetr(seed)).float()
    torch.save({"model": net, "train_args": {"imgsz": SIZE}}, path)
    return path
