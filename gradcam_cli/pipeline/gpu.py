"""The batch's side of a GPU: inputs stacked into pinned memory and copied without blocking, maps copied back the
same way (one wait per batch, not one per map in the writer threads), and telling an out-of-memory error apart.

On the CPU every function here is a plain no-op or ``torch.stack``, so the local pipeline runs the same code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..cam.results import ImageExplanation


def uses_pinned_memory(device: torch.device) -> bool:
    """Whether batches for ``device`` go through pinned (page-locked) host memory: CUDA only."""
    return device.type == "cuda"


def stack_inputs(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The batch of ``tensors`` on ``device``. For CUDA it is stacked straight into pinned memory and copied with
    ``non_blocking=True``: the copy overlaps the work already queued on the GPU."""
    if not uses_pinned_memory(device):
        return torch.stack(list(tensors))
    first = tensors[0]
    pinned = torch.empty((len(tensors), *first.shape), dtype=first.dtype, pin_memory=True)
    torch.stack(list(tensors), out=pinned)
    return pinned.to(device, non_blocking=True)


def results_to_host(results: Sequence[ImageExplanation]) -> None:
    """Move every map (and a segmenter's region) that is on a GPU into pinned host memory, in place: all copies are
    queued without blocking, then waited for once. The writer threads then blend and encode on the CPU, and never
    wait for the GPU (whose stream already holds the next batch's work by the time they run)."""
    stream: torch.cuda.Stream | None = None
    for result in results:
        for explanation in result.explanations:
            if explanation.saliency.is_cuda:
                stream = torch.cuda.current_stream(explanation.saliency.device)
                explanation.saliency = _to_pinned(explanation.saliency)
            if explanation.region is not None and explanation.region.is_cuda:
                explanation.region = _to_pinned(explanation.region)
    if stream is not None:
        stream.synchronize()


def _to_pinned(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor.detach(), non_blocking=True)
    return host


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says a device ran out of memory (CUDA's own error, or a message saying so)."""
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(error, oom):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def release_cached_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back after an out-of-memory error (a no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
