"""Independent references for the CAM methods: pytorch-grad-cam, and the papers' formulas where it departs from them.

pytorch-grad-cam (``pip install grad-cam``) is used as is for Grad-CAM, HiResCAM and LayerCAM. Where it departs
from the paper, the subclasses below change exactly that one step and nothing else (hooks, ReLU, cv2 resizing,
min-max normalisation and multi-layer fusion stay pytorch-grad-cam's):

* Grad-CAM++: pytorch-grad-cam's denominator has Eq. 19's form, 2 g^2 + (sum_ab A_ab) g^3, but it adds eps=1e-6.
  With random weights |g| is ~1e-4, 2 g^2 ~ 1e-8, so the eps dominates and alpha becomes ~g^2 * 1e6 instead of
  ~1/2. :class:`PaperGradCAMPlusPlus` evaluates Eq. 19 without eps, in float64 (alpha = 0 where the denominator is
  0, as in the authors' code).
* XGrad-CAM: pytorch-grad-cam divides by sum_ab A_ab + 1e-7; random-weight EfficientNet/MobileNetV3 activations
  are ~1e-13, so the eps dominates. :class:`PaperXGradCAM` divides by the sum itself (float64; weight 0 where it
  is 0).
* Eigen-CAM / eigen-smooth: the sign of an SVD component is arbitrary and pytorch-grad-cam keeps whatever LAPACK
  returns. :class:`SignedEigenCAM` and :func:`signed_projection` use its own ``get_2d_projection`` and then orient
  the result to correlate positively with the channel sum (gradcam-cli's documented convention).
* Score-CAM: pytorch-grad-cam weights channels by a softmax *across channels* of the masked inputs' target logits;
  the authors' code (github.com/haofanwang/Score-CAM) uses each masked input's softmax probability of the target
  class. :func:`paper_scorecam` re-implements the authors' loop (one masked input per channel; the masked inputs
  go through the network a chunk of channels at a time, written apart from gradcam-cli's own batching).
"""

from __future__ import annotations

import numpy as np
import pytorch_grad_cam as pgc
import torch
import torch.nn.functional as F
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from pytorch_grad_cam.utils.svd_on_activations import get_2d_projection
from torch import nn


