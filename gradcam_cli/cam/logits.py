"""A model's output read as class scores: the tensor itself, or the logits a tuple, a named tuple or a Hugging Face
output carries."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import UsageError


def as_logits(output: object) -> torch.Tensor:
    """A classifier's logits: the output itself when it is a tensor, else :func:`first_tensor` of it."""
    return output if isinstance(output, torch.Tensor) else first_tensor(output)


def first_tensor(output: object) -> torch.Tensor:
    """Logits from models that return tuples or named tuples (GoogLeNet and Inception in train mode)."""
    if isinstance(output, Sequence) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    if hasattr(output, "logits") and isinstance(output.logits, torch.Tensor):
        return output.logits
    raise UsageError(f"the model returned {type(output).__name__}; expected a tensor of class scores")
