"""The ``toy-saliency`` method, registered under the ``gradcam_cli.methods`` entry point ``toy-saliency``, which
names :data:`TOY_SALIENCY` (the entry point's name must be the method's: the command line accepts it as
``--method toy-saliency`` before anything is imported). It reads only the layer's activations and the score's
gradient, so it serves every task (``tasks`` left at its default): the plugin's ``count`` task takes it too."""

from __future__ import annotations

import torch

from gradcam_cli.cam.methods.registry import CamMethod


def toy_saliency(activations: torch.Tensor, gradients: torch.Tensor, *, eigen_smooth: bool = False) -> torch.Tensor:
    """Gradient times activation, absolute, summed over channels: L_ij = sum_k |g^k_ij A^k_ij|.

    A is the layer's (N, C, h, w) activations and g = dS/dA the gradient of the target's score: the map shows where
    the layer's features change the score most, in either direction (HiResCAM's ReLU(sum_k g^k A^k) keeps only what
    raises it). ``eigen_smooth`` does not apply: the map is one sum already."""
    return (gradients * activations).abs().sum(dim=1)


TOY_SALIENCY = CamMethod(
    "toy-saliency",
    toy_saliency,
    formula="sum_k |g^k ⊙ A^k|",
    paper="the example plugin (tests/plugins/example_plugin)",
    cost="one backward pass",
)
