"""The newer CAM methods and the noise baseline: small pure functions of a layer's activations A and gradients
g = dS/dA (and, for ShapleyCAM, the Hessian-vector product H A), each (N, C, h, w) -> (N, h, w), registered in
:data:`gradcam_cli.cam.methods.METHODS`. Formulas and papers are in the docstrings; where pytorch-grad-cam (1.5.x)
computes something else, the docstring says so and docs/methods.md says why.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .smoothing import combine

KPCA_COEF0 = 1.0
"""KPCA-CAM's sigmoid kernel k(x, y) = tanh(gamma <x, y> + coef0): its offset (scikit-learn's default)."""
KPCA_MAX_POSITIONS = 400
"""The most positions KPCA-CAM decomposes (20 x 20): its kernel matrix has (h*w)^2 entries, so a larger layer is
average-pooled by a whole factor to fit first, and its map comes at that coarser grid."""
FEM_SIGMAS = 2.0
"""FEM's threshold: a position counts when its activation exceeds the channel's mean by this many standard
deviations (the paper's k-sigma rule, k = 2)."""


def gradcam_elementwise(
    activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Grad-CAM element-wise (pytorch-grad-cam's ``GradCAMElementWise``, J. Gildenblat et al., 2021), after Grad-CAM
    (Selvaraju et al., ICCV 2017) and HiResCAM (Draelos & Carin, 2020).

    L = sum_k ReLU(g^k ⊙ A^k): the gradient multiplies each position, and only the positive products count, before
    the channels are summed (HiResCAM sums first, then takes the ReLU).
    """
    return combine(torch.relu(gradients * activations), eigen_smooth)


def kernel_first_component(activations: torch.Tensor, coef0: float = KPCA_COEF0) -> torch.Tensor:
    """(N, C, h, w) -> (N, h, w): each position's coordinate on the first kernel principal component.

    The h*w positions are samples of C features, each feature centred over the positions; the sigmoid kernel
    K_ij = tanh(gamma <x_i, x_j> + coef0) with gamma = 1 / C (scikit-learn's ``KernelPCA`` defaults) is centred in
    feature space, K~ = K - 1K - K1 + 1K1 (1: the matrix of 1/(h*w)), and its leading eigenpair (lambda, v) gives the
    coordinates v sqrt(lambda) (lambda clamped at 0). The sign, arbitrary in an eigenvector, is chosen so that the
    component correlates positively with the centred channel sum sum_k A^k (as :func:`eigencam`'s rule).
    Computed in float64 (float32 on MPS) with a dense eigendecomposition, O((h*w)^3): a millisecond at 7 x 7, a
    tenth of a second at 20 x 20; a layer with more than :data:`KPCA_MAX_POSITIONS` positions is average-pooled to
    fit first, and the map comes at the pooled grid.
    """
    factor = math.ceil(math.sqrt(activations.shape[2] * activations.shape[3] / KPCA_MAX_POSITIONS))
    if factor > 1:
        activations = F.avg_pool2d(activations, factor, ceil_mode=True)
    n, channels, h, w = activations.shape
    dtype = torch.float32 if activations.device.type == "mps" else torch.float64
    samples = torch.nan_to_num(activations.to(dtype)).flatten(2).transpose(1, 2)  # (N, h*w, C)
    centred = samples - samples.mean(dim=1, keepdim=True)
    kernel = torch.tanh(centred @ centred.transpose(1, 2) / channels + coef0)
    kernel = (
        kernel
        - kernel.mean(dim=1, keepdim=True)
        - kernel.mean(dim=2, keepdim=True)
        + kernel.mean(dim=(1, 2), keepdim=True)
    )
    values, vectors = torch.linalg.eigh(kernel)
    projection = vectors[:, :, -1] * values[:, -1:].clamp_min(0).sqrt()  # (N, h*w)
    agreement = (projection * centred.sum(dim=2)).sum(dim=1, keepdim=True)
    projection = torch.where(agreement < 0, -projection, projection)
    return projection.view(n, h, w).to(activations.dtype)


def kpcacam(
    activations: torch.Tensor, gradients: torch.Tensor | None = None, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """KPCA-CAM (Karmani et al., "KPCA-CAM: Visual Explainability of Deep Computer Vision Models using Kernel
    PCA", arXiv:2410.00267, 2024): Eigen-CAM with kernel PCA in place of PCA.

    L = ReLU(first kernel principal component of the activations), the sigmoid kernel tanh(<x, y> / C + 1) over
    the positions' channel vectors (see :func:`kernel_first_component`; pytorch-grad-cam's default kernel and
    parameters, through scikit-learn, which signs the component so that its largest entry is positive; ours
    correlates positively with the channel sum). Class-agnostic: no gradients, one map for every target.
    ``eigen_smooth`` changes nothing.
    """
    return torch.relu(kernel_first_component(activations))


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
    weights = (gradients - 0.5 * hessian).mean(dim=(2, 3), keepdim=True)
    return combine(weights * activations, eigen_smooth)


def fem(
    activations: torch.Tensor, gradients: torch.Tensor | None = None, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """FEM, the Feature Explanation Method (Fuad et al., "Features understanding in 3D CNNs for actions
    recognition in video", IPTA 2020), as pytorch-grad-cam's ``FEM`` computes it.

    B^k_ij = [A^k_ij > mu_k + 2 sigma_k] (mu_k, sigma_k: channel k's mean and population standard deviation over
    the positions); w_k = mean_{i,j} B^k_ij, the share of the channel's positions that stand out;
    L = ReLU(sum_k w_k A^k). Class-agnostic: no gradients, one map for every target.
    """
    mean = activations.mean(dim=(2, 3), keepdim=True)
    spread = activations.std(dim=(2, 3), keepdim=True, correction=0)
    weights = (activations > mean + FEM_SIGMAS * spread).to(activations.dtype).mean(dim=(2, 3), keepdim=True)
    return combine(weights * activations, eigen_smooth)


def image_seeds(seed: int, inputs: torch.Tensor) -> list[int]:
    """One seed per image of the (N, ...) ``inputs``: a hash of ``seed`` and the image's own input values, so an
    image draws the same noise whatever batch, shard or resumed run it is in, and two images draw different noise."""
    rows = inputs.detach().to("cpu", torch.float32).contiguous()
    return [
        int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=8, key=str(seed).encode()).digest(), "big")
        >> 1
        for row in rows
    ]


def randomcam(
    activations: torch.Tensor,
    gradients: torch.Tensor | None,
    seed: int | Sequence[int],
    *,
    eigen_smooth: bool = False,
) -> torch.Tensor:
    """A noise baseline (after pytorch-grad-cam's ``RandomCAM``, whose noise is in the channel weights instead):
    the floor every method must beat, in ``gradcam eval --rank``.

    L_ij = u_ij, u_ij ~ U(0, 1) independently at every position of the layer's (h, w) grid, drawn on the CPU
    from a generator seeded with ``seed``: one seed per image (:func:`image_seeds`, as the explainer passes it), or
    one for the whole batch (then every image of it gets the same noise). The same seed and shape give the same map
    on every device; the model plays no part, so the sanity check flags it. Class-agnostic; ``eigen_smooth``
    changes nothing.
    """
    n, _, h, w = activations.shape
    seeds = [seed] * n if isinstance(seed, int) else list(seed)
    noise = torch.stack([torch.rand(h, w, generator=torch.Generator().manual_seed(s)) for s in seeds])
    return noise.to(activations.device, activations.dtype)
