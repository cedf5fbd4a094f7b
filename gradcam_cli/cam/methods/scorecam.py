"""Score-CAM: channels weighted by the target's probability for the input masked by each (the masked passes are
:class:`~gradcam_cli.cam.masked_scores.MaskedScores`)."""

from __future__ import annotations

import torch

from ..masked_scores import MaskedScores
from ..smoothing import combine, per_channel
from .needs import MASKED_SCORES
from .registry import ANY_RANK, CamMethod


def scorecam(
    activations: torch.Tensor,
    gradients: torch.Tensor | None,
    model: MaskedScores,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """Score-CAM (Wang et al., "Score-CAM: Score-Weighted Visual Explanations for Convolutional Neural Networks",
    CVPR Workshops 2020).

    H^k = minmax(Up(A^k));  w_k = softmax(f(X ⊙ H^k))_c;  L = ReLU(sum_k w_k A^k).

    The weight is the target class's softmax probability for the input masked by channel k, as in the authors'
    code (github.com/haofanwang/Score-CAM); the paper's baseline term f(X_b) is left out, as there. pytorch-grad-cam
    instead applies a softmax across the channels to the raw target logits (and upsamples the masks with
    align_corners=True), which weights channels differently. Costs one forward pass per non-constant channel; no
    gradients.
    """
    weights = model(activations).to(activations.dtype)
    return combine(per_channel(weights, activations) * activations, eigen_smooth)


SCORECAM = CamMethod(
    "scorecam",
    scorecam,
    ranks=ANY_RANK,
    uses_gradients=False,
    needs=MASKED_SCORES,
    formula="w_k = softmax(f(x ⊙ H^k))_c, H^k = A^k upsampled and scaled to [0, 1]",
    paper="Wang et al., CVPR-W 2020",
    cost="one forward pass per channel",
)
