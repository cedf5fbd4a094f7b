"""What the tests read and set of a model's state: its hooks, modes and gradient flags (``hook_counts``,
``snapshot``), a net in mixed modes that can fail mid-forward (``mixed_model``), and batch norms with statistics far
from the identity (``with_random_statistics``)."""

from __future__ import annotations

import torch
from torch import nn


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Every hook dictionary of every module that is not empty, by module and kind."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    counts = {}
    for name, module in model.named_modules():
        for kind in kinds:
            hooks = getattr(module, kind, {})
            if hooks:
                counts[f"{name or '<root>'}.{kind}"] = len(hooks)
    return counts


class Exploding(nn.Module):
    """A small net that can raise half-way through its forward pass, after the target layer ran."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True))
        self.after = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Dropout(0.5))
        self.head = nn.Linear(4, 5)
        self.explode = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.after(self.features(x))
        if self.explode:
            raise ValueError("boom mid-forward")
        return self.head(x.mean(dim=(2, 3)))


def mixed_model() -> Exploding:
    """Train mode at the root, one submodule in eval mode, some parameters frozen."""
    torch.manual_seed(0)
    model = Exploding().train()
    model.after[1].eval()
    model.features[0].bias.requires_grad_(False)
    model.head.weight.requires_grad_(False)
    return model


def snapshot(model: nn.Module) -> tuple[dict[str, bool], dict[str, bool]]:
    return (
        {name: m.training for name, m in model.named_modules()},
        {name: p.requires_grad for name, p in model.named_parameters()},
    )


def with_random_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """Batch norms with running statistics and affine parameters far from the identity, so folding is tested."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            size = module.num_features
            module.running_mean.copy_(torch.rand(size, generator=generator) - 0.5)
            module.running_var.copy_(torch.rand(size, generator=generator) * 1.5 + 0.5)
            module.weight.data.copy_(torch.rand(size, generator=generator) + 0.5)
            module.bias.data.copy_((torch.rand(size, generator=generator) - 0.5) * 0.4)
    return model.eval()
