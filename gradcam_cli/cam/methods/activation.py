"""Methods that read only the layer's activations, no gradients, one map for every target (class-agnostic):
Eigen-CAM, KPCA-CAM and FEM. Formulas and papers are in the docstrings; where pytorch-grad-cam (1.5.x) computes
something else, the docstring says so and docs/methods.md says why."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..smoothing import combine, first_component, spatial_dims
from .registry import ANY_RANK, CamMethod

KPCA_COEF0 = 1.0
"""KPCA-CAM's sigmoid kernel k(x, y) = tanh(gamma <x, y> + coef0): its offset (scikit-learn's default)."""
KPCA_MAX_POSITIONS = 400
"""The most positions KPCA-CAM decomposes (20 x 20): its kernel matrix has (h*w)^2 entries, so a larger layer is
average-pooled by a whole factor to fit first, and its map comes at that coarser grid."""
FEM_SIGMAS = 2.0
"""FEM's threshold: a position counts when its activation exceeds the channel's mean by this many standard
deviations (the paper's k-sigma rule, k = 2)."""


def eigencam(
    activations: torch.Tensor, gradients: torch.Tensor | None = None, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Eigen-CAM (Muhammad & Yeasin, "Eigen-CAM: Class Activation Map using Principal Components", IJCNN 2020).

    L = ReLU(A_c v_1): the activations' first principal component, where A_c is the (h*w, C) activation matrix
    with each channel centred (as pytorch-grad-cam does; the paper decomposes A itself) and v_1 its first right
    singular vector, signed so that its loadings sum positive (the map correlates with sum_k A^k; pytorch-grad-cam
    leaves the sign to the SVD routine). Class-agnostic: no gradients, one map for every target.
    ``eigen_smooth`` changes nothing: the map already is a first principal component.
    """
    return torch.relu(first_component(activations))


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


def fem(
    activations: torch.Tensor, gradients: torch.Tensor | None = None, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """FEM, the Feature Explanation Method (Fuad et al., "Features understanding in 3D CNNs for actions
    recognition in video", IPTA 2020), as pytorch-grad-cam's ``FEM`` computes it.

    B^k_ij = [A^k_ij > mu_k + 2 sigma_k] (mu_k, sigma_k: channel k's mean and population standard deviation over
    the positions); w_k = mean_{i,j} B^k_ij, the share of the channel's positions that stand out;
    L = ReLU(sum_k w_k A^k). Class-agnostic: no gradients, one map for every target.
    """
    grid = spatial_dims(activations)
    mean = activations.mean(dim=grid, keepdim=True)
    spread = activations.std(dim=grid, keepdim=True, correction=0)
    weights = (activations > mean + FEM_SIGMAS * spread).to(activations.dtype).mean(dim=grid, keepdim=True)
    return combine(weights * activations, eigen_smooth)


EIGENCAM = CamMethod(
    "eigencam",
    eigencam,
    ranks=ANY_RANK,
    uses_gradients=False,
    class_agnostic=True,
    formula="ReLU(first principal component of the activations)",
    paper="Muhammad & Yeasin, IJCNN 2020",
    cost="none (class-agnostic)",
)

KPCACAM = CamMethod(
    "kpcacam",
    kpcacam,
    uses_gradients=False,
    class_agnostic=True,
    formula="ReLU(first kernel principal component of the activations), sigmoid kernel tanh(<x, y> / C + 1)",
    paper="Karmani et al., arXiv:2410.00267, 2024",
    cost="an eigendecomposition of (h w)^2 (class-agnostic)",
)

FEM = CamMethod(
    "fem",
    fem,
    ranks=ANY_RANK,
    uses_gradients=False,
    class_agnostic=True,
    formula="w_k = share of channel k's positions above mean_k + 2 std_k",
    paper="Fuad et al., IPTA 2020",
    cost="none (class-agnostic)",
)
