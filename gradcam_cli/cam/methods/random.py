"""randomcam, the noise baseline: the floor every method must beat in ``gradcam eval --rank``."""

from __future__ import annotations

import torch

from .needs import SEED
from .registry import CamMethod


def randomcam(
    activations: torch.Tensor, gradients: torch.Tensor | None, seed: int, *, eigen_smooth: bool = False
) -> torch.Tensor:
    """A noise baseline (after pytorch-grad-cam's ``RandomCAM``, whose noise is in the channel weights instead):
    the floor every method must beat, in ``gradcam eval --rank``.

    L_ij = u_ij, u_ij ~ U(0, 1) independently at every position of the layer's (h, w) grid, drawn on the CPU
    from a generator seeded with ``seed`` (the same seed and shape give the same map on every device); the model
    plays no part, so the sanity check flags it. Class-agnostic; ``eigen_smooth`` changes nothing.
    """
    n, _, h, w = activations.shape
    noise = torch.rand(n, h, w, generator=torch.Generator().manual_seed(seed))
    return noise.to(activations.device, activations.dtype)


RANDOMCAM = CamMethod(
    "randomcam",
    randomcam,
    uses_gradients=False,
    needs=SEED,
    class_agnostic=True,
    formula="L_ij ~ U(0, 1), seeded (`--seed`): the floor every method must beat",
    paper="after pytorch-grad-cam's RandomCAM",
    cost="none",
)
