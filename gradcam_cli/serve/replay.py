"""Explaining another class of an image without a new forward pass: the last passes, kept with their graphs.

An :class:`~gradcam_cli.cam.explainer.Explainer` hooks the target layers for each pass with a
:class:`~gradcam_cli.cam.engine.LayerCapture` (the ``capture`` of a call's
:class:`~gradcam_cli.cam.explainer_input.CallContext`). :class:`ReplayCapture` is one that keeps,
for each image and set of layers, what the pass needs to be explained again: the model's output, the layers'
activations and the leaves the graph starts at, and the graph itself from the layers to the output (every backward
pass keeps it: ``retain_graph``). Explaining the same image at the same layers again, for another class or with
another gradient method, then reads the new target's score from the kept output and differentiates it through the
kept graph: one backward pass through the part of the network after the layer, and no forward pass. Everything else
is the explainer's own code, so the maps are the library's.

What is kept, per (image, layers): the graph after the layers with the tensors it saved for backward, the output
and the activations; for a classifier explained at its last spatial layer that is a few megabytes, at an early
layer of a large network up to a few hundred. :class:`RetainedPasses` keeps the last ``size`` of them (least
recently used dropped first), so memory stays bounded. Methods that run passes of their own (Score-CAM's masked
inputs, AblationCAM, FullGrad, guided backpropagation) still run those.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..cam.engine import KeptLayers, LayerCapture

RETAINED_PASSES = 4
"""How many (image, layers) passes are kept by default."""


@dataclass
class RetainedPass:
    """One kept pass: the model's output and, per layer, (activations, leaf, calls)."""

    output: object
    records: KeptLayers


class RetainedPasses:
    """The last ``size`` passes, by key; ``forward_passes`` counts the passes that ran the model (misses)."""

    def __init__(self, size: int = RETAINED_PASSES) -> None:
        self.size = max(0, size)
        self._passes: OrderedDict[Hashable, RetainedPass] = OrderedDict()
        self._lock = threading.Lock()
        self.forward_passes = 0
        self.replayed_passes = 0

    def get(self, key: Hashable) -> RetainedPass | None:
        with self._lock:
            kept = self._passes.get(key)
            if kept is not None:
                self._passes.move_to_end(key)
                self.replayed_passes += 1
            return kept

    def put(self, key: Hashable, kept: RetainedPass) -> None:
        with self._lock:
            self.forward_passes += 1
            if self.size == 0:
                return
            self._passes[key] = kept
            self._passes.move_to_end(key)
            while len(self._passes) > self.size:
                self._passes.popitem(last=False)

    def drop(self, image: Hashable) -> None:
        """Forget every pass of ``image`` (the first part of each key)."""
        with self._lock:
            for key in [key for key in self._passes if isinstance(key, tuple) and key[0] == image]:
                del self._passes[key]

    def __len__(self) -> int:
        return len(self._passes)


class ReplayFactory:
    """The ``capture`` of one call explaining ``image`` (in its :class:`~gradcam_cli.cam.explainer_input.CallContext`):
    each pass of the call (one, or one per view with ``aug_smooth``) gets a :class:`ReplayCapture` keyed by the image,
    its layers and the pass's number. ``forward`` tells afterwards whether any of them ran the model."""

    def __init__(self, passes: RetainedPasses, image: Hashable) -> None:
        self.passes, self.image = passes, image
        self.views = 0
        self.forward = False

    def __call__(self, model: nn.Module, layers: Mapping[str, nn.Module]) -> LayerCapture:
        key = (self.image, tuple(layers), self.views)
        self.views += 1
        return ReplayCapture(model, layers, self, key)


class ReplayCapture(LayerCapture):
    """A :class:`LayerCapture` whose pass is kept in, or replayed from, its factory's :class:`RetainedPasses`."""

    def __init__(
        self, model: nn.Module, layers: Mapping[str, nn.Module], factory: ReplayFactory, key: Hashable
    ) -> None:
        super().__init__(model, layers)
        self.factory, self.key = factory, key

    def forward_output(self, inputs: torch.Tensor) -> object:
        """The kept output of this pass, with the layers' records restored; or a forward pass, then kept (always a
        forward pass where attention is watched: the attention methods read the pass's own probabilities)."""
        kept = None if self.attention else self.factory.passes.get(self.key)
        if kept is not None:
            self.replay(kept.records)
            return kept.output
        output = super().forward_output(inputs)
        self.factory.forward = True
        self.factory.passes.put(self.key, RetainedPass(output, self.kept()))
        return output

    def gradients(self, score: torch.Tensor, retain_graph: bool = False) -> dict[str, torch.Tensor]:
        """:meth:`LayerCapture.gradients`, always keeping the graph for the next class."""
        return super().gradients(score, retain_graph=True)
