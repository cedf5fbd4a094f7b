"""The ``toy:`` model family: ``--model toy:tiny`` is a tiny convolutional classifier of three named classes (red,
green, blue), its weights set by hand so that it needs no file: the class is the image's dominant colour, and its
layer ``features`` (a 1x1 convolution) sees each colour where it is. ``--model toy:counter`` counts the 16 x 16
squares of each colour (density maps, the plugin's ``count`` task: :mod:`.task`, which explains it unless ``--task``
says otherwise).

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
from gradcam_cli.models.tasks import CLASSIFY
from gradcam_cli.options import ModelOptions

CLASSES = ("red", "green", "blue")
MODELS = ("tiny", "counter")
"""The names the family takes after ``toy:``."""
COUNT_TASK = "count"
"""The plugin's task (:mod:`.task`), which explains ``toy:counter`` unless ``--task`` names another."""
COUNTED_SIDE = 16
"""The side, in the network input's pixels, of the squares ``toy:counter`` counts as one."""
COUNTER_STRIDE = 4
"""``toy:counter``'s density maps are at 1 / 4 of the input's resolution."""


def colour_features() -> nn.Conv2d:
    """A 1x1 convolution, 3 -> 3 channels: each colour minus the mean of the others (0 on grey, black and white)."""
    features = nn.Conv2d(3, 3, kernel_size=1)
    with torch.no_grad():
        features.weight.copy_((1.5 * torch.eye(3) - 0.5 * torch.ones(3, 3)).reshape(3, 3, 1, 1))
        features.bias.zero_()
    return features


def tiny() -> nn.Module:
    """features (:func:`colour_features`) -> ReLU -> mean -> linear."""
    head = nn.Linear(3, 3)
    with torch.no_grad():
        head.weight.copy_(4 * torch.eye(3))
        head.bias.zero_()
    layers = {
        "features": colour_features(),
        "relu": nn.ReLU(),
        "pool": nn.AdaptiveAvgPool2d(1),
        "flatten": nn.Flatten(),
    }
    return nn.Sequential(OrderedDict({**layers, "head": head}))


def counter() -> nn.Module:
    """features (:func:`colour_features`) -> ReLU -> 4 x 4 average -> head (1x1 conv): (N, 3, H / 4, W / 4) density
    maps, each cell the share of its pixels in that colour divided by the (16 / 4)^2 cells a counted square covers,
    so that a map's sum counts the 16 x 16 squares of its colour (whole squares: 1 each)."""
    head = nn.Conv2d(3, 3, kernel_size=1)
    with torch.no_grad():
        head.weight.copy_((torch.eye(3) / (COUNTED_SIDE // COUNTER_STRIDE) ** 2).reshape(3, 3, 1, 1))
        head.bias.zero_()
    layers = {"features": colour_features(), "relu": nn.ReLU(), "pool": nn.AvgPool2d(COUNTER_STRIDE)}
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
        counts = which == "counter"
        profile = ModelProfile(
            InputSpec(size=64, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)),
            list(CLASSES),
            chosen_task(options, COUNT_TASK if counts else CLASSIFY),  # a --task given says otherwise
        )
        return LoadedModel(counter() if counts else tiny(), options.model, options.weights, profile=profile)


TOY = ToyFamily()
"""The family the ``gradcam_cli.families`` entry point ``toy`` names (registered under that name)."""
