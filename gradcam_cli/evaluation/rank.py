"""``gradcam eval --rank``: every method ranked per metric, with bootstrap intervals over images and paired
comparisons (docs/evaluation.md, "Ranking", is the protocol; this module computes it).

Per metric: each image's value for each method (:data:`RANKED`) on the images every method has a value for (an image
a run was interrupted on counts for the methods finished on it: their comparisons are over the images both
finished), in float64; each method's mean and the percentile 95 % interval of the mean over
:data:`~gradcam_cli.evaluation.intervals.BOOTSTRAP_RESAMPLES` resamples of the images (the same resamples for every
method, drawn from ``seed``; widened to hold the mean where the percentiles miss it). Methods with equal means share
a rank. The comparisons are paired: the per-image difference between each method and the best one, and between each
method and ``randomcam``, with a BCa bootstrap 95 % interval
(:func:`~gradcam_cli.evaluation.intervals.paired_interval`, Efron 1987); a method is indistinguishable from the best
where that interval holds 0, and beats randomcam where, on every faithfulness metric measured, its interval lies
wholly on the better side of 0. Methods that cannot be told apart share a group. Below :data:`MIN_IMAGES` images the
intervals are marked not reliable; one image gives none.

A detector's per-detection metrics (:data:`CLUSTERED`) rank the mean over every explained detection: an image's
value is the mean over its detections, weighted by their count, and every bootstrap resamples images (the cluster
bootstrap: the detections of one image, which share its pixels and its passes, stay together).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, ClassVar

import torch

from ..options import RANDOM_BASELINE
from . import metrics
from .intervals import BOOTSTRAP_RESAMPLES, detection_counts, image_weights, intervals, paired_interval, weighted_mean
from .report import DetectionFigures, EvalReport, ImageScores, MethodScores, mean_or_nan

MIN_IMAGES = 10
"""Fewer images than this: the bootstrap intervals (percentile and BCa alike) under-cover; the table says so."""
FAITHFULNESS = (
    "deletion_auc",
    "insertion_auc",
    "temporal_deletion_auc",
    "temporal_insertion_auc",
    "pointing",
    "box_deletion_auc",
    "box_insertion_auc",
)
"""The metrics a method must beat ``randomcam`` on (those measured)."""

Value = Callable[[ImageScores, MethodScores], float | None]


def _drop(image: ImageScores, s: MethodScores) -> float | None:
    y = image.target.probability if image.target else 0.0
    return metrics.average_drop([y], [s.masked_probability]) if y > 0 and s.deletion else None


def _increase(image: ImageScores, s: MethodScores) -> float | None:
    y = image.target.probability if image.target else 0.0
    return metrics.increase_in_confidence([y], [s.masked_probability]) if s.deletion else None


def _extra(name: str) -> Value:
    return lambda _i, s: None if math.isnan(v := s.extra.get(name, math.nan)) else v


def _boxes(value: Callable[[MethodScores], float]) -> Value:
    return lambda _image, s: value(s) if s.boxes else None


def _per_detection(value: Callable[[DetectionFigures], float]) -> Value:
    """The mean of ``value`` over the image's explained detections (NaN values left out); ``None``: none."""

    def mean(_image: ImageScores, s: MethodScores) -> float | None:
        found = [v for v in map(value, s.detections) if not math.isnan(v)]
        return sum(found) / len(found) if found else None

    return mean


