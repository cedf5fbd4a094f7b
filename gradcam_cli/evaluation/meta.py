"""``gradcam eval --rank --meta``: the ranking's own test, per metric, as MetaQuantus measures it (Hedström et al.
2023, "The meta-evaluation problem in explainable AI", TMLR; docs/evaluation.md, "Meta-evaluation").

Two perturbations of the evaluation problem, each measured on every method's map of every image
(:mod:`gradcam_cli.evaluation.perturbed` computes their figures in the main pass):

- the **input resilience test** (MetaQuantus' Input Perturbation Test, its resilience half): each image's map scored
  again on :data:`META_PERTURBATIONS` copies of the image with uniform noise in ``[-META_NOISE, META_NOISE]`` added
  (the map is the unperturbed image's, as MetaQuantus'); a copy counts where the top class did not change;
- the **model reactivity test** (its Model Perturbation Test, adversary half): each method's map of the image on the
  sanity cascade's last model (its top ``--sanity-layers`` parameterised modules re-initialised), explained and
  scored there, for the same class; an image counts where that model's top class differs from the target.

The scores (each in [0, 1], higher better; MetaQuantus' formulas, :func:`iac`, :func:`iec_resilience`,
:func:`iec_adversary`): ``IAC_NR`` the mean over methods and copies of the two-sided Wilcoxon signed-rank p-value
(``zero_method="zsplit"``) between the images' values and the copies'; ``IEC_NR`` the share of (image, rank
position) whose method is the same with and without the noise; ``IAC_AR`` the mean over methods of 1 - that p-value
against the randomised model's values; ``IEC_AR`` the share of (method, image) whose value is worse on the
randomised model; ``MC`` (meta-consistency) their mean.

The verdict (our thresholds: MetaQuantus gives scores, no verdict): a metric is **trusted** unless it **reorders
under noise beyond its intervals** (on some noisy copy, the mean order of two methods the ranking put in different
groups is reversed) or **does not react to a randomised model** (the count of (method, image) values worse there is
not above chance: one-sided sign test, p >= :data:`REACT_P`). Fewer than 2 images counted: not measured.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np
from scipy import stats

from .rank import RANKED, RankRow, measured_table
from .report import EvalReport

META_PERTURBATIONS = 5
"""Noisy copies of each image (MetaQuantus' K in its paper's benchmarks)."""
META_NOISE = 0.05
"""Half-width of the input resilience test's uniform noise, in the network's input units (about 3 of 255 grey levels
for an ImageNet-normalised model; MetaQuantus' ImageNet suite adds U(-0.001, 0.001))."""
REACT_P = 0.05
"""A metric reacts to the randomised model where the one-sided sign test's p-value is below this."""
MIN_COUNTED = 2


def iac(q: Sequence[float], q_hat: Sequence[float], adversary: bool) -> float:
    """MetaQuantus' intra-consistency of one method under one perturbation: the two-sided Wilcoxon signed-rank p-value
    of the paired ``q`` and ``q_hat`` (``zero_method="zsplit"``); 1 - p for the adversary test. NaN below 2 pairs."""
    if len(q) < MIN_COUNTED:
        return math.nan
    with warnings.catch_warnings():  # scipy's note that ties or zeros make it switch to the normal approximation
        warnings.simplefilter("ignore")
        p = float(stats.wilcoxon(q, q_hat, alternative="two-sided", zero_method="zsplit")[1])
    return 1.0 - p if adversary else p


def iec_resilience(q_star: np.ndarray, q_hat: np.ndarray) -> float:
    """MetaQuantus' inter-consistency under noise: ``q_star``, ``q_hat`` (methods, images) -> the share of (image,
    position) where the methods sorted by value (``np.argsort``, as MetaQuantus) are the same. NaN: no image."""
    if not q_star.shape[1]:
        return math.nan
    return float(np.mean(np.argsort(q_star, axis=0) == np.argsort(q_hat, axis=0)))


def iec_adversary(q_star: np.ndarray, q_hat: np.ndarray, better: str) -> float:
    """MetaQuantus' inter-consistency under the adversary: the share of (method, image) whose value in ``q_hat`` is
    worse than in ``q_star`` (strictly, in the metric's ``better`` direction). NaN: no image."""
    if not q_star.size:
        return math.nan
    worse = q_hat > q_star if better == "lower" else q_hat < q_star
    return float(np.mean(worse))


def sign_test(worse: int, pairs: int) -> float:
    """One-sided sign test: the probability of ``worse`` or more of ``pairs`` fair coin flips."""
    return float(stats.binom.sf(worse - 1, pairs, 0.5)) if pairs else math.nan


@dataclass(frozen=True)
class MetaRow:
    """One metric's meta-evaluation (the module docstring). ``iac_nr``/``iac_ar``: per method; ``iec_nr``: per noisy
    copy; ``copies``: the copies counted (image, copy) pairs; ``images_model``: images counted by the model test;
    ``reorders``: ``[better, worse, copy]`` pairs of methods in different groups reversed on a noisy copy."""

    kind: ClassVar[str] = "meta"
    metric: str
    label: str
    better: str
    trusted: bool | None
    reasons: list[str]
    iac_nr: float
    iec_nr: float
    iac_ar: float
    iec_ar: float
    mc: float
    react_p: float
    copies: int
    images_model: int
    reliable: bool
    iac_nr_per_method: dict[str, float] = field(default_factory=dict)
    iac_ar_per_method: dict[str, float] = field(default_factory=dict)
    iec_nr_per_copy: list[float] = field(default_factory=list)
    reorders: list[list[Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **_nulls(asdict(self))}


def _nulls(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return value


def perturbed_tables(
    report: EvalReport, metric: str, images: Sequence[str]
) -> tuple[list[dict[str, dict[str, float]]], dict[str, dict[str, float]]]:
    """The stored figures of ``metric`` on ``images``: per noisy copy, method -> image -> value (images where the
    copy changed the class, or a method has none, left out), and the randomised model's alike."""
    by_image = {image.image: image for image in report.ok}
    methods = report.methods
    copies = max((len(s.meta_input) for i in images for s in by_image[i].methods.values()), default=0)
    noisy: list[dict[str, dict[str, float]]] = [{m: {} for m in methods} for _ in range(copies)]
    model: dict[str, dict[str, float]] = {m: {} for m in methods}
    for name in images:
        scores = by_image[name].methods
        for k in range(copies):
            row = [_at(scores[m].meta_input, k, metric) for m in methods]
            if all(not math.isnan(v) for v in row):
                for m, v in zip(methods, row, strict=True):
                    noisy[k][m][name] = v
        row = [scores[m].meta_model.get(metric, math.nan) for m in methods]
        if all(not math.isnan(v) for v in row):
            for m, v in zip(methods, row, strict=True):
                model[m][name] = v
    return noisy, model


def _at(copies: Sequence[dict[str, float]], k: int, metric: str) -> float:
    return copies[k].get(metric, math.nan) if k < len(copies) else math.nan


def meta_rows(report: EvalReport, rows: Sequence[RankRow]) -> list[MetaRow]:
    """Every ranked metric's meta-evaluation where its perturbed figures were measured (``--meta``), with the
    groups of the ranking ``rows``."""
    if not any(s.meta_input or s.meta_model for image in report.ok for s in image.methods.values()):
        return []
    out = []
    for metric in dict.fromkeys(row.metric for row in rows):
        block = {row.method: row for row in rows if row.metric == metric}
        table = measured_table(report, metric)
        methods = [m for m in report.methods if m in block]
        images = [i for i in table[methods[0]] if all(i in table[m] for m in methods)] if methods else []
        noisy, model = perturbed_tables(report, metric, images)
        if not any(noisy[k][m] for k in range(len(noisy)) for m in methods) and not any(model.values()):
            continue  # not measured under perturbation (the cascade's rho, stability, boxes)
        out.append(_meta_row(metric, methods, table, block, noisy, model))
    return out


def _meta_row(
    metric: str,
    methods: list[str],
    table: dict[str, dict[str, float]],
    block: dict[str, RankRow],
    noisy: list[dict[str, dict[str, float]]],
    model: dict[str, dict[str, float]],
) -> MetaRow:
    label, better, _ = RANKED[metric]
    sign = 1.0 if better == "lower" else -1.0
    iac_nr: dict[str, list[float]] = {m: [] for m in methods}
    iec_nr, reorders, counted = [], [], 0
    for k, copy in enumerate(noisy):
        kept = list(copy[methods[0]])
        if not kept:
            iec_nr.append(math.nan)
            continue
        counted += len(kept)
        star = np.array([[table[m][i] for i in kept] for m in methods])
        hat = np.array([[copy[m][i] for i in kept] for m in methods])
        iec_nr.append(iec_resilience(star, hat))
        for x, m in enumerate(methods):
            iac_nr[m].append(iac(star[x].tolist(), hat[x].tolist(), adversary=False))
        before, after = star.mean(axis=1), hat.mean(axis=1)
        for a, first in enumerate(methods):
            for b, second in enumerate(methods):
                apart = block[first].group < block[second].group and sign * before[a] < sign * before[b]
                if apart and sign * after[a] > sign * after[b]:
                    reorders.append([first, second, k])
    kept_model = list(model[methods[0]])
    star = np.array([[table[m][i] for i in kept_model] for m in methods])
    hat = np.array([[model[m][i] for i in kept_model] for m in methods])
    iac_ar = {m: iac(star[x].tolist(), hat[x].tolist(), adversary=True) for x, m in enumerate(methods)}
    worse = int(((hat > star) if better == "lower" else (hat < star)).sum())
    react_p = sign_test(worse, hat.size)
    nr = {m: _nanmean(v) for m, v in iac_nr.items()}
    scores = [_nanmean(list(nr.values())), _nanmean(iec_nr), _nanmean(list(iac_ar.values()))]
    scores.append(iec_adversary(star, hat, better))
    trusted, reasons = verdict(reorders, react_p, len(kept_model), counted)
    return MetaRow(
        metric,
        label,
        better,
        trusted,
        reasons,
        iac_nr=scores[0],
        iec_nr=scores[1],
        iac_ar=scores[2],
        iec_ar=scores[3],
        mc=_nanmean(scores),
        react_p=react_p,
        copies=counted,
        images_model=len(kept_model),
        reliable=all(row.reliable for row in block.values()),
        iac_nr_per_method=nr,
        iac_ar_per_method=iac_ar,
        iec_nr_per_copy=iec_nr,
        reorders=reorders,
    )


def verdict(
    reorders: Sequence[Sequence[Any]], react_p: float, images_model: int, copies: int
) -> tuple[bool | None, list[str]]:
    """Trusted or not, and why (the module docstring); None where either test counted fewer than 2 images."""
    reasons = []
    if copies < MIN_COUNTED or images_model < MIN_COUNTED:
        return None, [
            "not measured: fewer than 2 images counted (noisy copies that kept the class, or images whose "
            "class the randomised model changed)"
        ]
    if reorders:
        pairs = sorted({f"{a} > {b}" for a, b, _ in reorders})
        reasons.append(f"reorders under noise beyond its intervals ({', '.join(pairs)})")
    if not react_p < REACT_P:
        reasons.append(f"does not react to a randomised model (sign test p = {react_p:.3f})")
    return not reasons, reasons or ["resilient to noise within its intervals and reacts to a randomised model"]


def _nanmean(values: Sequence[float]) -> float:
    found = [v for v in values if not math.isnan(v)]
    return sum(found) / len(found) if found else math.nan


def format_meta(rows: Sequence[MetaRow]) -> list[str]:
    """The meta-evaluation table printed after the ranking."""
    if not rows:
        return []
    width = max(len(row.label) for row in rows)
    lines = [
        "",
        "meta-evaluation (MetaQuantus; higher is better; NR: noisy copies of the images, AR: the randomised model)",
        f"  {'metric'.ljust(width)}  {'IAC_NR':>6}  {'IEC_NR':>6}  {'IAC_AR':>6}  {'IEC_AR':>6}  {'MC':>6}  verdict",
    ]
    for row in rows:
        cells = "  ".join(_cell(v) for v in (row.iac_nr, row.iec_nr, row.iac_ar, row.iec_ar, row.mc))
        said = {True: "trusted", False: "NOT TRUSTED", None: "not measured"}[row.trusted]
        why = "" if row.trusted is None else f": {'; '.join(row.reasons)}"
        lines.append(f"  {row.label.ljust(width)}  {cells}  {said}{why}".rstrip())
    lines.append(
        "(IAC: Wilcoxon p-values between the images' values before and after (NR: p; AR: 1 - p); IEC_NR: the share "
        "of rank positions kept under noise; IEC_AR: the share of values worse on the randomised model; MC: their "
        'mean; docs/evaluation.md, "Meta-evaluation")'
    )
    return lines


def _cell(value: float) -> str:
    return f"{'-':>6}" if math.isnan(value) else f"{value:6.3f}"
