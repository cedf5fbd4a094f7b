"""Guided backpropagation and Guided Grad-CAM: pixel maps from the guided input gradient (the pass is
:class:`~gradcam_cli.cam.guided.GuidedPass`)."""

from __future__ import annotations

import torch

from ..guided import guided_saliency
from ..maps import normalise, upsample
from .gradient import gradcam
from .needs import GUIDED_GRADIENT
from .registry import CLASSIFY, CamMethod


def guided_backprop(
    activations: torch.Tensor, gradients: torch.Tensor | None, guided: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Guided backpropagation (Springenberg et al., "Striving for Simplicity: The All Convolutional Net", ICLR
    workshop 2015), as Guided Grad-CAM uses it (Selvaraju et al., ICCV 2017).

    G = dS/dx with every ReLU passing back only positive gradients (see :mod:`gradcam_cli.cam.guided`);
    L = sum_c |G_c| at the input's resolution, clipped at its 99th percentile for display. The layer plays no
    part; ``eigen_smooth`` changes nothing.
    """
    return guided_saliency(guided)


def guided_gradcam(
    activations: torch.Tensor, gradients: torch.Tensor, guided: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Guided Grad-CAM (Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks", ICCV 2017, Sec. 3.1).

    G ⊙ Up(Grad-CAM): the guided-backpropagation gradient G times the Grad-CAM map bilinearly upsampled to the
    input and normalised to [0, 1] (as pytorch-grad-cam's example does); L = sum_c |G_c ⊙ Up(Grad-CAM)|, clipped at
    its 99th percentile for display (see :func:`guided_backprop`). ``eigen_smooth`` applies to the Grad-CAM part.
    """
    cam = normalise(upsample(gradcam(activations, gradients, eigen_smooth=eigen_smooth), guided.shape[-2:]))
    return guided_saliency(guided * cam[:, None].to(guided.dtype))


GUIDED_BACKPROP = CamMethod(
    "guided-backprop",
    guided_backprop,
    uses_gradients=False,
    needs=GUIDED_GRADIENT,
    tasks=CLASSIFY,
    formula="sum_c abs(G_c), G = dS/dx with every ReLU passing back only positive gradients",
    paper="Springenberg et al., ICLR-W 2015",
    cost="a forward and a backward pass through the whole network",
)

GUIDED_GRADCAM = CamMethod(
    "guided-gradcam",
    guided_gradcam,
    needs=GUIDED_GRADIENT,
    tasks=CLASSIFY,
    formula="sum_c abs(G_c ⊙ Up(Grad-CAM))",
    paper="Selvaraju et al., ICCV 2017",
    cost="the same, shared with `guided-backprop`",
)
