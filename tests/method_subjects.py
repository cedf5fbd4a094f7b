"""What the comparisons of tests/methods/test_more_methods.py and tests/methods/test_guided.py explain, and how:
random-weight torchvision models with BatchNorm statistics calibrated, a seeded photo, the class the model picks,
and gradcam_cli's map of it (the references they are compared with are in ``method_reference.py``)."""

from __future__ import annotations

import functools

import torch
import torchvision
from method_reference import calibrate_batchnorm
from torch import nn

from gradcam_cli import Explainer

REQUIRED = 0.999
"""The least Pearson correlation of our map with a reference's."""
SIZE = (112, 112)
"""The photo's side and the calibration's: light enough for the sweeps (AblationCAM: a pass per channel)."""


@functools.cache
def model(name: str) -> nn.Module:
    """torchvision's ``name`` (or ``tiny_densenet``: a two-block DenseNet, ``F.relu(..., inplace=True)`` at the
    end), seeded random weights, BatchNorm calibrated, in eval mode; built once (``model.cache_clear()`` frees)."""
    torch.manual_seed(0)
    options = {"init_weights": True, "aux_logits": False} if name == "googlenet" else {}
    if name == "tiny_densenet":
        built = torchvision.models.DenseNet(8, (2, 2), 16, 2, num_classes=10)
    else:
        built = torchvision.models.get_model(name, weights=None, **options)
    return calibrate_batchnorm(built, SIZE).eval()


def photo(size: tuple[int, int] = SIZE) -> torch.Tensor:
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))


def top_class(net: nn.Module, x: torch.Tensor) -> int:
    with torch.no_grad():
        return int(net(x).argmax())


def ours(net: nn.Module, layer: str, method: str, x: torch.Tensor, target: int, **options: object) -> torch.Tensor:
    """gradcam_cli's ``method`` map of ``target`` at ``layer``, at the input's size."""
    return Explainer(net, layer, method, **options).explain_batch(x, target=target)[0].explanations[0].saliency
