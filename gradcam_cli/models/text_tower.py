"""A CLIP-style model's text tower: what embeds the prompts of ``text:`` targets (docs/targets.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class TextTower:
    """A CLIP-style model's text side: ``encode(prompts, device)`` gives their (P, D) embeddings. ``logit_scale`` and
    ``logit_bias`` turn an image-text cosine into the model's logit, ``scale * cos + bias``; a model with a bias
    (SigLIP) scores each prompt on its own (sigmoid), one without (CLIP) ranks the prompts (softmax)."""

    module: nn.Module
    tokenize: Callable[[list[str]], Mapping[str, torch.Tensor]]
    embed: Callable[..., torch.Tensor]
    logit_scale: float
    logit_bias: float | None = None

    def encode(self, prompts: list[str], device: torch.device) -> torch.Tensor:
        """The (P, D) float32 embeddings of ``prompts``, computed on ``device`` without autograd."""
        self.module.to(device).eval()
        inputs = {name: value.to(device) for name, value in self.tokenize(prompts).items()}
        with torch.no_grad():
            embedded: Any = self.embed(**inputs)
        tensor = embedded if isinstance(embedded, torch.Tensor) else embedded.pooler_output  # transformers 5
        return torch.as_tensor(tensor).float()
