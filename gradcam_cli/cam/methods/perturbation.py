"""The black-box methods, RISE, D-RISE and occlusion: maps from how the target's score (D-RISE: its detection)
responds to masked inputs, no layer and no gradients (the masks and passes are :mod:`gradcam_cli.cam.perturbation`'s,
D-RISE's similarity and passes :mod:`gradcam_cli.cam.drise`'s)."""

from __future__ import annotations

import torch

from ..drise import WeightedMasks
from ..perturbation import MaskedPasses
from .needs import DETECTION_PASSES, MASKED_PASSES
from .registry import CamMethod


def rise(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    passes: MaskedPasses,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """RISE (Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box Models", BMVC 2018,
    Eq. 6).

    L = 1 / (N p) sum_i f(x ⊙ M_i) M_i: the masks weighted by the score of the input they keep (the masks, N, p and
    f as in :mod:`gradcam_cli.cam.perturbation`), at the network input's resolution. Needs no layer and no
    gradients: any model that can be run, even a non-differentiable one. ``eigen_smooth`` changes nothing.
    """
    total = torch.zeros(passes.inputs.shape[0], *passes.size, device=passes.inputs.device)
    for masks, scores in passes.rise():
        total += torch.einsum("nb,bhw->nhw", scores, masks.float())
    return total / (passes.options.rise_masks * passes.options.rise_probability)


def drise(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    sums: WeightedMasks,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """D-RISE (Petsiuk, Jain, Manjunatha, Morariu, Mehra, Ordonez & Saenko, "Black-box Explanation of Object
    Detectors via Saliency Maps", CVPR 2021, Eq. 2-4).

    L = 1 / (N p) sum_i w_i M_i, w_i = max_j IoU(L_t, L_j) · cos(P_t, P_j) · O_j: RISE's masks M_i weighted by how
    much the best-matching detection d_j of the masked image x ⊙ M_i is the explained detection d_t, by box, class
    scores and objectness (the vectors, the masks and the passes as in :mod:`gradcam_cli.cam.drise`, which forms the
    sum in one sweep over the masks for every detection of the image). The paper's map is the weighted sum; the
    constant 1 / (N p) is RISE's, kept so that both methods' maps are on one scale. At the network input's resolution,
    no layer and no gradients; detectors only. ``eigen_smooth`` changes nothing.
    """
    return sums.total / (sums.masks * sums.probability)


def occlusion(
    activations: torch.Tensor | None,
    gradients: torch.Tensor | None,
    passes: MaskedPasses,
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """Occlusion (Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014), as Captum's
    ``Occlusion`` computes it.

    L(p) = mean over the windows W that contain pixel p of f(x) - f(x with W set to zero): how much the score drops
    when the pixel's neighbourhood is hidden (windows and f as in :mod:`gradcam_cli.cam.perturbation`), at the
    network input's resolution. No ReLU: a window whose removal raises the score gives its pixels negative values,
    the lowest once the map is normalised. Needs no layer and no gradients. ``eigen_smooth`` changes nothing.
    """
    original = passes.original()
    drops = torch.zeros(passes.inputs.shape[0], *passes.size, device=passes.inputs.device)
    counts = torch.zeros(passes.size, device=passes.inputs.device)
    for windows, scores in passes.occlusion():
        drops += torch.einsum("nb,bhw->nhw", original[:, None] - scores, windows)
        counts += windows.sum(dim=0)
    return drops / counts.clamp_min(1)


RISE = CamMethod(
    "rise",
    rise,
    uses_gradients=False,
    needs=MASKED_PASSES,
    uses_layer=False,
    formula="sum_i f(x ⊙ M_i) M_i / (N p), N random masks",
    paper="Petsiuk et al., BMVC 2018, Eq. 6",
    cost="N masked forward passes (4,000), batched, no layer",
)

DRISE = CamMethod(
    "drise",
    drise,
    uses_gradients=False,
    needs=DETECTION_PASSES,
    uses_layer=False,
    tasks=("detect",),
    formula="sum_i w_i M_i / (N p), w_i = max_j IoU(L_t, L_j) cos(P_t, P_j) O_j over the masked image's detections",
    paper="Petsiuk et al., CVPR 2021, Eq. 2-4",
    cost="N masked forward passes (4,000) for all of an image's detections at once, batched, no layer",
)

OCCLUSION = CamMethod(
    "occlusion",
    occlusion,
    uses_gradients=False,
    needs=MASKED_PASSES,
    uses_layer=False,
    formula="mean drop of f when a window covering the pixel is zeroed",
    paper="Zeiler & Fergus, ECCV 2014",
    cost="one masked forward pass per window position (169 at 224x224), batched, no layer",
)
