"""What a forward pass keeps for its backward pass, measured with autograd's saved-tensor hooks: the bytes of every
storage saved (each once) besides the model's own parameters and buffers (saved by a matrix product for the input's
gradient, but in memory anyway), and of those saved before a given layer's output existed (the part of the graph
"below" the layer). Used by tests/models/test_vlm_memory.py and benchmarks/bench_vlm_memory.py."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch
from torch import nn


class KeptMemory:
    """Within ``with KeptMemory(model, layer) as kept:``, ``kept.total`` counts the bytes of the storages autograd
    saves for the backward pass, other than ``model``'s parameters and buffers, and ``kept.below`` those saved before
    ``layer`` (if given) returned its output."""

    def __init__(self, model: nn.Module, layer: nn.Module | None = None) -> None:
        self.layer = layer
        self.total = self.below = 0
        self.reached = layer is None
        owned = [*model.parameters(), *model.buffers()]
        self._seen: set[int] = {tensor.untyped_storage().data_ptr() for tensor in owned}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda saved: saved)
        self._handle: torch.utils.hooks.RemovableHandle | None = None

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in self._seen:
            self._seen.add(key)
            self.total += storage.nbytes()
            if not self.reached:
                self.below += storage.nbytes()
        return tensor

    def _reach(self, *_: object) -> None:
        self.reached = True

    def __enter__(self) -> KeptMemory:
        if self.layer is not None:
            self._handle = self.layer.register_forward_hook(self._reach)
        self._hooks.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._hooks.__exit__(kind, error, trace)
        if self._handle is not None:
            self._handle.remove()


def layer_module(explainer: Any) -> torch.nn.Module:
    """An explainer's one explained layer (its network's)."""
    _, layers = explainer.network
    (module,) = layers.values()
    return module


def kept_training_style(explainer: Any, inputs: dict[str, torch.Tensor], answer: list[int]) -> KeptMemory:
    """What the answer's teacher-forced forward pass keeps when run as training runs it (every parameter requiring
    a gradient): the comparison for a vision-language explainer's own pass. The parameters' flags are restored."""
    from gradcam_cli.cam.answers import TEXT_KEYS, _Prompted

    module = explainer.model.module
    images = {key: value for key, value in inputs.items() if key not in TEXT_KEYS}
    ids = torch.cat((inputs["input_ids"], torch.tensor([answer], device=explainer.device)), dim=1)
    flags = [parameter.requires_grad for parameter in module.parameters()]
    try:
        module.requires_grad_(True)
        with KeptMemory(module, layer_module(explainer)) as kept, torch.enable_grad():
            _Prompted(module, images)(ids)
    finally:
        for parameter, flag in zip(module.parameters(), flags, strict=True):
            parameter.requires_grad_(flag)
    return kept
