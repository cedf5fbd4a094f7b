"""FullGrad: the input gradient and every bias layer's gradient, at the network input's resolution (the pass is
:class:`~gradcam_cli.cam.fullgrad.FullGradPass`)."""

from __future__ import annotations

import torch

from ..fullgrad import FullGradients, fullgrad_map
from .needs import FULL_GRADIENTS
from .registry import CLASSIFY, CamMethod


def fullgrad(
    activations: torch.Tensor, gradients: torch.Tensor | None, full: FullGradients, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """FullGrad (Srinivas & Fleuret, "Full-Gradient Representation for Neural Network Visualization", NeurIPS
    2019, Eq. 5, as pytorch-grad-cam's ``FullGrad`` computes it).

    L = sum_c psi(|x ⊙ ∇_x S|_c) + sum_l sum_c psi(|b_l,c ∂S/∂z_l,c|): the input-gradient term and, for every
    convolution with a bias and every BatchNorm (z_l its output, b_l its bias), the bias-gradient term, psi being
    min-max normalisation per channel at the layer's resolution followed by bilinear upsampling to the input.
    ``--layer`` plays no part (every bias layer counts); ``eigen_smooth`` changes nothing. See
    :mod:`gradcam_cli.cam.fullgrad`.
    """
    return fullgrad_map(full)


FULLGRAD = CamMethod(
    "fullgrad",
    fullgrad,
    uses_gradients=False,
    needs=FULL_GRADIENTS,
    tasks=CLASSIFY,
    formula="sum_c psi(abs(x ⊙ ∇_x S)_c) + sum_l sum_c psi(abs(b_l,c ∂S/∂z_l,c)), l: every layer with a bias",
    paper="Srinivas & Fleuret, NeurIPS 2019, Eq. 5",
    cost="a forward and a backward pass through the whole network",
)
