"""Finding layers by name, listing them with their output shapes, and choosing a sensible default."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .errors import UsageError, suggest

_HEAD_POOLING = (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)


@dataclass
class LayerInfo:
    """One module as seen during a dry forward pass."""

    name: str
    kind: str
    output_shape: tuple[int, ...] | None
    calls: int
    finished_at: int

    @property
    def is_candidate(self) -> bool:
        """A layer Grad-CAM can explain: a 4-D (N, C, H, W) output with more than one spatial position."""
        shape = self.output_shape
        return bool(self.name) and shape is not None and len(shape) == 4 and shape[2] * shape[3] > 1


def resolve_layer(model: nn.Module, name: str) -> nn.Module:
    """The submodule at dotted path ``name`` (``layer4``, ``layer4.1.conv2``, ``features.28``)."""
    try:
        return model.get_submodule(name)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        hint = suggest(name, names) or " Run with --list-layers to see every layer."
        raise UsageError(f"unknown layer {name!r}.{hint}") from None


def inspect_layers(model: nn.Module, example: torch.Tensor) -> list[LayerInfo]:
    """Every module with its output shape, from one dry forward pass with a forward hook on each module.

    Modules that run several times per forward report the shape of their last call and the number of calls.
    """
    infos = {name: LayerInfo(name, type(m).__name__, None, 0, -1) for name, m in model.named_modules()}
    counter = iter(range(1 << 62))
    handles = []

    def recorder(name: str):
        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            info = infos[name]
            info.calls += 1
            info.finished_at = next(counter)
            info.output_shape = tuple(output.shape) if isinstance(output, torch.Tensor) else None

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(recorder(name)))
    training = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
        for module, mode in training:
            module.training = mode
    return list(infos.values())


def default_layer(model: nn.Module, infos: list[LayerInfo]) -> str:
    """The last layer to finish whose output is still spatial: ``layer4`` for ResNets, ``features`` for VGG.

    Global pooling heads (adaptive pools) are skipped, so VGG's 7x7 ``avgpool`` is not chosen.
    """
    modules = dict(model.named_modules())
    candidates = [i for i in infos if i.is_candidate and not isinstance(modules[i.name], _HEAD_POOLING)]
    if not candidates:
        raise UsageError("the model has no layer with a spatial (N, C, H, W) output; pass --layer explicitly")
    return max(candidates, key=lambda info: info.finished_at).name