RANKED: dict[str, tuple[str, str, Value]] = {
    "deletion_auc": ("deletion AUC", "lower", lambda _i, s: s.deletion_auc if s.deletion else None),
    "insertion_auc": ("insertion AUC", "higher", lambda _i, s: s.insertion_auc if s.insertion else None),
    "temporal_deletion_auc": (
        "frames deletion AUC",
        "lower",
        lambda _i, s: s.temporal_deletion_auc if s.temporal_deletion else None,
    ),
    "temporal_insertion_auc": (
        "frames insertion AUC",
        "higher",
        lambda _i, s: s.temporal_insertion_auc if s.temporal_insertion else None,
    ),
    "average_drop": ("average drop %", "lower", _drop),
    "increase_in_confidence": ("increase in confidence %", "higher", _increase),
    "road": ("ROAD", "higher", lambda _i, s: s.road if s.road_morf else None),
    "faithfulness_correlation": (
        "faithfulness correlation",
        "higher",
        lambda _i, s: None if math.isnan(s.faithfulness_correlation) else s.faithfulness_correlation,
    ),
    "arcc": ("ARCC", "higher", _extra("arcc")),
    "random_logit": ("random logit (SSIM)", "lower", _extra("random_logit")),
    "smprt": ("sMPRT (Spearman)", "lower", _extra("smprt")),
    "emprt": ("eMPRT (complexity rise)", "higher", _extra("emprt")),
    "pointing": ("pointing %", "higher", _boxes(lambda s: 100.0 * sum(b.hit for b in s.boxes) / len(s.boxes))),
    "energy": ("energy in box", "higher", _boxes(lambda s: sum(b.energy for b in s.boxes) / len(s.boxes))),
    "dice": ("Dice (top voxels, a scan's mask)", "higher", _extra("dice")),
    "box_deletion_auc": ("box deletion AUC (per detection)", "lower", _per_detection(lambda d: d.deletion_auc)),
    "box_insertion_auc": ("box insertion AUC (per detection)", "higher", _per_detection(lambda d: d.insertion_auc)),
    "box_pointing": ("box pointing % (own box)", "higher", _per_detection(lambda d: 100.0 * d.hit)),
    "box_energy": ("box energy (own box)", "higher", _per_detection(lambda d: d.energy)),
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
CLUSTERED = ("box_deletion_auc", "box_insertion_auc", "box_pointing", "box_energy")
"""The metrics whose unit is a detection: images weighted by their detections' count (the module docstring)."""


@dataclass(frozen=True)
class RankRow:
    """One method's place on one metric. ``rank``: 1 + the number of methods with a better mean (ties share it);
    ``group``: 1 for the methods indistinguishable from the best, then 2, ... (see :func:`groups`);
    ``vs_best``/``vs_random``: the mean per-image difference to the best method / to randomcam and its paired BCa
    interval (NaN where not measured); ``per_image``: the values ranked, by image path."""

    kind: ClassVar[str] = "rank"
    """``--json``'s discriminator (docs/rank.schema.json)."""
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
    group: int = 1
    vs_best: float = math.nan
    vs_best_low: float = math.nan
    vs_best_high: float = math.nan
    vs_random: float = math.nan
    vs_random_low: float = math.nan
    vs_random_high: float = math.nan
    indistinguishable_from_best: bool | None = None
    reliable: bool = True
    per_image: dict[str, float] = field(default_factory=dict)
    seed_sd: float = math.nan
    """The method's own randomness on this metric: the standard deviation of a per-image value across seeds
    (:mod:`gradcam_cli.evaluation.seeds`; NaN where not measured)."""

    def to_dict(self) -> dict[str, Any]:
        nulled = {key: (None if isinstance(v, float) and math.isnan(v) else v) for key, v in asdict(self).items()}
        return {"kind": self.kind, **nulled}


def values(report: EvalReport, metric: str) -> dict[str, list[float]]:
    """Each method's per-image values of ``metric`` (:func:`measured_table`), in the report's image order."""
    return {method: list(column.values()) for method, column in measured_table(report, metric).items()}


def measured_table(report: EvalReport, metric: str) -> dict[str, dict[str, float]]:
    """Each method's values of ``metric`` by image, on the images where every method the image holds has one: every
    method of a finished run (the same images for all); an image interrupted part-way counts for the methods that
    finished on it."""
    value = RANKED[metric][2]
    columns: dict[str, dict[str, float]] = {method: {} for method in report.methods}
    for image in report.ok:
        held = [m for m in report.methods if m in image.methods]
        row = [value(image, image.methods[m]) for m in held]
        if held and all(v is not None and not math.isnan(v) for v in row):
            for method, v in zip(held, row, strict=True):
                columns[method][image.image] = float(v)  # type: ignore[arg-type]
    return columns


def tied(a: float, b: float) -> bool:
    """Equal means, up to float64 rounding of the same sums in another order."""
    return a == b or abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def groups(order: Sequence[str], apart: Callable[[str, str], bool]) -> dict[str, int]:
    """Methods best first -> group numbers: the first method leads group 1, and each next method joins the current
    group unless ``apart(method, leader)`` (its paired interval against the leader excludes 0), when it leads the
    next group."""
    out: dict[str, int] = {}
    leader, number = None, 0
    for method in order:
        if leader is None or apart(method, leader):
            leader, number = method, number + 1
        out[method] = number
    return out


def rank(
    report: EvalReport,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    spread: dict[str, dict[str, float]] | None = None,
) -> list[RankRow]:
    """Every measured metric's ranking of the report's methods (best first), with the marks above and each
    method's seed ``spread`` (method -> metric -> SD; :mod:`gradcam_cli.evaluation.seeds`) where measured."""
    spread = spread or {}
    flagged = {}
    for method in report.methods:
        sanity = report.summary(method).get("sanity")
        flagged[method] = bool(sanity["flagged"]) if sanity else None
    tables = {metric: measured_table(report, metric) for metric in RANKED}
    tables = {metric: table for metric, table in tables.items() if any(table.values())}
    data = {
        metric: {m: torch.tensor(list(v.values()), dtype=torch.float64) for m, v in columns.items()}
        for metric, columns in tables.items()
    }

    weighting = partial(_weights, detection_counts(report))

    def compare(metric: str, method: str, other: str) -> tuple[float, float, float]:
        difference = paired(tables[metric], data[metric], method, other)
        if not difference.numel():
            return math.nan, math.nan, math.nan
        weights = weighting(metric, [i for i in tables[metric][method] if i in tables[metric][other]])
        interval = paired_interval(difference, seed, resamples, weights=weights)
        return (weighted_mean(difference, weights), *interval)

    beats: dict[str, bool | None] = dict.fromkeys(report.methods)
    if RANDOM_BASELINE in report.methods:
        for method in report.methods:
            if method == RANDOM_BASELINE:
                continue  # not measured against itself: null
            checks = []
            for metric in (k for k in FAITHFULNESS if k in data):
                _, low, high = compare(metric, method, RANDOM_BASELINE)
                checks.append(None if math.isnan(low) else (high < 0 if RANKED[metric][1] == "lower" else low > 0))
            beats[method] = None if not checks or None in checks else all(checks)
    rows = []
    for metric, columns in tables.items():
        label, better, _ = RANKED[metric]
        sign = 1.0 if better == "lower" else -1.0
        methods = [m for m in columns if columns[m]]
        counts = {m: len(columns[m]) for m in methods}
        weights = [weighting(metric, columns[m]) for m in methods]
        means = {m: weighted_mean(data[metric][m], w) for m, w in zip(methods, weights, strict=True)}
        spans = intervals([data[metric][m] for m in methods], seed, resamples, weights)
        order = sorted(methods, key=lambda m: sign * means[m])
        best = order[0]
        comparisons = {m: compare(metric, m, best) for m in methods}
        against = {m: compare(metric, m, RANDOM_BASELINE) for m in methods} if RANDOM_BASELINE in methods else {}
        apart = {m: not (comparisons[m][1] <= 0.0 <= comparisons[m][2]) for m in methods}

        def differs(method: str, leader: str, metric: str = metric) -> bool:
            _, low, high = compare(metric, method, leader)
            return not math.isnan(low) and not (low <= 0.0 <= high)

        grouped = groups(order, differs)
        for method in order:
            i = methods.index(method)
            place = 1 + sum(
                1 for m in methods if sign * means[m] < sign * means[method] and not tied(means[m], means[method])
            )
            mean = means[method]
            low, high = float(spans[i, 0]), float(spans[i, 1])
            if not math.isnan(low):
                low, high = min(low, mean), max(high, mean)
            vs_best, vs_random = comparisons[method], against.get(method, (math.nan, math.nan, math.nan))
            rows.append(
                RankRow(
                    metric,
                    label,
                    better,
                    place,
                    method,
                    mean,
                    low,
                    high,
                    counts[method],
                    flagged[method],
                    beats[method],
                    group=grouped[method],
                    vs_best=vs_best[0],
                    vs_best_low=vs_best[1],
                    vs_best_high=vs_best[2],
                    vs_random=vs_random[0],
                    vs_random_low=vs_random[1],
                    vs_random_high=vs_random[2],
                    indistinguishable_from_best=None if math.isnan(vs_best[1]) else not apart[method],
                    reliable=min(counts.values()) >= MIN_IMAGES,
                    per_image=dict(columns[method]),
                    seed_sd=spread.get(method, {}).get(metric, math.nan),
                )
            )
    return rows


def _weights(counts: dict[str, float], metric: str, images: Iterable[str]) -> torch.Tensor | None:
    """Each of ``images``' weight on ``metric``: its detections' count on a :data:`CLUSTERED` one, else none."""
    return image_weights(counts, images) if metric in CLUSTERED else None


def paired(
    columns: dict[str, dict[str, float]], data: dict[str, torch.Tensor], method: str, other: str
) -> torch.Tensor:
    """The per-image differences ``method - other`` on the images both have values for (every image, unless a run
    was interrupted part-way through one)."""
    ours, theirs = columns[method], columns[other]
    if ours.keys() == theirs.keys():
        return data[method] - data[other]
    return torch.tensor([ours[i] - theirs[i] for i in ours if i in theirs], dtype=torch.float64)


def warnings(rows: Sequence[RankRow]) -> list[str]:
    """What the reader must know before trusting the intervals: too few images, or one."""
    counts = sorted({row.images for row in rows})
    if not counts:
        return []
    if counts[0] < 2:
        return ["one image: no confidence intervals and no paired comparisons (they need at least 2 images)"]
    if counts[0] < MIN_IMAGES:
        images = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"  # as the blocks say
        return [
            f"only {images} image(s): the intervals are not reliable below {MIN_IMAGES} images "
            "(bootstrap intervals under-cover there); evaluate more images before trusting the groups"
        ]
    return []


def marks(row: RankRow) -> list[str]:
    """The row's marks, as the table and the page show them."""
    return [
        *(["SANITY FAILED"] if row.sanity_failed else []),
        *(["not above randomcam"] if row.beats_random is False else []),
    ]


def format_interval(low: float, high: float) -> str:
    return "-" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]"


