"""Score-CAM's extra forward passes (:class:`MaskedScores`): the target's probability for the input masked by each
channel of the layer, batched, without hooks or autograd. The formula that uses them is
:func:`gradcam_cli.cam.methods.scorecam.scorecam`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..options import SCORE_BATCH_SIZE
from .logits import as_logits
from .maps import Region, normalise, upsample_region

ProgressCallback = Callable[[int, int], object]
"""Called as ``progress(done, total)`` while Score-CAM's masked inputs run."""

SCORECAM_BATCH_SIZE = SCORE_BATCH_SIZE
"""Masked inputs per forward pass in Score-CAM, ablated copies in AblationCAM (``Explainer(score_batch_size=...)``)."""


class MaskedScores:
    """Score-CAM's extra forward passes: the target class's probability for the input masked by each channel.

    ``forward`` runs the model on a batch (without hooks or autograd); ``inputs`` (N, 3, H, W) are the inputs
    being explained and ``targets`` (N,) their target classes, whose softmax probability is read from the logits;
    or else ``probability(output, samples)`` reads the (B,) probability of the target of each masked input's
    sample from the model's output (a detector's matched detection: see :mod:`gradcam_cli.cam.scores`).
    ``region``: the part of the maps that shows the input (a detector's padded batch, see
    :func:`gradcam_cli.cam.maps.upsample_region`). Masked inputs run ``batch_size`` at a time;
    ``progress(done, total)`` is called before the first batch and after each one, the last time with
    ``done == total`` even if a pass fails (nothing is printed otherwise).
    Channels whose map is constant are skipped (their weight is 0), as the authors' code does.
    """

    def __init__(
        self,
        forward: Callable[[torch.Tensor], object],
        inputs: torch.Tensor,
        targets: torch.Tensor | None = None,
        batch_size: int = SCORECAM_BATCH_SIZE,
        progress: ProgressCallback | None = None,
        probability: Callable[[object, torch.Tensor], torch.Tensor] | None = None,
        region: Region = (1.0, 1.0),
    ) -> None:
        if targets is None and probability is None:
            raise ValueError("MaskedScores needs targets or a probability function")
        self.forward = forward
        self.inputs = inputs
        self.targets = targets.view(-1) if targets is not None else None
        self.batch_size = max(1, batch_size)
        self.progress = progress
        self.probability = probability
        self.region = region

    def __call__(self, activations: torch.Tensor) -> torch.Tensor:
        """(N, C, h, w) activations -> (N, C) probabilities p(target | input ⊙ mask_k)."""
        flat = activations.flatten(2)
        varying = (flat.amax(dim=2) > flat.amin(dim=2)).nonzero()  # (P, 2): (sample, channel) pairs
        scores = torch.zeros(activations.shape[:2], device=activations.device, dtype=torch.float32)
        total = varying.shape[0]
        self._report(0, total)
        try:
            for start in range(0, total, self.batch_size):
                sample, channel = varying[start : start + self.batch_size].unbind(dim=1)
                masks = scorecam_masks(activations[sample, channel], self.inputs.shape[2:], self.region)
                with torch.no_grad():
                    output = self.forward(self.inputs[sample] * masks.unsqueeze(1).to(self.inputs.dtype))
                    scores[sample, channel] = self._probabilities(output, sample)
                if start + self.batch_size < total:
                    self._report(start + self.batch_size, total)
        finally:
            self._report(total, total)  # always the last call, also on errors, so that a bar can close
        return scores

    def _probabilities(self, output: object, sample: torch.Tensor) -> torch.Tensor:
        """(B,) probability of each masked input's target."""
        if self.probability is not None:
            return self.probability(output, sample).float()
        assert self.targets is not None
        probabilities = as_logits(output).float().softmax(dim=1)
        return probabilities.gather(1, self.targets[sample].unsqueeze(1)).squeeze(1)

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)


def scorecam_masks(maps: torch.Tensor, size: tuple[int, ...] | torch.Size, region: Region = (1.0, 1.0)) -> torch.Tensor:
    """Score-CAM's masks H^k: each (h, w) map bilinearly upsampled to the input ``size`` and min-max scaled to
    [0, 1]: (B, h, w) -> (B, H, W) (a grid of another rank alike, :func:`~gradcam_cli.cam.maps.upsample`).
    ``region``: the part of the maps that shows the input."""
    return normalise(upsample_region(maps, size, region))
