"""Finer-CAM (Zhang et al., "Finer-CAM: Spotting the Difference Reveals Finer Details for Visual Explanation",
CVPR 2025, arXiv:2501.11309): Grad-CAM of the difference between the target class's logit and its nearest
classes', so that the evidence the target shares with the classes it is most easily confused with cancels out.

S = y_c - alpha * sum_{d in D} w_d y_d,  w_d = softmax(y_D)_d,

D the :data:`FINER_COMPARED` classes whose logits lie nearest y_c (|y_d - y_c| smallest, c left out; the authors'
code's comparison categories 1, 2, 3 of that order) and alpha :data:`FINER_ALPHA` (their default). w_d is the
comparison class's softmax probability normalised over D, as the authors' ``FinerWeightedTarget`` weighs the
differences y_c - alpha y_d (sum_d p_d (y_c - alpha y_d) / sum_d p_d is this S), computed over D alone so that it
never divides by an underflowed sum. The weights are held constant: the map is the gradient of the weighted
differences, as the method describes; the authors' code (and pytorch-grad-cam's ``FinerCAM``) also differentiate
the softmax inside the weights. With ``contrast:A,B`` the comparison is B alone: S = y_A - y_B. The method itself,
:func:`gradcam_cli.cam.methods.finercam`, is Grad-CAM of S.
"""

from __future__ import annotations

import torch

FINER_ALPHA = 1.0
"""The comparison strength alpha (the paper's gamma): 1, the authors' default."""
FINER_COMPARED = 3
"""How many nearest classes the target is compared with."""


def finer_scores(
    logits: torch.Tensor, classes: torch.Tensor, alpha: float = FINER_ALPHA, compared: int = FINER_COMPARED
) -> torch.Tensor:
    """(N,) differentiable Finer-CAM scores S of each sample's class ``classes[n]`` in its (N, C) ``logits``."""
    chosen = classes.view(-1, 1).to(logits.device)
    own = logits.gather(1, chosen)
    distance = (logits.detach() - own.detach()).abs().scatter(1, chosen, float("inf"))
    nearest = distance.topk(min(compared, logits.shape[1] - 1), dim=1, largest=False).indices
    others = logits.gather(1, nearest)
    weights = others.detach().softmax(dim=1)
    return own.squeeze(1) - alpha * (weights * others).sum(dim=1)
