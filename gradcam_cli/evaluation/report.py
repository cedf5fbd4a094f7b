"""The results of ``gradcam eval``: per-image and per-method scores, their summaries and JSON form (the curve plot:
:mod:`gradcam_cli.evaluation.plot`).

The protocol that produces them is described in docs/evaluation.md and run by :mod:`gradcam_cli.evaluation.evaluate`;
the formulas are in :mod:`gradcam_cli.evaluation.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..options import EvalOptions
from . import metrics, road

if TYPE_CHECKING:
    from ..cam.results import Prediction

BLUR_KERNEL = 11
BLUR_SIGMA = 5.0
SANITY_THRESHOLD = 0.9
SANITY_MIN_REPEAT = 0.2
"""A random method (RISE, randomcam) whose two draws on the same model agree less than this on average (Spearman)
does not repeat: the cascade cannot tell its changes from its noise, and flags it."""
"""Mean Spearman correlation above which a method's maps 'barely change' when the model is randomised."""
STABILITY_SIGMA = 0.05
"""Standard deviation of the Gaussian noise ``--stability`` adds to the network input (normalised units: about 3 of
255 grey levels for an ImageNet-normalised model)."""
OUTSIDE_THRESHOLD = 0.5
"""Images with less than this share of the map's energy inside the boxes are listed as 'evidence outside'."""
WORST_BOXES = 5
"""Detectors: how many of a method's detections the report lists as its worst (lowest insertion minus deletion AUC)."""


@dataclass
class BoxScore:
    """Pointing game and energy for one class of boxes in one image."""

    label: str | None
    target: Prediction
    hit: bool
    energy: float


@dataclass
class DetectionFigures:
    """One explained detection's figures with one method (:mod:`gradcam_cli.evaluation.detections`): its score's
    deletion and insertion curves (re-found by IoU and class in each perturbed image, 0 where it vanished), and its
    map's pointing game and energy in its own box."""

    rank: int
    target: Prediction
    deletion: list[float]
    insertion: list[float]
    hit: bool
    energy: float

    @property
    def deletion_auc(self) -> float:
        return metrics.auc(self.deletion)

    @property
    def insertion_auc(self) -> float:
        return metrics.auc(self.insertion)

    @property
    def gap(self) -> float:
        """Insertion minus deletion AUC: near 0 (or below) where the map's order hardly matters to the score."""
        return self.insertion_auc - self.deletion_auc


@dataclass
class MethodScores:
    """One method's figures on one image."""

    deletion: list[float]
    insertion: list[float]
    masked_probability: float
    boxes: list[BoxScore] = field(default_factory=list)
    sanity: list[float] = field(default_factory=list)
    road_morf: list[float] = field(default_factory=list)
    """With ``--road``: the probability with each fraction of :data:`~gradcam_cli.evaluation.road.ROAD_FRACTIONS`
    of the pixels removed, most relevant first (``road_lerf``: least relevant first)."""
    road_lerf: list[float] = field(default_factory=list)
    gini: float = math.nan
    """Sparseness of the map (:func:`~gradcam_cli.evaluation.metrics.gini`); ``entropy``: its complexity."""
    entropy: float = math.nan
    stability: list[float] = field(default_factory=list)
    """With ``--stability``: the map's relative change under each noisy copy that kept the prediction."""
    faithfulness_correlation: float = math.nan
    """With ``--faithfulness-correlation``: Pearson's correlation between the map's sums over random pixel subsets
    and the score's drops when they are removed (:func:`~gradcam_cli.evaluation.metrics.faithfulness_correlation`)."""
    extra: dict[str, float] = field(default_factory=dict)
    """With ``--arcc``, ``--random-logit``, ``--mprt``: ``arcc``, ``random_logit``, ``smprt``, ``emprt`` (NaN: none
    defined on this image; :mod:`~gradcam_cli.evaluation.extras`)."""
    sanity_redraw: float | None = None
    """With ``--sanity``, a random method only: the Spearman correlation of its map with a fresh draw (new seed) on
    the same model, the most the cascade's correlations can be (docs/evaluation.md, "Sanity check")."""
    temporal_deletion: list[float] = field(default_factory=list)
    """A video model's clip: the probability as its frames are replaced by its mean frame, most important first
    (``temporal_insertion``: put back into the clip of mean frames; :mod:`gradcam_cli.evaluation.clips`)."""
    temporal_insertion: list[float] = field(default_factory=list)
    detections: list[DetectionFigures] = field(default_factory=list)
    """Detectors: each explained detection's own figures (:class:`DetectionFigures`), in rank order."""
    meta_input: list[dict[str, float]] = field(default_factory=list)
    """``--meta``: per noisy copy, metric -> value (NaN: class changed); ``meta_model``: the randomised model's."""
    meta_model: dict[str, float] = field(default_factory=dict)

    @property
    def deletion_auc(self) -> float:
        return metrics.auc(self.deletion)

    @property
    def insertion_auc(self) -> float:
        return metrics.auc(self.insertion)

    @property
    def temporal_deletion_auc(self) -> float:
        return metrics.auc(self.temporal_deletion)

    @property
    def temporal_insertion_auc(self) -> float:
        return metrics.auc(self.temporal_insertion)

    @property
    def road(self) -> float:
        """The combined ROAD score, mean over the fractions of (LeRF - MoRF) / 2."""
        return road.combined(self.road_morf, self.road_lerf)


