"""Choosing the torch device from ``--device``."""

from __future__ import annotations

import torch

from ..errors import UsageError
from ..options import DEVICE_PATTERN


def resolve_device(choice: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then Apple MPS, then the CPU; an explicit device must exist."""
    choice = choice.strip().lower()
    if not DEVICE_PATTERN.match(choice):
        raise UsageError(f"unknown device {choice!r}; use auto, cpu, cuda, cuda:N or mps")
    if choice == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(choice)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {choice} was asked for, but no CUDA GPU is available; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(f"--device {choice}: only {torch.cuda.device_count()} CUDA device(s) present")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError("--device mps was asked for, but MPS is not available; use --device cpu")
    return device
