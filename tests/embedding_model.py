"""Hand-built embedding models whose evidence is known: the embedding is the mean red, green and blue excess of the
image (the :mod:`square_model` colour detectors, without the class head), and a constant.

``--model tests/embedding_model.py:build`` returns the (N, 4) embedding; ``build_dict`` returns
``{"logits": ..., "embedding": ...}`` (``--embedding embedding`` chooses it).
"""

from __future__ import annotations

import torch
from square_model import ColourDetector
from torch import nn


class ColourEmbedding(nn.Module):
    """features: the colour detectors; the embedding: their global means and a constant 0.1."""

    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        detector = ColourDetector()
        self.features, self.pool, self.fc, self.as_dict = detector.features, detector.pool, detector.fc, as_dict

    def forward(self, x: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        pooled = self.pool(self.features(x)).flatten(1)
        embedding = torch.cat([pooled, torch.full_like(pooled[:, :1], 0.1)], dim=1)
        return {"logits": self.fc(pooled), "embedding": embedding} if self.as_dict else embedding


def build() -> nn.Module:
    """Factory for ``--model tests/embedding_model.py:build``: (N, 4) embeddings."""
    return ColourEmbedding()


def build_dict() -> nn.Module:
    """Factory returning a dict of two outputs, ``logits`` and ``embedding``."""
    return ColourEmbedding(as_dict=True)
