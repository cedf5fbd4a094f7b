"""ShapleyCAM: Grad-CAM's weights corrected by the Hessian-vector product of the score at the layer."""

from __future__ import annotations

import torch

from ..smoothing import combine, spatial_dims
from .needs import HESSIAN_PRODUCT
from .registry import ANY_RANK, CamMethod


def shapleycam(
    activations: torch.Tensor, gradients: torch.Tensor, hessian: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """ShapleyCAM (Cai, "CAMs as Shapley Value-based Explainers", arXiv:2501.06261, 2025).

    w_k = mean_{i,j} (g - (1/2) H A)^k_{ij};  L = ReLU(sum_k w_k A^k), where H A is the Hessian of the score with
    respect to the layer's output times that output, a Hessian-vector product (the gradient of <g, A> with A held
    fixed), computed by differentiating the backward pass once more
    (:meth:`gradcam_cli.cam.engine.LayerCapture.hessian_vector_products`). Where everything after the layer is
    piecewise linear (ReLU, max-pooling, a linear head) and the score is a logit, H A = 0 and the map is Grad-CAM's;
    a softmax score, or GELU, SiLU and normalisations after the layer, make it differ.
    """
    weights = (gradients - 0.5 * hessian).mean(dim=spatial_dims(gradients), keepdim=True)
    return combine(weights * activations, eigen_smooth)


SHAPLEYCAM = CamMethod(
    "shapleycam",
    shapleycam,
    ranks=ANY_RANK,
    needs=HESSIAN_PRODUCT,
    tasks=("classify", "segment"),
    formula="w_k = mean_ij (g - H A / 2)^k_ij, H A: the Hessian of the score times A",
    paper="Cai, arXiv:2501.06261, 2025",
    cost="a second backward pass through the first (`create_graph`)",
)
