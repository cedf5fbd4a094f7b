"""The ``toy-saliency`` method: gradient times activation, absolute, summed over channels.

L_ij = sum_k |g^k_ij A^k_ij|, where A is the layer's (N, C, h, w) activations and g = dS/dA the gradient of the
target's score: where the layer's features change the score most, in either direction (unlike HiResCAM's
ReLU(sum_k g^k A^k), which keeps only what raises it).

TODO(reg-methods): register it through the method registry (gradcam_cli.cam.methods) once that lands on main; until
then importing this module (the ``gradcam_cli.methods`` entry point) registers nothing.
"""

from __future__ import annotations

import torch


def toy_saliency(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """L_ij = sum_k |g^k_ij A^k_ij| (``eigen_smooth`` does not apply: the map is already one sum)."""
    return (gradients * activations).abs().sum(dim=1)
