"""randomcam, the noise baseline: the floor every method must beat in ``gradcam eval --rank``."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from .needs import SEED
from .registry import ANY_RANK, CamMethod


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

    L_ij = u_ij, u_ij ~ U(0, 1) independently at every position of the layer's (h, w) grid (or its grid of another
    rank), drawn on the CPU from a generator seeded with ``seed``: one seed per image (:func:`image_seeds`, as the
    explainer passes it), or one for the whole batch (then every image of it gets the same noise). The same seed and
    shape give the same map on every device; the model plays no part, so the sanity check flags it. Class-agnostic;
    ``eigen_smooth`` changes nothing.
    """
    n, grid = activations.shape[0], activations.shape[2:]
    seeds = [seed] * n if isinstance(seed, int) else list(seed)
    noise = torch.stack([torch.rand(grid, generator=torch.Generator().manual_seed(s)) for s in seeds])
    return noise.to(activations.device, activations.dtype)


RANDOMCAM = CamMethod(
    "randomcam",
    randomcam,
    ranks=ANY_RANK,
    uses_gradients=False,
    needs=SEED,
    class_agnostic=True,
    formula="L_ij ~ U(0, 1), seeded per image by `--seed` and the image's own input values ([notes](#method-notes)): "
    "the floor every method must beat",
    paper="after pytorch-grad-cam's RandomCAM",
    cost="none",
)
