"""Finer-CAM: Grad-CAM of the target's score against its nearest classes (the score is
:func:`gradcam_cli.cam.finer.finer_scores`)."""

from __future__ import annotations

import torch

from .gradient import gradcam
from .needs import FINER_GRADIENT
from .registry import ANY_RANK, CLASSIFY, CamMethod


def finercam(
    activations: torch.Tensor, gradients: torch.Tensor | None, finer: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Finer-CAM (Zhang et al., "Finer-CAM: Spotting the Difference Reveals Finer Details for Visual Explanation",
    CVPR 2025): Grad-CAM of the target's score minus its nearest classes' (:mod:`gradcam_cli.cam.finer`), with
    ``finer`` = dS/dA for that score S.

    w_k = mean_{i,j} dS/dA^k_{ij};  L = ReLU(sum_k w_k A^k).
    """
    return gradcam(activations, finer, eigen_smooth=eigen_smooth)


FINERCAM = CamMethod(
    "finercam",
    finercam,
    ranks=ANY_RANK,
    uses_gradients=False,
    needs=FINER_GRADIENT,
    tasks=CLASSIFY,
    formula=(
        "Grad-CAM of S = y_c - sum_d w_d y_d, d: the 3 classes nearest c"
        ", w = softmax over them ([Finer-CAM](targets.md#finer-cam))"
    ),
    paper="Zhang et al., CVPR 2025",
    cost="a second backward pass",
)
