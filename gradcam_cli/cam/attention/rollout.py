"""Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", ACL 2020)."""

from __future__ import annotations

import torch

from .tokens import AttentionMaps, fuse_heads, identity_like, patch_map


def rollout_relevance(maps: AttentionMaps, fusion: str | None = None) -> torch.Tensor:
    """R = Ã_L ... Ã_1 (N, L, L), with Ã_l = rows renormalised of (Ā_l + I), Ā_l the ``fusion`` of A_l over heads
    (:func:`~gradcam_cli.cam.attention.tokens.fuse_heads`; ``None``: ``maps.heads``, the mean unless asked).

    With the mean, Ā_l's rows sum to 1, so Ã_l = 0.5 Ā_l + 0.5 I as in the paper, which accounts for the residual
    connection; no discard ratio. The first layer is multiplied in first (R <- Ã_l R).
    """
    relevance: torch.Tensor | None = None
    for attention in maps.probabilities:
        attention = attention.float()
        fused = fuse_heads(attention, fusion or maps.heads)
        augmented = fused + identity_like(attention)
        augmented = augmented / augmented.sum(dim=-1, keepdim=True)
        relevance = augmented if relevance is None else augmented @ relevance
    if relevance is None:
        raise ValueError("attention rollout needs at least one layer")
    return relevance


def rollout(maps: AttentionMaps, fusion: str | None = None) -> torch.Tensor:
    """Attention rollout's (N, h, w) map: R[0, P:] of :func:`rollout_relevance` on the patch grid
    (:func:`~gradcam_cli.cam.attention.tokens.patch_map`). Class-agnostic: no gradients, one map for every target.
    Costs about one forward pass (the probabilities come with it) and L products of L x L matrices."""
    return patch_map(rollout_relevance(maps, fusion), maps)
