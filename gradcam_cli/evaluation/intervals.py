"""The bootstrap intervals of ``gradcam eval --rank`` (:mod:`gradcam_cli.evaluation.rank`): percentile intervals of
each method's mean and BCa intervals of paired differences, over images, weighted where the unit is a detection (the
cluster bootstrap: an image's detections resampled together)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from .report import EvalReport

BOOTSTRAP_RESAMPLES = 1000


def bootstrap(
    table: torch.Tensor, seed: int, resamples: int = BOOTSTRAP_RESAMPLES, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """(M, n) values -> (M, 2): the percentile 95 % interval of each row's mean over ``resamples`` resamples of
    the n columns with replacement, the same for every row (CPU generator seeded with ``seed``); ``weights``: (n,)
    each column's weight (a weighted mean: :data:`~gradcam_cli.evaluation.rank.CLUSTERED`)."""
    n = table.shape[1]
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, n, (resamples, n), generator=generator)
    if weights is None:
        means = table.double()[:, picks].mean(dim=2)  # (M, resamples)
    else:
        w = weights.double()[picks]  # (resamples, n)
        means = (table.double()[:, picks] * w).sum(dim=2) / w.sum(dim=1)
    return torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=1).T


def paired_interval(
    differences: torch.Tensor,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
    weights: torch.Tensor | None = None,
) -> tuple[float, float]:
    """The BCa bootstrap interval (Efron 1987) of the mean of the (n,) per-image ``differences``, in float64:
    the percentiles of ``resamples`` resampled means (drawn from ``seed``) shifted by the bias correction z0 and the
    jackknife acceleration a. It always holds the mean; constant differences give [d, d]; one image gives none
    (NaN, NaN). ``weights``: (n,) each image's weight (:data:`~gradcam_cli.evaluation.rank.CLUSTERED`: the weighted
    mean, its resamples and its leave-one-image-out jackknife weighted alike)."""
    d = differences.double()
    n = d.numel()
    w = weights.double() if weights is not None else None
    mean = (float(d.mean()) if w is None else float((w * d).sum() / w.sum())) if n else math.nan
    if n < 2:
        return math.nan, math.nan
    if bool((d == d[0]).all()):
        return mean, mean
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, n, (resamples, n), generator=generator)
    means = d[picks].mean(dim=1) if w is None else (d[picks] * w[picks]).sum(dim=1) / w[picks].sum(dim=1)
    below = (means < mean).double().mean() + 0.5 * (means == mean).double().mean()
    z0 = torch.special.ndtri(below.clamp(1.0 / (resamples + 1), resamples / (resamples + 1.0)))
    jackknife = (d.sum() - d) / (n - 1) if w is None else ((w * d).sum() - w * d) / (w.sum() - w)
    spread = jackknife.mean() - jackknife
    denominator = 6.0 * float((spread**2).sum()) ** 1.5
    a = float((spread**3).sum()) / denominator if denominator > 0 else 0.0
    z = torch.special.ndtri(torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64))
    adjusted = torch.special.ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))
    low, high = torch.quantile(means, adjusted.clamp(0.0, 1.0)).tolist()
    return min(low, mean), max(high, mean)


def detection_counts(report: EvalReport) -> dict[str, float]:
    """Each image's count of explained detections (the most any of its methods holds: they share the detections)."""
    return {
        image.image: float(max((len(s.detections) for s in image.methods.values()), default=0)) for image in report.ok
    }


def image_weights(counts: dict[str, float], images: Iterable[str]) -> torch.Tensor:
    """Each of ``images``' weight: its count of explained detections (``counts``: :func:`detection_counts`)."""
    return torch.tensor([counts[i] for i in images], dtype=torch.float64)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor | None) -> float:
    return float(values.mean()) if weights is None else float((weights * values).sum() / weights.sum())


def intervals(
    columns: list[torch.Tensor], seed: int, resamples: int, weights: Sequence[torch.Tensor | None] = ()
) -> torch.Tensor:
    """(M, 2): each column's percentile interval (:func:`bootstrap`), the same resamples for columns of one length
    (every column, unless a run was interrupted part-way through an image); NaN below 2 values. ``weights``: each
    column's image weights (:data:`~gradcam_cli.evaluation.rank.CLUSTERED`), its interval then of its weighted mean."""
    out = torch.full((len(columns), 2), math.nan, dtype=torch.float64)
    if any(w is not None for w in weights):
        for i, (column, w) in enumerate(zip(columns, weights, strict=True)):
            if column.numel() > 1:  # the same draws as stacked columns: the generator depends on the length alone
                out[i] = bootstrap(column[None], seed, resamples, w)[0]
        return out
    for n in {column.numel() for column in columns if column.numel() > 1}:
        rows = [i for i, column in enumerate(columns) if column.numel() == n]
        out[rows] = bootstrap(torch.stack([columns[i] for i in rows]), seed, resamples)
    return out