@dataclass
class ImageScores:
    """Everything measured on one image (``error`` set and nothing else when it failed)."""

    image: str
    target: Prediction | None = None
    methods: dict[str, MethodScores] = field(default_factory=dict)
    error: str | None = None


@dataclass
class EvalReport:
    """All images' scores plus what is needed to summarise them."""

    model: str
    layers: list[str]
    methods: list[str]
    options: EvalOptions
    sanity_modules: list[str]
    images: list[ImageScores]
    unmatched_boxes: int = 0
    target: int | None = None
    undetected_boxes: int = 0
    """Detectors and segmenters: ground-truth boxes no explained detection (or class) matched, left unscored."""

    @property
    def ok(self) -> list[ImageScores]:
        return [image for image in self.images if image.error is None]

    @property
    def failed(self) -> list[ImageScores]:
        return [image for image in self.images if image.error is not None]

    @property
    def has_curves(self) -> bool:
        """Whether deletion and insertion were measured (classifiers; detectors and segmenters: boxes only)."""
        return any(s.deletion for image in self.ok for s in image.methods.values())

    @property
    def has_boxes(self) -> bool:
        return any(s.boxes for image in self.ok for s in image.methods.values())

    @property
    def has_detections(self) -> bool:
        """Whether detections were measured one by one (detectors: :class:`DetectionFigures`)."""
        return any(s.detections for image in self.ok for s in image.methods.values())

    def summary(self, method: str) -> dict[str, Any]:
        """Figures over all images for one method (means, percentages, per-class tables, the worst images); the
        images it finished on where a run was interrupted part-way through one."""
        scores = [(image, image.methods[method]) for image in self.ok if method in image.methods]
        out: dict[str, Any] = {"images": len(scores)}
        if not scores:
            return out
        full = [image.target.probability for image, _ in scores if image.target]
        masked = [s.masked_probability for _, s in scores]
        if all(s.deletion for _, s in scores):
            out.update(
                deletion_auc=mean_or_nan([s.deletion_auc for _, s in scores]),
                insertion_auc=mean_or_nan([s.insertion_auc for _, s in scores]),
                average_drop=metrics.average_drop(full, masked),
                increase_in_confidence=metrics.increase_in_confidence(full, masked),
                deletion_curve=[mean_or_nan(column) for column in zip(*(s.deletion for _, s in scores), strict=True)],
                insertion_curve=[mean_or_nan(column) for column in zip(*(s.insertion for _, s in scores), strict=True)],
            )
        if all(s.temporal_deletion for _, s in scores):
            out.update(
                temporal_deletion_auc=mean_or_nan([s.temporal_deletion_auc for _, s in scores]),
                temporal_insertion_auc=mean_or_nan([s.temporal_insertion_auc for _, s in scores]),
            )
        if all(s.road_morf for _, s in scores):
            out.update(
                road=mean_or_nan([s.road for _, s in scores]),
                road_morf=mean_or_nan([mean_or_nan(s.road_morf) for _, s in scores]),
                road_lerf=mean_or_nan([mean_or_nan(s.road_lerf) for _, s in scores]),
                road_morf_curve=[mean_or_nan(column) for column in zip(*(s.road_morf for _, s in scores), strict=True)],
                road_lerf_curve=[mean_or_nan(column) for column in zip(*(s.road_lerf for _, s in scores), strict=True)],
            )
        figures = [{"faithfulness_correlation": s.faithfulness_correlation, **s.extra} for _, s in scores]
        for name in dict.fromkeys(key for f in figures for key in f):  # the mean where measured (not NaN)
            if values := [v for f in figures if not math.isnan(v := f.get(name, math.nan))]:
                out[name] = mean_or_nan(values)
        out.update(gini=mean_or_nan([s.gini for _, s in scores]), entropy=mean_or_nan([s.entropy for _, s in scores]))
        changes = [s.stability for _, s in scores if s.stability]
        if changes:
            out.update(
                stability_mean=mean_or_nan([mean_or_nan(c) for c in changes]),
                stability_max=mean_or_nan([max(c) for c in changes]),
            )
        found = [(image, d) for image, s in scores for d in s.detections]
        if found:
            out["detections"] = _detections_summary(found)
        rows = [(image, box) for image, s in scores for box in s.boxes]
        if rows:
            out["pointing"] = _pointing_table([box for _, box in rows])
            outside = [(image, box) for image, box in rows if not box.energy >= OUTSIDE_THRESHOLD]
            outside.sort(key=lambda row: -1.0 if math.isnan(row[1].energy) else row[1].energy)
            out["outside"] = [
                {
                    "image": image.image,
                    "class": box.label,
                    "energy": box.energy,
                    "hit": box.hit,
                    "explained": box.target.name,
                    "probability": box.target.probability,
                }
                for image, box in outside
            ]
        if self.sanity_modules:
            stages = [mean_or_nan(column) for column in zip(*(s.sanity for _, s in scores), strict=True)]
            redraws = [s.sanity_redraw for _, s in scores if s.sanity_redraw is not None]
            repeat = mean_or_nan(redraws) if redraws else 1.0  # a deterministic method repeats exactly
            threshold = SANITY_THRESHOLD * min(1.0, repeat)
            out["sanity"] = {
                "modules": self.sanity_modules,
                "spearman": stages,
                "threshold": threshold,
                **({"redraw_spearman": repeat} if redraws else {}),
                "flagged": repeat < SANITY_MIN_REPEAT or any(rho > threshold for rho in stages),
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-ready data (NaN becomes None)."""
        data = {
            "model": self.model,
            "layers": self.layers,
            "steps": self.options.steps,
            "target": self.target,
            "tolerance": self.options.tolerance,
            "deletion_baseline": "zero in normalised input space (the mean colour)",
            "insertion_baseline": f"Gaussian blur, kernel {BLUR_KERNEL}, sigma {BLUR_SIGMA}",
            **(
                {"road": {"fractions": list(road.ROAD_FRACTIONS), "noise": road.ROAD_NOISE}}
                if self.options.road
                else {}
            ),
            **(
                {
                    "faithfulness_correlation": {
                        "runs": self.options.correlation_runs,
                        "subset": self.options.correlation_subset,
                        "baseline": "zero in normalised input space (the mean colour)",
                        "seed": self.options.seed,
                    }
                }
                if self.options.correlation
                else {}
            ),
            "images": len(self.images),
            "failed": [{"image": image.image, "error": image.error} for image in self.failed],
            "unmatched_boxes": self.unmatched_boxes,
            **({"undetected_boxes": self.undetected_boxes} if self.undetected_boxes else {}),
            "methods": {method: self.summary(method) for method in self.methods},
            "per_image": [_image_dict(image) for image in self.ok],
        }
        safe: dict[str, Any] = _json_safe(data)
        return safe


def _pointing_table(boxes: Sequence[BoxScore]) -> dict[str, Any]:
    def cell(group: Sequence[BoxScore]) -> dict[str, Any]:
        energies = [b.energy for b in group if not math.isnan(b.energy)]
        hits = sum(b.hit for b in group)
        return {
            "count": len(group),
            "hits": hits,
            "accuracy": 100.0 * hits / len(group),
            "energy": mean_or_nan(energies) if energies else math.nan,
        }

    labels = sorted({b.label for b in boxes if b.label is not None})
    per_class = {label: cell([b for b in boxes if b.label == label]) for label in labels}
    return {"overall": cell(boxes), "per_class": per_class}


def _detections_summary(found: Sequence[tuple[ImageScores, DetectionFigures]]) -> dict[str, Any]:
    """A method's figures over every explained detection: means, mean curves, and the worst detections."""
    figures = [d for _, d in found]
    energies = [d.energy for d in figures if not math.isnan(d.energy)]
    worst = sorted(found, key=lambda row: row[1].gap)[:WORST_BOXES]
    return {
        "count": len(figures),
        "deletion_auc": mean_or_nan([d.deletion_auc for d in figures]),
        "insertion_auc": mean_or_nan([d.insertion_auc for d in figures]),
        "pointing": 100.0 * sum(d.hit for d in figures) / len(figures),
        "energy": mean_or_nan(energies),
        "deletion_curve": [mean_or_nan(column) for column in zip(*(d.deletion for d in figures), strict=True)],
        "insertion_curve": [mean_or_nan(column) for column in zip(*(d.insertion for d in figures), strict=True)],
        "worst": [{"image": image.image, **_detection_dict(d, curves=False)} for image, d in worst],
    }


def _detection_dict(d: DetectionFigures, curves: bool = True) -> dict[str, Any]:
    return {
        "rank": d.rank,
        "explained": _prediction_dict(d.target),
        "deletion_auc": d.deletion_auc,
        "insertion_auc": d.insertion_auc,
        "hit": d.hit,
        "energy": d.energy,
        **({"deletion_curve": d.deletion, "insertion_curve": d.insertion} if curves else {}),
    }


def _image_dict(image: ImageScores) -> dict[str, Any]:
    assert image.target is not None
    return {
        "image": image.image,
        "target": _prediction_dict(image.target),
        "methods": {
            name: {
                **(_curves_dict(s) if s.deletion else {}),
                "boxes": [
                    {"class": b.label, "explained": _prediction_dict(b.target), "hit": b.hit, "energy": b.energy}
                    for b in s.boxes
                ],
                **({"detections": [_detection_dict(d) for d in s.detections]} if s.detections else {}),
                **({"sanity_spearman": s.sanity} if s.sanity else {}),
                **({"sanity_redraw_spearman": s.sanity_redraw} if s.sanity_redraw is not None else {}),
                **(
                    {"faithfulness_correlation": s.faithfulness_correlation}
                    if not math.isnan(s.faithfulness_correlation)
                    else {}
                ),
                **s.extra,
                "gini": s.gini,
                "entropy": s.entropy,
                **({"stability": s.stability} if s.stability else {}),
            }
            for name, s in image.methods.items()
        },
    }


def _curves_dict(s: MethodScores) -> dict[str, Any]:
    measured = {"road": s.road, "road_morf_curve": s.road_morf, "road_lerf_curve": s.road_lerf} if s.road_morf else {}
    for name, curve in (("temporal_deletion", s.temporal_deletion), ("temporal_insertion", s.temporal_insertion)):
        measured |= {f"{name}_auc": metrics.auc(curve), f"{name}_curve": curve} if curve else {}  # a clip's frames
    return {
        "deletion_auc": s.deletion_auc,
        "insertion_auc": s.insertion_auc,
        "masked_probability": s.masked_probability,
        "deletion_curve": s.deletion,
        "insertion_curve": s.insertion,
        **measured,
    }


def _prediction_dict(p: Prediction) -> dict[str, Any]:
    box = {"box": list(p.box)} if p.box is not None else {}
    return {"index": p.index, "name": p.name, "probability": p.probability, **box}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def mean_or_nan(values: Sequence[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan
