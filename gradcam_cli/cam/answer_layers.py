"""The layers ``--list-layers`` shows for a vision-language model: the modules that run on the image before the
language model reads it (vision tower, projector, merger, connector), each with its output shape from one pass of a
photo and a short prompt. The language model, its embeddings and its head are left out: their tokens are the prompt's
and the answer's, not the image's. The family's default layer is marked, and so is every layer whose output is the
image tokens in the family's layout (:class:`~gradcam_cli.models.token_layouts.TokenLayout`), which ``--layer`` can
explain. A ``--layer`` given is tried the same way at start-up
(:meth:`~gradcam_cli.cam.tasks.answer.AnswerScore.probe`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from PIL import Image
from torch import nn

from ..models.profile import LoadedModel
from .answer_model import language_modules
from .answers import PROBE_PROMPT, Prompter, grey_photo
from .layers import LayerInfo
from .reshape import Layout

LEGEND = (
    "* default layer   + the image's tokens in the family's layout (what --layer explains)   xN: runs N times per "
    "forward   the language model's layers are not listed: their tokens are the prompt's and the answer's"
)


def answer_layer_table(model: LoadedModel, image: Image.Image | None = None) -> tuple[list[LayerInfo], str]:
    """The modules before the language model with their output shapes for one pass of ``image`` (a grey photo
    without one) and :data:`PROBE_PROMPT`, candidates marked by their layout; and the family's default layer."""
    prompter = Prompter(model)
    photo = image.convert("RGB") if image is not None else grey_photo()
    inputs = prompter.inputs(photo, PROBE_PROMPT)
    module: Any = model.module
    infos = _shapes(module, inputs, language_modules(module))
    for info in infos:
        start = _token_start(prompter, inputs, photo, info.output_shape) if info.layout is not None else None
        info.layout = None
        if start is not None and info.output_shape is not None:
            tokens = math.prod(info.output_shape[:-1])
            info.layout = Layout("nlc", 1, tokens - start, prefix=start)
    return infos, prompter.layout.default_layer


def _shapes(module: nn.Module, inputs: Mapping[str, torch.Tensor], left_out: set[int]) -> list[LayerInfo]:
    """Each named module outside ``left_out`` that runs, in the order it finishes, with its last output's shape (a
    tuple's first tensor: a vision encoder layer's hidden state) and its call count; ``layout`` is set (to a
    placeholder, :func:`answer_layer_table` replaces it) on those whose output depends on the photo's pixels and
    reaches the next token's logits: one pass with the pixels as a leaf and one backward pass."""
    infos: dict[str, LayerInfo] = {}
    outputs: dict[str, torch.Tensor] = {}
    counter = iter(range(1 << 62))

    def recorder(name: str) -> Callable[[nn.Module, object, object], None]:
        def hook(inner: nn.Module, _inputs: object, output: object) -> None:
            info = infos.setdefault(name, LayerInfo(name, type(inner).__name__, None, 0, -1))
            info.calls += 1
            info.finished_at = next(counter)
            first = output[0] if isinstance(output, tuple | list) and output else output
            info.output_shape = tuple(first.shape) if isinstance(first, torch.Tensor) else None
            info.output_type = type(output).__name__
            outputs.pop(name, None)
            if isinstance(first, torch.Tensor) and first.requires_grad:  # computed from the pixels
                first.retain_grad()
                outputs[name] = first

        return hook

    handles = [
        inner.register_forward_hook(recorder(name))
        for name, inner in module.named_modules()
        if name and id(inner) not in left_out and inner is not getattr(module, "model", None)
    ]
    leaves = {k: v.detach().requires_grad_() if v.is_floating_point() else v for k, v in inputs.items()}
    try:
        with torch.enable_grad():
            logits = module(**leaves).logits
            logits[0, -1].float().sum().backward()
    finally:
        for handle in handles:
            handle.remove()
    for name, output in outputs.items():
        if output.grad is not None and bool(output.grad.any()):
            infos[name].layout = Layout("nlc", 1, 2)
    return sorted(infos.values(), key=lambda info: info.finished_at)


def _token_start(
    prompter: Prompter, inputs: Mapping[str, torch.Tensor], image: Image.Image, shape: tuple[int, ...] | None
) -> int | None:
    """Where the image's tokens start in an output of ``shape`` (leading tokens before: a class token), when its
    tokens are the image's in the family's layout; else ``None``."""
    if shape is None or not 2 <= len(shape) <= 3:  # tokens (L, C) or (frames, L, C), never a convolution's map
        return None
    tokens = math.prod(shape[:-1])
    try:
        tiles = prompter.tiles(inputs, image, tokens)
    except Exception:  # a count the layout cannot place
        return None
    start = min(tile.start for tile in tiles) if tiles else -1
    return start if tiles and start >= 0 and max(tile.end for tile in tiles) == tokens and tokens > 1 else None
