"""Embeddings: which of a model's outputs is its embedding, the reference embeddings of ``similar:`` targets, and the
prompt head of a CLIP-style model (image-text cosines and logits).

**The embedding** (:func:`select_output`) is the model's output when that is a tensor; of a transformers output
object its ``image_embeds``, else its ``pooler_output``; ``--embedding WHICH`` names another (a key, an attribute or
an index into a tuple). An (N, D, 1, 1) map counts as (N, D); anything else with more than two dimensions is no
embedding (one line names what it is).

**A reference** (:func:`reference_embedding`) is the unit-length embedding of one image, or of a folder the mean
of its images' unit-length embeddings, renormalised (a "concept", as pytorch-grad-cam's
``SimilarityToConceptTarget`` takes it). Each image is prepared as the inputs are and run once, without hooks or
autograd, when the explainer is built: once per run, whatever the number of images explained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..errors import GradcamError, UsageError, describe, suggest
from ..io.discovery import discover
from ..io.images import load_image, to_input_tensor
from ..models.modes import model_state_preserved
from ..models.tasks import describe_output

if TYPE_CHECKING:
    from ..models.loading import LoadedModel
    from ..models.text_tower import TextTower

OUTPUT_ATTRIBUTES = ("image_embeds", "pooler_output")
"""What a model's output object offers as its embedding, first found first (transformers' output objects)."""


def select_output(output: object, which: str | None = None) -> torch.Tensor:
    """The (N, D) embedding in a model's ``output`` (see the module docstring); a UsageError names what the output
    holds when ``which`` is missing or names nothing there."""
    chosen: object = output
    if which is not None:
        chosen = _member(output, which)
    elif not isinstance(output, torch.Tensor):
        found = [getattr(output, name, None) for name in OUTPUT_ATTRIBUTES]
        chosen = next((value for value in found if isinstance(value, torch.Tensor)), None)
        if chosen is None:
            raise UsageError(
                f"the model returns {describe_output(output)}; say which is the embedding with --embedding "
                f"({', '.join(_members(output)) or 'a key, attribute or index'})"
            )
    if not isinstance(chosen, torch.Tensor):
        raise UsageError(f"--embedding {which} is {describe_output(chosen)}, not a tensor")
    if chosen.dim() == 4 and chosen.shape[2] * chosen.shape[3] == 1:
        chosen = chosen.flatten(1)
    if chosen.dim() != 2:
        shape = "x".join(map(str, chosen.shape))
        raise UsageError(
            f"the model's {which or 'output'} is {shape}, not one (N, D) embedding per image; choose a pooled "
            "output with --embedding"
        )
    return chosen


def _member(output: object, which: str) -> object:
    if isinstance(output, Mapping) and which in output:
        return output[which]
    if isinstance(output, Sequence) and not isinstance(output, str) and which.lstrip("-").isdigit():
        index = int(which)
        if -len(output) <= index < len(output):
            return output[index]
    value = getattr(output, which, None)
    if value is not None and not callable(value):
        return value
    members = _members(output)
    hint = suggest(which, members) or (f" It has: {', '.join(members)}." if members else "")
    raise UsageError(f"--embedding {which}: the model's output has no {which!r}.{hint}")


def _members(output: object) -> list[str]:
    """The names ``--embedding`` could take for ``output``: its keys, indices or tensor attributes."""
    if isinstance(output, torch.Tensor):
        return []
    if isinstance(output, Mapping):
        return [str(key) for key in output]
    if isinstance(output, Sequence) and not isinstance(output, str):
        return [str(i) for i in range(len(output))]
    return (
        [name for name in vars(output) if isinstance(getattr(output, name), torch.Tensor)]
        if hasattr(output, "__dict__")
        else []
    )


def unit(tensor: torch.Tensor) -> torch.Tensor:
    """Rows of ``tensor`` scaled to unit length (a zero row stays zero), in float32."""
    return F.normalize(tensor.float(), dim=-1)


def reference_embedding(
    model: LoadedModel, path: str, which: str | None, device: torch.device, what: str
) -> torch.Tensor:
    """The (D,) unit-length reference of ``similar:PATH`` (see the module docstring); ``what`` names the target in
    messages. Every failure is a UsageError: the reference is part of the command line."""
    source = Path(path)
    if not source.exists():  # ``what`` names the path: messages name it once
        raise UsageError(f"{what}: the reference does not exist")
    images = [image.path for image in discover([source])] if source.is_dir() else [source]
    if not images:
        raise UsageError(f"{what}: the folder holds no images")
    total: torch.Tensor | None = None
    with model_state_preserved(model.module), torch.no_grad():
        for image in images:
            try:
                pixels = to_input_tensor(load_image(image), model.input_spec).unsqueeze(0).to(device)
            except GradcamError as error:
                reason = describe(error)  # an image of a folder is named; the reference itself is in ``what``
                reason = reason.removeprefix(f"{image}: ") if image == source else reason
                raise UsageError(f"{what}: {reason}") from None
            embedding = unit(select_output(model.module(pixels), which))[0]
            total = embedding if total is None else total + embedding
    assert total is not None
    return unit(total)


class PromptHead:
    """A CLIP-style model's scores for its prompts: the (P, D) unit text embeddings ``texts``, and the model's
    ``scale`` and ``bias`` (``None``: CLIP, whose prompts compete, softmax; SigLIP's each stand alone, sigmoid).

    Called on an image embedding (N, D) it gives the logits ``scale * cos + bias``; :meth:`cosines` the cosines."""

    def __init__(self, texts: torch.Tensor, scale: float, bias: float | None = None, which: str | None = None) -> None:
        self.texts, self.scale, self.bias, self.which = unit(texts), scale, bias, which

    @classmethod
    def encode(cls, text: TextTower, prompts: list[str], device: torch.device, which: str | None) -> PromptHead:
        """The head of ``prompts``, embedded once by the model's text tower on ``device``."""
        return cls(text.encode(prompts, device), text.logit_scale, text.logit_bias, which)

    def cosines(self, output: object) -> torch.Tensor:
        """(N, P) cosines of each image's embedding with each prompt's."""
        embedding = unit(select_output(output, self.which))
        return embedding @ self.texts.to(embedding.device).T

    def __call__(self, output: object) -> torch.Tensor:
        """(N, P) logits, ``scale * cos + bias``."""
        return self.scale * self.cosines(output) + (self.bias or 0.0)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The zero-shot probabilities shown: softmax over the prompts, or each prompt's sigmoid (SigLIP)."""
        return logits.sigmoid() if self.bias is not None else logits.softmax(dim=1)

    def as_cosines(self, logits: torch.Tensor) -> torch.Tensor:
        """The cosines behind ``logits`` (the scale and bias undone)."""
        return (logits - (self.bias or 0.0)) / self.scale
