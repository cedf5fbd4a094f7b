"""Finding layers by name, listing them with their output shapes, and choosing a sensible default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import UsageError, suggest
from .reshape import Layout, infer_layout

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

_HEAD_POOLING = (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d)
_LAYOUT_ONLY = ("Permute",)
"""Modules that only reorder their input's axes (torchvision's ``Permute``): never chosen as the default."""


@dataclass
class LayerInfo:
    """One module as seen during a dry forward pass."""

    name: str
    kind: str
    output_shape: tuple[int, ...] | None
    calls: int
    finished_at: int
    layout: Layout | None = None
    started_at: int = -1

    @property
    def is_candidate(self) -> bool:
        """A layer CAMs can explain: a spatial output (N, C, H, W), channel-last (N, H, W, C) or a token sequence
        (N, L, C) with an H x W grid of patches (see :mod:`gradcam_cli.cam.reshape`), with more than one position."""
        return bool(self.name) and self.layout is not None and self.layout.positions > 1


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
    input_size = tuple(example.shape[-2:])

    def starter(name: str):
        def pre_hook(_module: nn.Module, _inputs: object) -> None:
            infos[name].started_at = next(counter)

        return pre_hook

    def recorder(name: str):
        def hook(_module: nn.Module, _inputs: object, output: object) -> None:
            info = infos[name]
            info.calls += 1
            info.finished_at = next(counter)
            info.output_shape = tuple(output.shape) if isinstance(output, torch.Tensor) else None
            info.layout = infer_layout(info.output_shape, input_size) if info.output_shape else None

        return hook

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(starter(name)))
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
    """The last layer to finish whose output is still spatial: ``layer4`` for ResNets, ``features`` for VGG,
    ``norm`` for Swin.

    Global pooling heads (adaptive pools) and pure axis permutations are skipped, so VGG's 7x7 ``avgpool`` and
    Swin's ``permute`` are not chosen. Token sequences with a class token (ViT) are special: the head reads only
    the class token, so after the last attention layer the patch tokens no longer affect the score and their
    gradients are zero. There the default is the last spatial layer that finishes before the last attention
    module starts: the input of the last block's attention (``encoder.layers.encoder_layer_11.ln_1`` in
    torchvision's ``vit_b_16``).
    """
    modules = dict(model.named_modules())
    candidates = [
        i
        for i in infos
        if i.is_candidate
        and not isinstance(modules[i.name], _HEAD_POOLING)
        and type(modules[i.name]).__name__ not in _LAYOUT_ONLY
    ]
    if not candidates:
        raise UsageError("the model has no layer with a spatial output; pass --layer explicitly")
    chosen = max(candidates, key=lambda info: info.finished_at)
    if chosen.layout is not None and chosen.layout.prefix:
        attention = [i.started_at for i in infos if i.calls and "attention" in i.kind.lower()]
        before = [i for i in candidates if attention and i.finished_at < max(attention)]
        if before:
            chosen = max(before, key=lambda info: info.finished_at)
    return chosen.name


def layer_table(model: LoadedModel, device: torch.device, image: Path | None = None) -> tuple[list[LayerInfo], str]:
    """Every named module with its output shape for one dry pass (a blank input of the model's size, or
    ``image``), and the default layer's name: what ``--list-layers`` prints."""
    from ..io.images import load_image, to_input_tensor

    spec = model.input_spec
    if image is not None:
        example = to_input_tensor(load_image(image), spec).unsqueeze(0)
    else:
        height, width = spec.fixed_size or (spec.size, spec.size)
        example = torch.zeros(1, 3, height, width)
    infos = inspect_layers(model.module, example.to(device))
    return [info for info in infos if info.name], default_layer(model.module, infos)
