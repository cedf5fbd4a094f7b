"""``gradcam eval --rank``: every method ranked per metric, with a bootstrap 95 % confidence interval over images.

The ranking reads an :class:`~gradcam_cli.evaluation.report.EvalReport` (one evaluation of all the methods on the
same images) and, per metric, takes each image's value for each method (:data:`RANKED`), the mean over the images
every method has a value for, and the 2.5th and 97.5th percentiles of the mean over :data:`BOOTSTRAP_RESAMPLES`
resamples of those images with replacement (the same resamples for every method; drawn from ``seed``). Two marks:
``sanity_failed`` (the randomisation cascade flagged the method, docs/evaluation.md) and ``beats_random`` (its mean is
better than ``randomcam``'s on every faithfulness metric measured: deletion and insertion AUC, pointing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..options import RANDOM_BASELINE
from . import metrics
from .report import EvalReport, ImageScores, MethodScores, mean_or_nan

BOOTSTRAP_RESAMPLES = 1000
FAITHFULNESS = ("deletion_auc", "insertion_auc", "pointing")
"""The metrics a method must beat ``randomcam`` on (those measured)."""

Value = Callable[[ImageScores, MethodScores], float | None]


def _drop(image: ImageScores, s: MethodScores) -> float | None:
    y = image.target.probability if image.target else 0.0
    return metrics.average_drop([y], [s.masked_probability]) if y > 0 and s.deletion else None


def _increase(image: ImageScores, s: MethodScores) -> float | None:
    y = image.target.probability if image.target else 0.0
    return metrics.increase_in_confidence([y], [s.masked_probability]) if s.deletion else None


def _boxes(value: Callable[[MethodScores], float]) -> Value:
    return lambda _image, s: value(s) if s.boxes else None


RANKED: dict[str, tuple[str, str, Value]] = {
    "deletion_auc": ("deletion AUC", "lower", lambda _i, s: s.deletion_auc if s.deletion else None),
    "insertion_auc": ("insertion AUC", "higher", lambda _i, s: s.insertion_auc if s.insertion else None),
    "average_drop": ("average drop %", "lower", _drop),
    "increase_in_confidence": ("increase in confidence %", "higher", _increase),
    "road": ("ROAD", "higher", lambda _i, s: s.road if s.road_morf else None),
    "pointing": ("pointing %", "higher", _boxes(lambda s: 100.0 * sum(b.hit for b in s.boxes) / len(s.boxes))),
    "energy": ("energy in box", "higher", _boxes(lambda s: sum(b.energy for b in s.boxes) / len(s.boxes))),
    "sanity": ("sanity rho (max over the cascade)", "lower", lambda _i, s: max(s.sanity) if s.sanity else None),
    "gini": ("sparseness (Gini)", "higher", lambda _i, s: s.gini),
    "entropy": ("complexity (entropy)", "lower", lambda _i, s: s.entropy),
    "stability": (
        "instability (mean change)",
        "lower",
        lambda _i, s: mean_or_nan(s.stability) if s.stability else None,
    ),
}
"""metric -> (label, which way is better, the value of one method on one image or ``None`` where not measured)."""


@dataclass(frozen=True)
class RankRow:
    """One method's place on one metric."""

    metric: str
    label: str
    better: str
    rank: int
    method: str
    mean: float
    ci_low: float
    ci_high: float
    images: int
    sanity_failed: bool | None
    beats_random: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {key: (None if isinstance(v, float) and math.isnan(v) else v) for key, v in asdict(self).items()}


def values(report: EvalReport, metric: str) -> dict[str, list[float]]:
    """Each method's per-image values of ``metric`` on the images where every method has one (same order)."""
    value = RANKED[metric][2]
    columns: dict[str, list[float]] = {method: [] for method in report.methods}
    for image in report.ok:
        row = [value(image, image.methods[m]) if m in image.methods else None for m in report.methods]
        if all(v is not None and not math.isnan(v) for v in row):
            for method, v in zip(report.methods, row, strict=True):
                columns[method].append(float(v))  # type: ignore[arg-type]
    return columns


def bootstrap(table: torch.Tensor, seed: int, resamples: int = BOOTSTRAP_RESAMPLES) -> torch.Tensor:
    """(M, n) values -> (M, 2): the percentile 95 % interval of each row's mean over ``resamples`` resamples of
    the n columns with replacement, the same for every row (CPU generator seeded with ``seed``)."""
    n = table.shape[1]
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, n, (resamples, n), generator=generator)
    means = table.double()[:, picks].mean(dim=2)  # (M, resamples)
    return torch.quantile(means, torch.tensor([0.025, 0.975], dtype=torch.float64), dim=1).T


def rank(report: EvalReport, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES) -> list[RankRow]:
    """Every measured metric's ranking of the report's methods (best first), with the marks above."""
    flagged = {}
    for method in report.methods:
        sanity = report.summary(method).get("sanity")
        flagged[method] = bool(sanity["flagged"]) if sanity else None
    measured = {metric: values(report, metric) for metric in RANKED}
    measured = {metric: columns for metric, columns in measured.items() if all(columns.values())}
    means = {metric: {m: mean_or_nan(v) for m, v in columns.items()} for metric, columns in measured.items()}
    beats: dict[str, bool | None] = dict.fromkeys(report.methods)
    if RANDOM_BASELINE in report.methods:
        for method in report.methods:
            checks = [
                _better(RANKED[k][1], means[k][method], means[k][RANDOM_BASELINE]) for k in FAITHFULNESS if k in means
            ]
            beats[method] = all(checks) if checks else None  # randomcam itself: never above itself
    rows = []
    for metric, columns in measured.items():
        label, better, _ = RANKED[metric]
        methods = list(columns)
        intervals = bootstrap(torch.tensor([columns[m] for m in methods]), seed, resamples)
        order = sorted(range(len(methods)), key=lambda i: means[metric][methods[i]] * (1 if better == "lower" else -1))
        for place, i in enumerate(order, 1):
            method = methods[i]
            rows.append(
                RankRow(
                    metric,
                    label,
                    better,
                    place,
                    method,
                    means[metric][method],
                    float(intervals[i, 0]),
                    float(intervals[i, 1]),
                    len(columns[method]),
                    flagged[method],
                    beats[method],
                )
            )
    return rows


def format_ranking(rows: list[RankRow]) -> list[str]:
    """One block per metric: rank, method, mean, 95 % CI, marks."""
    lines: list[str] = []
    for metric in dict.fromkeys(row.metric for row in rows):
        group = [row for row in rows if row.metric == metric]
        lines += ["", f"{group[0].label} ({group[0].better} is better; {group[0].images} image(s))"]
        width = max(len(row.method) for row in group)
        for row in group:
            marks = [
                *(["SANITY FAILED"] if row.sanity_failed else []),
                *(["not above randomcam"] if row.beats_random is False and row.method != RANDOM_BASELINE else []),
            ]
            interval = f"[{row.ci_low:.3f}, {row.ci_high:.3f}]"
            cells = f"  {row.rank:>2}. {row.method.ljust(width)}  {row.mean:8.3f}  {interval:>20}"
            lines.append(f"{cells}  {'  '.join(marks)}".rstrip())
    lines += [
        "",
        "(95 % bootstrap confidence intervals over images; SANITY FAILED: the maps barely change when the "
        "model is randomised; not above randomcam: no better than noise on deletion/insertion AUC or pointing)",
    ]
    return lines


def _better(direction: str, value: float, other: float) -> bool:
    return value < other if direction == "lower" else value > other
