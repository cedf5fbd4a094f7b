"""The black-box methods, RISE and occlusion: maps from how the target's score responds to masked inputs, no layer
and no gradients (the masks and passes are :mod:`gradcam_cli.cam.perturbation`)."""

from __future__ import annotations

import torch

from ..perturbation import MaskedPasses
from .needs import MASKED_PASSES
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
