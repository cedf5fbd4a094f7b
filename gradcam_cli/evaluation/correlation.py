"""Faithfulness correlation's perturbed images (Bhatt et al., IJCAI 2020; docs/evaluation.md, "Faithfulness
correlation"): random pixel subsets of one image removed in turn, and the drop in the target's score each costs.
The formula is :func:`~gradcam_cli.evaluation.metrics.faithfulness_correlation`; the drops are the same for every
method on an image, so :class:`~gradcam_cli.evaluation.evaluate.Evaluator` measures them once per image."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..options import EvalOptions
from . import metrics

Scores = Callable[[list[tuple[Any, ...]], Callable[[tuple[Any, ...]], torch.Tensor]], Iterator[float]]
"""The target's score of each job's image, the images built by the callable, forwarded in batches."""


def correlation_drops(
    image: torch.Tensor, probability: float, options: EvalOptions, scores: Scores
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The random pixel subsets of the (3, H, W) ``image`` (``correlation_runs`` of ``correlation_subset`` pixels,
    or all where fewer, drawn from ``options.seed``; a (3, T, H, W) clip's: of its voxels) and the drop from
    ``probability`` in the target's score with each subset replaced by the deletion baseline (zero) in every
    channel; ``None`` without ``correlation``."""
    if not options.correlation:
        return None
    shape = tuple(image.shape[1:])  # (H, W), or a clip's (T, H, W)
    pixels = math.prod(shape)
    size = min(options.correlation_subset, pixels)
    subsets = metrics.correlation_subsets(pixels, size, options.correlation_runs, options.seed)
    removed = metrics.subset_masks(subsets, shape).to(image.device)

    def build(job: tuple[Any, ...]) -> torch.Tensor:
        return torch.where(removed[job[1]], 0.0, image)

    jobs: list[tuple[Any, ...]] = [("subset", k) for k in range(len(subsets))]
    measured = torch.tensor(list(scores(jobs, build)), dtype=torch.float64)
    return subsets, probability - measured
