"""The Grad-CAM family: methods that weigh a layer's activations A by the gradient g = dS/dA of the target's
score, from the one backward pass per target they share (Grad-CAM, Grad-CAM++, XGrad-CAM, HiResCAM, LayerCAM,
Eigen-Grad-CAM, Grad-CAM element-wise, RefineCAM over several layers, and Seg-Eigen-CAM for segmenters). Each is a
pure function (N, C, h, w) -> (N, h, w), formula and paper in its docstring, and takes a grid of any rank alike
((N, C, l), (N, C, t, h, w)): sums and means over i, j are over every position of the grid."""

from __future__ import annotations

import torch

from ..smoothing import combine, first_component, spatial_dims
from .registry import ANY_RANK, CLASSIFY, SEGMENT, CamMethod


def _spatial_sum(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.sum(dim=spatial_dims(tensor), keepdim=True)


def gradcam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """Grad-CAM (Selvaraju et al., "Grad-CAM: Visual Explanations from Deep Networks", ICCV 2017).

    w_k = mean_{i,j} g^k_{ij};  L = ReLU(sum_k w_k A^k).
    """
    weights = gradients.mean(dim=spatial_dims(gradients), keepdim=True)
    return combine(weights * activations, eigen_smooth)


def gradcam_plus_plus(
    activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Grad-CAM++ (Chattopadhay et al., "Grad-CAM++: Improved Visual Explanations for Deep Convolutional
    Networks", WACV 2018), Eq. 19 with the exponential score Y^c = exp(S^c) of Sec. 3.3.

    alpha^k_{ij} = g_{ij}^2 / (2 g_{ij}^2 + sum_{a,b} A^k_{ab} g_{ij}^3)  (zero where that denominator is zero);
    w_k = sum_{i,j} alpha^k_{ij} ReLU(g^k_{ij});  L = ReLU(sum_k w_k A^k).

    With Y = exp(S) and a piecewise-linear network, dY/dA = exp(S) g, d2Y/dA2 = exp(S) g^2, d3Y/dA3 = exp(S) g^3:
    exp(S) cancels in alpha and scales every w_k alike, so it vanishes once the map is normalised. The sum in the
    denominator is over the *activations* only (sum_ab A_ab times g_ij^3); implementations that sum
    A_ab * g_ab^3 instead get Eq. 19 wrong. alpha is evaluated as 1 / (2 + g_ij sum_ab A_ab) for g_ij != 0, the
    same quotient without the g^2 and g^3 that underflow for small gradients; pytorch-grad-cam instead adds 1e-6 to
    the denominator, which dominates 2 g^2 when |g| < ~1e-3 (as with random weights) and changes the map there.
    """
    totals = _spatial_sum(activations)
    denominator = 2 + totals * gradients
    usable = (gradients != 0) & (denominator != 0)
    alpha = torch.where(usable, 1 / torch.where(usable, denominator, torch.ones_like(denominator)), 0.0)
    weights = _spatial_sum(alpha * torch.relu(gradients))
    return combine(weights * activations, eigen_smooth)


def xgradcam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """XGrad-CAM (Fu et al., "Axiom-based Grad-CAM: Towards Accurate Visualization and Explanation of CNNs",
    BMVC 2020).

    w_k = sum_{i,j} (A^k_{ij} / sum_{a,b} A^k_{ab}) g^k_{ij}  (zero for a channel whose activations sum to 0);
    L = ReLU(sum_k w_k A^k).
    """
    totals = _spatial_sum(activations)
    safe = torch.where(totals != 0, totals, torch.ones_like(totals))
    weights = torch.where(totals != 0, _spatial_sum(gradients * activations) / safe, 0.0)
    return combine(weights * activations, eigen_smooth)


def hirescam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """HiResCAM (Draelos & Carin, "Use HiResCAM instead of Grad-CAM for faithful explanations of convolutional
    neural networks", arXiv:2011.08891, 2020).

    L = ReLU(sum_k g^k ⊙ A^k): the gradient multiplies each position instead of being averaged first. (With
    eigen-smooth the map is no longer the exact score decomposition the paper proves.)
    """
    return combine(gradients * activations, eigen_smooth)


def layercam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """LayerCAM (Jiang et al., "LayerCAM: Exploring Hierarchical Class Activation Maps for Localization",
    IEEE TIP 30, 2021).

    L = ReLU(sum_k ReLU(g^k) ⊙ A^k): only positive gradients count, position by position.
    """
    return combine(torch.relu(gradients) * activations, eigen_smooth)


def eigengradcam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """Eigen-Grad-CAM (pytorch-grad-cam's ``EigenGradCAM``, J. Gildenblat et al., 2021): Eigen-CAM (Muhammad &
    Yeasin, IJCNN 2020) of the gradient-weighted activations, which makes it class-discriminative.

    L = ReLU(first principal component of g ⊙ A): the (h*w, C) matrix of g^k_ij A^k_ij with each channel centred,
    projected on its first right singular vector, signed so that the map correlates positively with
    sum_k g^k ⊙ A^k (pytorch-grad-cam keeps the sign the SVD returns). ``eigen_smooth`` changes nothing.
    """
    return combine(gradients * activations, eigen_smooth=True)


def gradcam_elementwise(
    activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """Grad-CAM element-wise (pytorch-grad-cam's ``GradCAMElementWise``, J. Gildenblat et al., 2021), after Grad-CAM
    (Selvaraju et al., ICCV 2017) and HiResCAM (Draelos & Carin, 2020).

    L = sum_k ReLU(g^k ⊙ A^k): the gradient multiplies each position, and only the positive products count, before
    the channels are summed (HiResCAM sums first, then takes the ReLU).
    """
    return combine(torch.relu(gradients * activations), eigen_smooth)


def refinecam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """RefineCAM (Domeniconi et al., "How to Evaluate and Refine your CAM", ICPR 2026, arXiv:2605.14641): one
    layer's part, Grad-CAM++ (:func:`gradcam_plus_plus`, Eq. 19 as there); the layers' maps fuse by their product.

    M_l = Grad-CAM++ map of layer l;  L = N(prod_l N(Up(N(M_l)))), N: min-max normalisation to [0, 1], Up: bilinear
    upsampling to the input's pixels; l: the layers given, or (one or none given) the model's last 4 stages
    (:func:`~gradcam_cli.cam.layers.stage_layers`). A position counts only where every layer's map is high: the
    coarse last stage says where, the finer stages sharpen it, and the noise of an early layer's map is cut away
    where the later stages are low.

    The product is the registration's ``fusion`` (:func:`gradcam_cli.cam.maps.fuse`), done where every method's
    maps of several layers fuse. Grad-CAM++ is the base method of the authors' code and of pytorch-grad-cam's and
    torchcam's ``RefineCAM`` (which take any other as ``base_method``; here it is Grad-CAM++ alone). The choices and
    where the peers differ are in docs/methods.md (RefineCAM).
    """
    return gradcam_plus_plus(activations, gradients, eigen_smooth=eigen_smooth)


def segeigencam(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """Seg-Eigen-CAM (Chung & Ying, "Seg-Eigen-CAM: Eigen-Value-Based Visual Explanations for Semantic Segmentation
    Models", Applied Sciences 15(13), 7562, 2025), for segmenters: Eigen-CAM of the gradient-weighted activations.

    W = |g| ⊙ A (Sec. 3.2.1, Eq. 10: the absolute gradient weighs each position, so negative gradients count too);
    P = the first principal component of W (Eqs. 11-12: the h*w positions are samples of C features, each channel
    centred over the positions, projected on the first right singular vector); P is negated where |min P| > |max P|
    (Sec. 3.2.2, Eq. 13: the sign correction, so that the largest deviation is positive); L = ReLU(P).

    Choices: the channels are centred before the decomposition, as pytorch-grad-cam's ``SegEigenCAM`` (1.5.7,
    ``get_2d_projection_with_sign_correction``) and this package's Eigen-CAM do. The sign is the paper's Eq. 13,
    not Eigen-CAM's rule here (loadings summing positive): the two differ where the component's largest deviation
    and its loadings disagree. The score differentiated is the segmenter's region score of the explained class
    (the class's logits summed over the pixels it wins, :mod:`gradcam_cli.cam.segmentation`), pytorch-grad-cam's
    ``SemanticSegmentationTarget``. ``eigen_smooth`` changes nothing: the map already is a first principal component.
    """
    projection = first_component(gradients.abs() * activations)
    flat = projection.flatten(1)
    flip = flat.amin(dim=1).abs() > flat.amax(dim=1).abs()
    sign = torch.where(flip, -1.0, 1.0).to(projection.dtype).view(-1, *(1,) * (projection.dim() - 1))
    return torch.relu(projection * sign)


GRADCAM = CamMethod(
    "gradcam",
    gradcam,
    ranks=ANY_RANK,
    formula="ReLU(sum_k w_k A^k), w_k = mean_ij g^k_ij",
    paper="Selvaraju et al., ICCV 2017",
    cost="one backward pass",
)

GRADCAM_PLUS_PLUS = CamMethod(
    "gradcam++",
    gradcam_plus_plus,
    ranks=ANY_RANK,
    formula="w_k = sum_ij alpha^k_ij ReLU(g^k_ij), alpha^k_ij = g^2 / (2 g^2 + sum_ab A^k_ab g^3)",
    paper="Chattopadhay et al., WACV 2018, Eq. 19",
    cost="one backward pass",
)

XGRADCAM = CamMethod(
    "xgradcam",
    xgradcam,
    ranks=ANY_RANK,
    formula="w_k = sum_ij (A^k_ij / sum_ab A^k_ab) g^k_ij",
    paper="Fu et al., BMVC 2020",
    cost="one backward pass",
)

HIRESCAM = CamMethod(
    "hirescam",
    hirescam,
    ranks=ANY_RANK,
    formula="ReLU(sum_k g^k ⊙ A^k)",
    paper="Draelos & Carin, 2020",
    cost="one backward pass",
)

LAYERCAM = CamMethod(
    "layercam",
    layercam,
    ranks=ANY_RANK,
    formula="ReLU(sum_k ReLU(g^k) ⊙ A^k)",
    paper="Jiang et al., IEEE TIP 2021",
    cost="one backward pass",
)

EIGENGRADCAM = CamMethod(
    "eigengradcam",
    eigengradcam,
    ranks=ANY_RANK,
    formula="ReLU(first principal component of g ⊙ A)",
    paper="pytorch-grad-cam's EigenGradCAM, after Muhammad & Yeasin 2020",
    cost="one backward pass",
)

GRADCAM_ELEMENTWISE = CamMethod(
    "gradcam-elementwise",
    gradcam_elementwise,
    ranks=ANY_RANK,
    formula="ReLU(sum_k ReLU(g^k ⊙ A^k))",
    paper="pytorch-grad-cam's GradCAMElementWise, after Selvaraju et al. 2017",
    cost="one backward pass",
)

REFINECAM = CamMethod(
    "refinecam",
    refinecam,
    tasks=CLASSIFY,
    fusion="product",
    stages=4,
    formula="prod_l Up(Grad-CAM++ of layer l), each normalised; l: the last 4 stages ([RefineCAM](#refinecam))",
    paper="Domeniconi et al., ICPR 2026",
    cost="one backward pass, to the earliest of its layers",
)

SEGEIGENCAM = CamMethod(
    "segeigencam",
    segeigencam,
    ranks=ANY_RANK,
    tasks=SEGMENT,
    formula="ReLU(first principal component of abs(g) ⊙ A), negated where abs(min) > abs(max)",
    paper="Chung & Ying, Appl. Sci. 2025",
    cost="one backward pass",
)
