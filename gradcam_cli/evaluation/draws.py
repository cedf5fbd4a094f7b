"""The random methods in ``gradcam eval``: which they are, the seeds of their fresh draws in the sanity cascade, and
``randomcam``'s floor averaged over several draws (docs/evaluation.md, "Ranking" and "Sanity check")."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..cam.methods.random import image_seeds, randomcam
from ..cam.scores import Cams
from .report import MethodScores, mean_or_nan

RANDOM_METHODS = ("randomcam", "rise")
"""Methods whose map depends on a seed (randomcam's noise, RISE's masks)."""
RANDOM_DRAWS = 4
"""Draws of ``randomcam`` per image whose figures are averaged: the floor is a mean, not one sample."""
DRAW_SEED_STEP = 1_000_003
"""Draw d's seed is ``--seed + d * DRAW_SEED_STEP``; the sanity cascade's stages and its redraw use others."""


def sanity_seed(seed: int, stage: int) -> int:
    """The fresh seed of the cascade's ``stage`` (1, 2, ...; 0: the redraw on the trained model), so that a
    randomised model never reuses the trained model's masks or noise."""
    return seed + 7919 * (stage + 1)


def random_draws(cams: Cams, inputs: torch.Tensor, seed: int, draws: int = RANDOM_DRAWS) -> list[list[torch.Tensor]]:
    """``randomcam``'s maps (one (1, h, w) per layer, its first target's grid; (1, t, h, w) of a clip) for draws
    1..draws-1 of the (1, 3, H, W) (or (1, 3, T, H, W)) ``inputs`` (draw 0 is the explainer's own, from ``seed``)."""
    shapes = [cam.shape[1:] for cam in cams["randomcam"][0]]
    out = []
    for draw in range(1, draws):
        seeds = image_seeds(seed + draw * DRAW_SEED_STEP, inputs)
        out.append([randomcam(torch.empty(1, 1, *shape), None, seeds) for shape in shapes])
    return out


def averaged(scores: Sequence[MethodScores]) -> MethodScores:
    """One method's figures averaged over its draws: the curves (a clip's in time too), the masked probability, ROAD,
    faithfulness correlation, Gini and entropy (each AUC is linear in its curve, so the mean curve's AUC is the mean
    AUC)."""

    def columns(rows: Sequence[list[float]]) -> list[float]:
        return [mean_or_nan(column) for column in zip(*rows, strict=True)]

    first = scores[0]
    return MethodScores(
        deletion=columns([s.deletion for s in scores]),
        insertion=columns([s.insertion for s in scores]),
        masked_probability=mean_or_nan([s.masked_probability for s in scores]),
        road_morf=columns([s.road_morf for s in scores]) if first.road_morf else [],
        road_lerf=columns([s.road_lerf for s in scores]) if first.road_lerf else [],
        temporal_deletion=columns([s.temporal_deletion for s in scores]) if first.temporal_deletion else [],
        temporal_insertion=columns([s.temporal_insertion for s in scores]) if first.temporal_insertion else [],
        gini=mean_or_nan([s.gini for s in scores]),
        entropy=mean_or_nan([s.entropy for s in scores]),
        faithfulness_correlation=mean_or_nan([s.faithfulness_correlation for s in scores]),
    )
