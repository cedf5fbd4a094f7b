"""A tiny ViT trained in seconds on images where one coloured patch decides the class, with distractors: the
known answer for the attention methods (tests/methods/test_attention_methods.py)."""

from __future__ import annotations

import torch
from attention_models import PATCH, SIZE, tiny_vit
from torch import nn

GRID = SIZE // PATCH
COLOURS = {"red": (1.0, -1.0, -1.0), "blue": (-1.0, -1.0, 1.0)}
"""The deciding patch's colour, one per class (0: red, 1: blue), in the normalised input's units."""
DISTRACTORS = ((-1.0, 1.0, -1.0), (1.0, 1.0, -1.0))
"""Green and yellow patches, two of them in every image, never deciding."""


def make_images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` (3, 32, 32) inputs on a noisy grey ground, each with its class's coloured patch at a random cell
    and two distractor patches elsewhere: (inputs, classes, the deciding cell's index row * 4 + column)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = 0.3 * torch.randn(count, 3, SIZE, SIZE, generator=generator)
    classes = torch.randint(0, 2, (count,), generator=generator)
    cells = torch.zeros(count, dtype=torch.long)
    for n in range(count):
        chosen = torch.randperm(GRID * GRID, generator=generator)[:3].tolist()
        colours = [list(COLOURS.values())[int(classes[n])], *DISTRACTORS]
        for cell, colour in zip(chosen, colours, strict=True):
            row, col = divmod(cell, GRID)
            patch = inputs[n, :, row * PATCH : (row + 1) * PATCH, col * PATCH : (col + 1) * PATCH]
            patch.copy_(torch.tensor(colour)[:, None, None].expand_as(patch))
        cells[n] = chosen[0]
    return inputs, classes, cells


def train_vit(steps: int = 150, seed: int = 0) -> nn.Module:
    """A 2-block ViT with a class token (8-pixel patches, 4 x 4 grid) trained to tell the red patch from the blue."""
    torch.manual_seed(seed)
    model = tiny_vit(depth=2, num_heads=2, mlp_ratio=2.0, num_classes=2)
    inputs, classes, _ = make_images(512, seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        batch = torch.randint(0, len(inputs), (64,), generator=generator)
        loss = nn.functional.cross_entropy(model(inputs[batch]), classes[batch])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval().requires_grad_(False)
