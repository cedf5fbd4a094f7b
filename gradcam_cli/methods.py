"""CAM methods: small pure functions from a layer's activations and gradients to a coarse saliency map.

Every method takes ``activations`` and ``gradients`` of shape (N, C, h, w) and returns an (N, h, w) map, not yet
upsampled or normalised (see :func:`gradcam_cli.maps.to_image_maps`). Methods are registered in ``METHODS`` by the
name ``--method`` accepts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

CamMethod = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def gradcam(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks", ICCV 2017).

    w_k = mean_{i,j} dy^c / dA^k_{ij};  L^c = ReLU(sum_k w_k A^k).
    """
    weights = gradients.mean(dim=(2, 3), keepdim=True)
    return torch.relu((weights * activations).sum(dim=1))


METHODS: dict[str, CamMethod] = {"gradcam": gradcam}
