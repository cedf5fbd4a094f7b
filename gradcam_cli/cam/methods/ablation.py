"""Ablation-CAM: channels weighted by the drop of the target's score when each is set to zero (the ablated passes
are :class:`~gradcam_cli.cam.ablation.AblatedScores`)."""

from __future__ import annotations

import torch

from ..ablation import AblatedScores
from ..smoothing import combine, per_channel
from .needs import ABLATED_SCORES
from .registry import ANY_RANK, CLASSIFY, CamMethod


def ablationcam(
    activations: torch.Tensor, gradients: torch.Tensor | None, model: AblatedScores, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Ablation-CAM (Desai & Ramaswamy, "Ablation-CAM: Visual Explanations for Deep Convolutional Network via
    Gradient-free Localization", WACV 2020).

    w_k = (y^c - y^c_k) / y^c, y^c_k the target's score with channel k of the layer set to zero;
    L = ReLU(sum_k w_k A^k). y^c is the score ``--score`` names (the logit by default, as in the paper and
    pytorch-grad-cam); where it is 0, w_k = y^c - y^c_k. pytorch-grad-cam sets an ablated channel to
    min(A) - 1e7 instead of 0 whenever the batch's activations are not all >= 0 with minimum exactly 0 (SiLU,
    Hardswish, LayerNorm outputs), which departs from the paper there. One forward pass per non-zero channel, in
    batches; no gradients.
    """
    ablated = model(activations)
    original = model.original.to(ablated.device)[:, None]
    drop = original - ablated
    weights = torch.where(original != 0, drop / torch.where(original != 0, original, torch.ones_like(original)), drop)
    return combine(per_channel(weights, activations).to(activations.dtype) * activations, eigen_smooth)


ABLATIONCAM = CamMethod(
    "ablationcam",
    ablationcam,
    ranks=ANY_RANK,
    uses_gradients=False,
    needs=ABLATED_SCORES,
    tasks=CLASSIFY,
    formula="w_k = (y^c - y^c_k) / y^c, y^c_k: the score with channel k set to 0",
    paper="Desai & Ramaswamy, WACV 2020",
    cost="one forward pass per channel",
)
