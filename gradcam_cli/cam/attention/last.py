"""The last layer's class-token attention (the map DINO shows; Caron et al., "Emerging Properties in
Self-Supervised Vision Transformers", ICCV 2021): a baseline, the ``attention`` method."""

from __future__ import annotations

import torch

from .tokens import AttentionMaps, fuse_heads, patch_map


def last_attention(maps: AttentionMaps, head: int | None = None) -> torch.Tensor:
    """(N, h, w): A_L[0, P:], the last layer's attention from the class token to the patches, its heads fused as
    ``maps.heads`` says (the mean unless asked; ``head``: that head's alone). Without a class token, the mean over
    the patch rows. Class-agnostic."""
    attention = maps.probabilities[-1].float()
    fused = fuse_heads(attention, maps.heads) if head is None else attention[:, head]
    return patch_map(fused, maps)