def group_cell(row: RankRow) -> str:
    """The row's group as shown: in parentheses below :data:`MIN_IMAGES` images, where groups are not reliable."""
    return str(row.group) if row.reliable else f"({row.group})"


def seed_cell(row: RankRow) -> str:
    """The row's seed spread as shown: ``±SD``, or ``-`` where not measured."""
    return "-" if math.isnan(row.seed_sd) else f"±{row.seed_sd:.3f}"


def format_ranking(rows: list[RankRow]) -> list[str]:
    """One block per metric: rank, group, method, mean, 95 % CI, the paired difference to the best, the seed
    spread (where measured), marks."""
    lines: list[str] = [*(f"warning: {line}" for line in warnings(rows))]
    for metric in dict.fromkeys(row.metric for row in rows):
        block = [row for row in rows if row.metric == metric]
        unreliable = "" if block[0].reliable else f": groups not reliable below {MIN_IMAGES} images"
        counts = sorted({row.images for row in block})
        images = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        lines += ["", f"{block[0].label} ({block[0].better} is better; {images} image(s)){unreliable}"]
        width = max(len(row.method) for row in block)
        seeds = any(not math.isnan(row.seed_sd) for row in block)
        lines.append(
            f"  {'#':>3} {'grp':>3}  {'method'.ljust(width)}  {'mean':>8}  {'95 % CI':>20}  {'vs best (paired)':>30}"
            + (f"  {'seed sd':>8}" if seeds else "")
        )
        for row in block:
            interval = format_interval(row.ci_low, row.ci_high)
            paired = (
                "-"
                if math.isnan(row.vs_best)
                else f"{row.vs_best:+.3f} {format_interval(row.vs_best_low, row.vs_best_high)}"
            )
            name = row.method.ljust(width)
            cells = f"  {row.rank:>2}. {group_cell(row):>3}  {name}  {row.mean:8.3f}  {interval:>20}  {paired:>30}"
            cells += f"  {seed_cell(row):>8}" if seeds else ""
            lines.append(f"{cells}  {'  '.join(marks(row))}".rstrip())
    lines += [
        "",
        "(95 % bootstrap confidence intervals over images; vs best: the mean per-image difference to the best "
        "method with its paired BCa interval; grp: methods in one group cannot be told apart (in parentheses: "
        f"fewer than {MIN_IMAGES} images, not reliable); seed sd: how much a per-image value moves with the seeds "
        "of RISE's masks, randomcam's and ROAD's noise, faithfulness correlation's subsets and stability's copies (not "
        "in the intervals); SANITY FAILED: "
        "the maps change no more when the model is randomised than the check allows; not above randomcam: the "
        "paired interval against randomcam does not exclude 0 on deletion/insertion AUC (a clip's frames' too) or "
        "pointing)",
    ]
    if any(row.metric in CLUSTERED for row in rows):
        lines.append(
            "(box metrics: the mean over every explained detection; the intervals resample images, each image "
            "weighted by its detections' count)"
        )
    return lines
