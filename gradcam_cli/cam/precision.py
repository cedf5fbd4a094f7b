"""``--precision``: the forward pass under autocast (bfloat16 or float16), everything after it in float32.

Only the model's forward pass runs in the lower precision: its output, the recorded activations and their
gradients are turned back into float32 before scores, CAMs and maps are computed, so a map's arithmetic (weights,
sums, upsampling, normalising) is the same as at ``fp32``. Autocast works on the CPU too (bfloat16 on most CPUs),
which is how the path is tested without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import UsageError
from ..options import PRECISION_NAMES

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The autocast dtype of each lower precision (``fp32`` has none)."""
HALF_DTYPES = frozenset(DTYPES.values())


def to_float32(tensor: torch.Tensor) -> torch.Tensor:
    """A half-precision tensor as float32; any other as it is."""
    return tensor.float() if tensor.dtype in HALF_DTYPES else tensor


def check_precision(name: str) -> str:
    """``name`` when it is one of :data:`~gradcam_cli.options.PRECISION_NAMES`, else a :class:`UsageError`."""
    if name not in PRECISION_NAMES:
        raise UsageError(f"unknown precision {name!r}; use {', '.join(PRECISION_NAMES)}")
    return name


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """Autocast to ``precision``'s dtype on ``device`` while the block runs; nothing for ``fp32``."""
    dtype = DTYPES.get(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def full_precision(value: object) -> object:
    """``value`` with every half-precision tensor in it (float16, bfloat16; also inside lists, tuples and dicts, as
    a detector's output has them) turned into float32; the casts stay in the graph, so gradients flow back through
    them. float32 and float64 tensors stay as they are."""
    if isinstance(value, torch.Tensor):
        return to_float32(value)
    if type(value) is list:
        return [full_precision(item) for item in value]
    if isinstance(value, tuple):
        items = [full_precision(item) for item in value]
        if hasattr(value, "_fields"):  # a namedtuple keeps its type
            namedtuple: Any = type(value)
            return namedtuple(*items)
        return tuple(items)
    if type(value) is dict:
        return {key: full_precision(item) for key, item in value.items()}
    return value  # other containers (a Hugging Face ModelOutput) as they are
