"""Gradient-weighted attention relevance (Chefer, Gur & Wolf, "Generic Attention-model Explainability for
Interpreting Bi-Modal and Encoder-Decoder Transformers", ICCV 2021), the ``attn-grad`` method."""

from __future__ import annotations

import torch

from .tokens import AttentionMaps, identity_like, patch_map


def gradient_relevance(maps: AttentionMaps) -> torch.Tensor:
    """R (N, L, L): R = I; for each layer in order, Ā_l = mean over heads of clamp(dS/dA_l ⊙ A_l, min=0) (clamped
    per head, then averaged), R <- R + Ā_l R (Eq. 5 and 6 of the paper, self-attention only)."""
    if maps.gradients is None:
        raise ValueError("attn-grad needs the gradients of the score with respect to the attention")
    relevance: torch.Tensor | None = None
    for attention, gradient in zip(maps.probabilities, maps.gradients, strict=True):
        attention = attention.float()
        weighted = (gradient.float() * attention).clamp(min=0).mean(dim=1)
        relevance = identity_like(attention) if relevance is None else relevance
        relevance = relevance + weighted @ relevance
    if relevance is None:
        raise ValueError("attn-grad needs at least one layer")
    return relevance


def attention_gradient(maps: AttentionMaps) -> torch.Tensor:
    """attn-grad's (N, h, w) map: R[0, P:] of :func:`gradient_relevance` on the patch grid. Costs one forward pass
    and one backward pass per target from the score to the first attention layer.

    A final LayerNorm after a class token whose attention has saturated can leave dS/dA near zero: the map is then
    flat (zeros everywhere after the clamp), shown as a blank map rather than a guess."""
    return patch_map(gradient_relevance(maps), maps)
