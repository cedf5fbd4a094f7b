"""AblationCAM's extra forward passes: the target's score with each channel of the layer's output set to zero.

Desai & Ramaswamy, "Ablation-CAM: Visual Explanations for Deep Convolutional Network via Gradient-free
Localization", WACV 2020: y^c_k is the score of class c when the layer's channel k is zeroed (the paper's
"ablation"), everything before the layer unchanged. The formula is in :func:`gradcam_cli.cam.methods.ablationcam`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Replaced = Callable[[torch.Tensor, torch.Tensor], object]
"""``(inputs, replacement)`` -> the model's output for ``inputs`` with the layer outputting ``replacement``."""
ScoreReader = Callable[[object, torch.Tensor], torch.Tensor]
"""``(output, the sample each row came from)`` -> (B,) score of that sample's target."""
Progress = Callable[[int, int], object]
"""Called as ``progress(done, total)``."""


class AblatedScores:
    """The (N, C) scores y_k of every sample's target with channel k of the layer zeroed.

    ``forward(inputs, replacement)`` runs the model with the layer's output replaced
    (:meth:`gradcam_cli.cam.engine.LayerCapture.forward_output_replaced`); ``inputs`` (N, 3, H, W) are the inputs
    explained and ``layer_output`` the layer's own output for them, in its own layout, whose channels lie along
    ``channel_dim`` (1: (N, C, h, w); -1: channel-last maps and token sequences). ``score(output, samples)`` reads
    each ablated row's target score; ``original`` (N,) is each sample's target score with nothing ablated. Ablated
    copies run ``batch_size`` at a time, ``progress(done, total)`` as in
    :class:`gradcam_cli.cam.masked_scores.MaskedScores`. A channel that is zero everywhere already is not run: ablating
    it changes nothing, so its score is the original one (weight 0).
    """

    def __init__(
        self,
        forward: Replaced,
        inputs: torch.Tensor,
        layer_output: torch.Tensor,
        score: ScoreReader,
        original: torch.Tensor,
        channel_dim: int = 1,
        batch_size: int = 32,
        progress: Progress | None = None,
    ) -> None:
        self.forward = forward
        self.inputs = inputs
        self.layer_output = layer_output
        self.score = score
        self.original = original.detach().float()
        self.channel_dim = channel_dim
        self.batch_size = max(1, batch_size)
        self.progress = progress

    def __call__(self, activations: torch.Tensor) -> torch.Tensor:
        """(N, C, h, w) activations (the layer's output, channel-first) -> (N, C) scores y_k."""
        channels = self.layer_output.movedim(self.channel_dim, 1).flatten(2)
        live = channels.ne(0).any(dim=2).nonzero()  # (P, 2): (sample, channel) pairs
        scores = self.original.to(activations.device)[:, None].expand(activations.shape[:2]).clone()
        total = live.shape[0]
        self._report(0, total)
        try:
            for start in range(0, total, self.batch_size):
                sample, channel = live[start : start + self.batch_size].unbind(dim=1)
                replacement = self.layer_output[sample].clone()
                rows = torch.arange(sample.shape[0], device=sample.device)
                if self.channel_dim == 1:
                    replacement[rows, channel] = 0
                else:
                    replacement[rows, ..., channel] = 0
                output = self.forward(self.inputs[sample], replacement)
                scores[sample, channel] = self.score(output, sample).float()
                if start + self.batch_size < total:
                    self._report(start + self.batch_size, total)
        finally:
            self._report(total, total)
        return scores

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)