def pearson(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Pearson correlation of two maps, flattened (float64)."""
    x = torch.as_tensor(np.asarray(a), dtype=torch.float64).flatten()
    y = torch.as_tensor(np.asarray(b), dtype=torch.float64).flatten()
    x, y = x - x.mean(), y - y.mean()
    return float((x @ y) / (x.norm() * y.norm()))


def signed_projection(weighted: np.ndarray) -> np.ndarray:
    """pytorch-grad-cam's ``get_2d_projection``, each map's sign chosen to correlate with the channel sum."""
    projection = get_2d_projection(weighted)
    total = weighted.sum(axis=1)
    centred = total - total.mean(axis=(1, 2), keepdims=True)
    sign = np.where((projection * centred).sum(axis=(1, 2)) < 0, -1.0, 1.0)
    return np.float32(projection * sign[:, None, None])


class _SignedEigenSmooth:
    """Mixin: pytorch-grad-cam's ``get_cam_image`` with the eigen-smooth sign fixed (weight-based methods)."""

    def get_cam_image(self, input_tensor, target_layer, targets, activations, grads, eigen_smooth=False):
        if not eigen_smooth:
            return super().get_cam_image(input_tensor, target_layer, targets, activations, grads, eigen_smooth)
        weights = self.get_cam_weights(input_tensor, target_layer, targets, activations, grads)
        return signed_projection(weights[:, :, None, None] * activations)


class PaperGradCAMPlusPlus(_SignedEigenSmooth, pgc.GradCAMPlusPlus):
    """Grad-CAM++ weights by Eq. 19 of Chattopadhay et al. (2018), without pytorch-grad-cam's eps."""

    def get_cam_weights(self, input_tensor, target_layers, targets, activations, grads):
        a, g = activations.astype(np.float64), grads.astype(np.float64)
        g2, g3 = g**2, g**3
        denominator = 2 * g2 + a.sum(axis=(2, 3), keepdims=True) * g3
        alpha = np.divide(g2, denominator, out=np.zeros_like(g2), where=denominator != 0)
        return (alpha * np.maximum(g, 0)).sum(axis=(2, 3)).astype(np.float32)


class PaperXGradCAM(_SignedEigenSmooth, pgc.XGradCAM):
    """XGrad-CAM weights of Fu et al. (2020), without pytorch-grad-cam's eps on the channel sums."""

    def get_cam_weights(self, input_tensor, target_layer, targets, activations, grads):
        a, g = activations.astype(np.float64), grads.astype(np.float64)
        totals = a.sum(axis=(2, 3))
        products = (g * a).sum(axis=(2, 3))
        return np.divide(products, totals, out=np.zeros_like(totals), where=totals != 0).astype(np.float32)


class SignedGradCAM(_SignedEigenSmooth, pgc.GradCAM):
    """pytorch-grad-cam's Grad-CAM; eigen-smooth sign fixed."""


class SignedEigenCAM(pgc.EigenCAM):
    """pytorch-grad-cam's Eigen-CAM with the component's sign fixed (it leaves it to LAPACK)."""

    def get_cam_image(self, input_tensor, target_layer, targets, activations, grads, eigen_smooth=False):
        return signed_projection(activations)


class _SignedElementwise:
    def get_cam_image(self, input_tensor, target_layer, targets, activations, grads, eigen_smooth=False):
        weighted = self.weighted(activations, grads)
        return signed_projection(weighted) if eigen_smooth else weighted.sum(axis=1)


class SignedHiResCAM(_SignedElementwise, pgc.HiResCAM):
    """pytorch-grad-cam's HiResCAM (eigen-smooth sign fixed, its warning print left out)."""

    @staticmethod
    def weighted(activations, grads):
        return grads * activations


class SignedLayerCAM(_SignedElementwise, pgc.LayerCAM):
    """pytorch-grad-cam's LayerCAM (eigen-smooth sign fixed)."""

    @staticmethod
    def weighted(activations, grads):
        return np.maximum(grads, 0) * activations


PYTORCH_GRAD_CAM = {
    "gradcam": pgc.GradCAM,
    "gradcam++": pgc.GradCAMPlusPlus,
    "xgradcam": pgc.XGradCAM,
    "hirescam": pgc.HiResCAM,
    "layercam": pgc.LayerCAM,
    "eigencam": pgc.EigenCAM,
    "scorecam": pgc.ScoreCAM,
}
"""pytorch-grad-cam's classes, unchanged."""

TRUSTED = {
    "gradcam": SignedGradCAM,
    "gradcam++": PaperGradCAMPlusPlus,
    "xgradcam": PaperXGradCAM,
    "hirescam": SignedHiResCAM,
    "layercam": SignedLayerCAM,
    "eigencam": SignedEigenCAM,
}
"""The reference each method is held to (scorecam: :func:`paper_scorecam`)."""


def reference_map(
    cam_class: type,
    model: nn.Module,
    layers: list[nn.Module],
    inputs: torch.Tensor,
    target: int,
    reshape=None,
    eigen_smooth: bool = False,
) -> np.ndarray:
    """The (H, W) map pytorch-grad-cam (or a subclass above) gives for ``target`` on a one-image batch."""
    cam = cam_class(model=model, target_layers=layers, reshape_transform=reshape)
    try:
        return cam(input_tensor=inputs, targets=[ClassifierOutputTarget(target)], eigen_smooth=eigen_smooth)[0]
    finally:
        cam.activations_and_grads.release()


def _layer_output(model: nn.Module, layer: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    saved = {}
    handle = layer.register_forward_hook(lambda _m, _i, output: saved.update(a=output.detach()))
    with torch.no_grad():
        model(inputs)
    handle.remove()
    return saved["a"]


def paper_scorecam(model: nn.Module, layer: nn.Module, inputs: torch.Tensor, target: int) -> torch.Tensor:
    """Score-CAM as the authors' code computes it, one masked input per channel: an (H, W) map in [0, 1]."""
    weights = paper_scorecam_weights(model, layer, inputs, target).double()
    upsampled = F.interpolate(_layer_output(model, layer, inputs), size=inputs.shape[-2:], mode="bilinear")[0]
    result = torch.relu((weights[:, None, None] * upsampled.double()).sum(dim=0))
    return (result - result.min()) / (result.max() - result.min())


def paper_scorecam_weights(
    model: nn.Module, layer: nn.Module, inputs: torch.Tensor, target: int, chunk: int = 32
) -> torch.Tensor:
    """The per-channel Score-CAM weights of the authors' loop (0 for a constant channel): shape (C,).

    The authors' per-channel masking and softmax, with the masked inputs of ``chunk`` channels stacked into one
    forward pass (an eval-mode network scores each row of a batch on its own, so the weights are the loop's).
    """
    activations = _layer_output(model, layer, inputs)
    weights = torch.zeros(activations.shape[1])
    with torch.no_grad():
        for start in range(0, activations.shape[1], chunk):
            kept, masked = [], []
            for k in range(start, min(start + chunk, activations.shape[1])):
                upsampled = F.interpolate(activations[:, k : k + 1], size=inputs.shape[-2:], mode="bilinear")
                if upsampled.max() == upsampled.min():
                    continue
                mask = (upsampled - upsampled.min()) / (upsampled.max() - upsampled.min())
                kept.append(k)
                masked.append(inputs * mask)
            if kept:
                weights[kept] = F.softmax(model(torch.cat(masked)), dim=1)[:, target]
    return weights
