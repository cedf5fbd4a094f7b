"""The randomisation cascade's models (Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018;
docs/evaluation.md, "Sanity check"): the model with its top 1, 2, ... parameterised modules re-initialised."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..errors import UsageError
from ..options import EvalOptions


def parameterised_modules(model: nn.Module) -> list[str]:
    """Names of the modules that own parameters, in registration order (for most models, the forward order)."""
    return [name for name, module in model.named_modules() if name and any(True for _ in module.parameters(False))]


def reinitialise(module: nn.Module, seed: int) -> None:
    """Re-initialise ``module``'s own parameters reproducibly: ``reset_parameters()`` where it exists (BatchNorm
    also forgets its running statistics), otherwise N(0, 0.02^2) weights and zero 1-D parameters."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
            return
        with torch.no_grad():
            for param in module.parameters(recurse=False):
                if param.dim() > 1:
                    param.normal_(0.0, 0.02)
                else:
                    param.zero_()


def randomised_stages(
    model: nn.Module, options: EvalOptions, device: torch.device | str
) -> tuple[list[str], list[nn.Module]]:
    """The names of the top ``sanity_layers`` parameterised modules (last first), and one copy of ``model`` per
    cascade stage, on ``device``: stage k with the top k re-initialised (module d from ``seed + d``)."""
    if options.sanity_layers < 1:
        raise UsageError("--sanity-layers must be at least 1")
    names = parameterised_modules(model)[::-1][: options.sanity_layers]
    if not names:
        raise UsageError("--sanity: the model has no parameters to re-initialise")
    stages = []
    for stage in range(1, len(names) + 1):
        module = copy.deepcopy(model).cpu()
        for depth, name in enumerate(names[:stage]):
            reinitialise(module.get_submodule(name), options.seed + depth)
        stages.append(module.to(device))
    return names, stages


def fully_randomised(model: nn.Module, seed: int, device: torch.device | str) -> nn.Module:
    """A copy of ``model`` on ``device`` with every parameterised module re-initialised (module d, in registration
    order, from ``seed + d``): a bottom-up cascade's last stage, which sMPRT and eMPRT compare with. ``model`` itself
    is left as it is."""
    names = parameterised_modules(model)
    if not names:
        raise UsageError("--mprt: the model has no parameters to re-initialise")
    module = copy.deepcopy(model).cpu()
    for depth, name in enumerate(names):
        reinitialise(module.get_submodule(name), seed + depth)
    return module.to(device)
