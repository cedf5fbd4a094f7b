"""The attention methods' input, :class:`AttentionMaps`, and how a token-by-token relevance becomes a patch map."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMaps:
    """One pass's attention, as the methods take it.

        ``probabilities``: each layer's A_l (N, heads, L, L), first layer first (row i: how token i attends);
        ``gradients``: dS/dA_l for the target's score S, where a method needs them (else ``None``); ``prefix``: the P
        tokens before the patches (class, distillation, register tokens); ``class_token``: whether token 0 is a class
        token; ``grid``: the (h, w) patches, token ``P + r * w + c`` at row r, column c, or a clip's (t, h, w) tubelets,
    time slowest (token ``P + (f * h + r) * w + c``); ``heads``: how rollout and
        the ``attention`` method fuse a layer's heads (:data:`HEAD_FUSIONS`, ``--attention-heads``).
    """

    probabilities: Sequence[torch.Tensor]
    gradients: Sequence[torch.Tensor] | None
    prefix: int
    class_token: bool
    grid: tuple[int, ...]
    heads: str = "mean"


HEAD_FUSIONS = ("mean", "max", "min")
"""How a layer's heads are fused (``--attention-heads``): the papers' mean (rollout, DINO's map), or the elementwise
max or min over heads (the max: a token any head attends to strongly; the min: one every head attends to)."""


def fuse_heads(attention: torch.Tensor, fusion: str) -> torch.Tensor:
    """(N, heads, L, L) -> (N, L, L): the ``fusion`` (:data:`HEAD_FUSIONS`) over heads."""
    if fusion == "mean":
        return attention.mean(dim=1)
    if fusion == "max":
        return attention.amax(dim=1)
    if fusion == "min":
        return attention.amin(dim=1)
    raise ValueError(f"unknown head fusion {fusion!r}; use {', '.join(HEAD_FUSIONS)}")


def patch_map(relevance: torch.Tensor, maps: AttentionMaps) -> torch.Tensor:
    """(N, L, L) token relevance -> (N, h, w), or (N, t, h, w) on a clip's grid: the class token's row over the patch
    columns, R[0, P:]; without a class token (global average pooling), the mean over the patch rows,
    mean_{i >= P} R[i, P:]. Prefix columns (distillation and register tokens) are dropped, never shown."""
    columns = relevance[:, :, maps.prefix :]
    rows = columns[:, 0] if maps.class_token else columns[:, maps.prefix :].mean(dim=1)
    return rows.reshape(relevance.shape[0], *maps.grid)


def identity_like(attention: torch.Tensor) -> torch.Tensor:
    """The (N, L, L) identity matching (N, heads, L, L) ``attention``."""
    batch, _, length, _ = attention.shape
    return torch.eye(length, device=attention.device, dtype=attention.dtype).expand(batch, length, length)
