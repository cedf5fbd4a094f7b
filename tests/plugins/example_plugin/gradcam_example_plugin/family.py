"""The ``toy:`` model family: ``--model toy:tiny`` is a tiny convolutional classifier of three named classes (red,
green, blue), its weights set by hand so that it needs no file: the class is the image's dominant colour, and its
layer ``features`` (a 1x1 convolution) sees each colour where it is.

A family subclasses :class:`gradcam_cli.models.families.base.Family`: a name, the prefix it claims, and a loader
that returns the module with its :class:`~gradcam_cli.models.profile.ModelProfile`.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from gradcam_cli.errors import UsageError, suggest
from gradcam_cli.io.images import InputSpec
from gradcam_cli.models.families.base import Family, chosen_task
from gradcam_cli.models.profile import LoadedModel, ModelProfile
from gradcam_cli.models.tasks import Task
from gradcam_cli.options import ModelOptions

CLASSES = ("red", "green", "blue")
MODELS = ("tiny",)
"""The names the family takes after ``toy:``."""


def tiny() -> nn.Module:
    """features (1x1 conv, 3 -> 3 channels: each colour minus the mean of the others) -> ReLU -> mean -> linear."""
    features = nn.Conv2d(3, 3, kernel_size=1)
    head = nn.Linear(3, 3)
    with torch.no_grad():
        features.weight.copy_((1.5 * torch.eye(3) - 0.5 * torch.ones(3, 3)).reshape(3, 3, 1, 1))
        features.bias.zero_()
        head.weight.copy_(4 * torch.eye(3))
        head.bias.zero_()
    layers = {"features": features, "relu": nn.ReLU(), "pool": nn.AdaptiveAvgPool2d(1), "flatten": nn.Flatten()}
    return nn.Sequential(OrderedDict({**layers, "head": head}))


class ToyFamily(Family):
    name = "toy"
    prefix = "toy:"

    def names(self) -> list[str]:
        return []  # --list-models shows torchvision's names; a prefix family takes names after its prefix

    def load(self, options: ModelOptions, architecture_only: bool) -> LoadedModel:
        which = options.model.removeprefix(self.prefix or "")
        if which not in MODELS:
            hint = suggest(which, list(MODELS))
            raise UsageError(f"unknown toy model {which!r}.{hint} Use one of: {', '.join(MODELS)}")
        if options.weights.upper() not in ("DEFAULT", "NONE"):
            raise UsageError(f"--model {options.model} takes no weights file: its weights are set by hand")
        profile = ModelProfile(
            InputSpec(size=64, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)),
            list(CLASSES),
            chosen_task(options, Task.CLASSIFY),
        )
        return LoadedModel(tiny(), options.model, options.weights, profile=profile)


TOY = ToyFamily()
"""The family the ``gradcam_cli.families`` entry point ``toy`` names (registered under that name)."""
