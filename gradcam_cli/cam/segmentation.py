"""Explaining segmenters: class c's score is the sum of c's logits over the pixels predicted as c.

That is pytorch-grad-cam's ``SemanticSegmentationTarget`` (mask = argmax == c, score = sum of logits[c] x mask), so
the maps can be compared with its. The output is a segmenter's (N, classes, H, W) logits, or the ``out`` entry of
the dict torchvision's segmenters return, or a volume segmenter's (N, classes, D, H, W) logits (the voxels then count
as its pixels); the pixels are those of that output. Without ``--target-class``, each
image's predicted classes other than the background (class 0, torchvision's ``__background__``) are explained,
largest area first, at most ``--top-k``. A class's ``share`` is the fraction of the output's pixels predicted as
it and its probability their mean softmax probability of it. Score-CAM reads, for a masked input, the mean softmax
probability of c over the pixels predicted as c in the unmasked pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from ..errors import UsageError
from ..models.tasks import describe_output
from .results import TOP_PREDICTIONS, ImageExplanation, Prediction
from .scores import Cams, ClassName, MaskedProbability, chosen_channels, explanations_of, sum_or_none

BACKGROUND = 0
"""The class a segmenter's background is (torchvision's ``__background__``): not explained unless asked for."""


def segment_logits(output: object) -> torch.Tensor:
    """A segmenter's (N, classes, H, W) logits (a volume segmenter's (N, classes, D, H, W)): the output itself, or
    its ``out`` entry."""
    logits = output.get("out") if isinstance(output, Mapping) else output
    if isinstance(logits, torch.Tensor) and logits.dim() in (4, 5):
        return logits
    raise UsageError(
        f"the model returned {describe_output(output)}; a segmenter returns (N, classes, H, W) scores or a dict "
        "with 'out' (see --task)"
    )


class SegmentationScore:
    """A segmenter's score for class c: the sum of c's logits over the pixels predicted as c."""

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> SegmentationTargets:
        logits = segment_logits(output)
        classes = logits.shape[1]
        predicted = logits.detach().argmax(dim=1)
        counts = F.one_hot(predicted.flatten(1), classes).sum(dim=1)  # (N, classes) pixels per class
        if target is not None:
            picked = chosen_channels(counts, target, top_k).tolist()
        else:
            if top_k < 1:
                raise UsageError("--top-k must be at least 1")
            picked = [_largest(row, top_k) for row in counts]
        return SegmentationTargets(logits, predicted, counts, picked)


def _largest(counts: torch.Tensor, top_k: int) -> list[int]:
    """Classes present other than the background, largest area first (ties: lower index), at most ``top_k``."""
    order = counts.argsort(descending=True, stable=True).tolist()
    return [c for c in order if counts[c] > 0 and c != BACKGROUND][:top_k]


class SegmentationTargets:
    """The chosen classes of one pass: ``picked[n]`` are image n's, in order; target ``k`` is each image's
    ``k``-th class."""

    def __init__(
        self, logits: torch.Tensor, predicted: torch.Tensor, counts: torch.Tensor, picked: list[list[int]]
    ) -> None:
        self.logits, self.predicted, self.counts, self.picked = logits, predicted, counts, picked

    @property
    def count(self) -> int:
        return max((len(p) for p in self.picked), default=0)

    @property
    def region(self) -> tuple[float, float]:
        return (1.0, 1.0)

    def _samples(self, k: int) -> list[tuple[int, int]]:
        """(image, class) of every image that has a ``k``-th class."""
        return [(n, p[k]) for n, p in enumerate(self.picked) if k < len(p)]

    def value(self, k: int) -> torch.Tensor | None:
        return sum_or_none([self.logits[n, c].masked_select(self.predicted[n] == c).sum() for n, c in self._samples(k)])

    def masked(self, k: int) -> MaskedProbability:
        def probability(output: object, samples: torch.Tensor) -> torch.Tensor:
            probabilities = segment_logits(output).float().softmax(dim=1)
            values = []
            for j, sample in enumerate(samples.tolist()):
                chosen = self.picked[sample]
                if k >= len(chosen):
                    values.append(torch.zeros((), device=probabilities.device))
                    continue
                mask = self.predicted[sample] == chosen[k]
                inside = probabilities[j, chosen[k]].masked_select(mask)
                values.append(inside.mean() if inside.numel() else torch.zeros((), device=probabilities.device))
            return torch.stack(values)

        return probability

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        probabilities = self.logits.detach().float().softmax(dim=1)
        pixels = self.predicted[0].numel()
        results = []
        for n, size in enumerate(sizes):

            def prediction(c: int, n: int = n) -> Prediction:
                mask = self.predicted[n] == c
                inside = probabilities[n, c].masked_select(mask)
                probability = float(inside.mean()) if inside.numel() else 0.0
                return Prediction(c, class_name(c), probability, share=int(self.counts[n, c]) / pixels)

            present = [c for c in self.counts[n].argsort(descending=True, stable=True).tolist() if self.counts[n, c]]
            predictions = [prediction(c) for c in present[:TOP_PREDICTIONS]]
            explanations = []
            for k, c in enumerate(self.picked[n]):
                mask = region_mask(self.predicted[n] == c, size)
                explanations += explanations_of(cams, n, k, prediction(c), size, mask=mask)
            results.append(ImageExplanation(predictions, explanations))
        return results


def region_mask(mask: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """An (h, w) bool mask stretched over an image of ``size`` = (H, W) (a (d, h, w) one over a volume's (D, H, W)):
    each pixel takes the value under its centre (``nearest-exact``), so it lines up with the maps."""
    stretched = F.interpolate(mask[None, None].float(), size=tuple(size), mode="nearest-exact")
    return stretched[0, 0].bool()
