"""Pure metric functions for judging saliency maps: no model, no files, only numbers in and numbers out.

Maps are (H, W) tensors; boxes are ``(x1, y1, x2, y2)`` in continuous pixel coordinates, where pixel ``(row, col)``
covers ``[col, col + 1) x [row, row + 1)`` and counts as inside a box when its centre ``(col + 0.5, row + 0.5)`` is.
Integer boxes therefore have exclusive ends, as PIL's ``paste`` and most CSV exports use them.

References:
- Deletion and insertion: Petsiuk, Das, Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box
  Models", BMVC 2018.
- Average Drop and Increase in Confidence: Chattopadhay et al., "Grad-CAM++", WACV 2018.
- Pointing game: Zhang et al., "Top-down Neural Attention by Excitation Backprop", ECCV 2016 (15-pixel tolerance).
- Energy-based pointing game: Wang et al., "Score-CAM", CVPR Workshops 2020.
- Model-parameter randomisation test: Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018.
- Sparseness: Chalasani et al., "Concise Explanations of Neural Networks using Adversarial Training", ICML 2020.
- Complexity and faithfulness correlation: Bhatt, Weller, Moura, "Evaluating and Aggregating Feature-based Model
  Explanations", IJCAI 2020.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..options import POINTING_TOLERANCE

Box = tuple[float, float, float, float]


def auc(curve: Sequence[float]) -> float:
    """Area under a curve sampled at evenly spaced fractions 0, 1/n, ..., 1 (trapezoidal rule, x in [0, 1])."""
    values = [float(v) for v in curve]
    if len(values) < 2:
        raise ValueError("a curve needs at least two points")
    return (sum(values) - (values[0] + values[-1]) / 2) / (len(values) - 1)


def step_counts(pixels: int, steps: int) -> list[int]:
    """How many pixels are perturbed at each of the ``steps + 1`` points of a deletion or insertion curve."""
    if steps < 1:
        raise ValueError("steps must be at least 1")
    return [round(k * pixels / steps) for k in range(steps + 1)]


def importance_ranks(saliency: torch.Tensor, least_first: bool = False) -> torch.Tensor:
    """Each pixel's position when the map is sorted from most to least salient (0 = most salient), or with
    ``least_first`` from least to most salient (0 = least salient), as (H, W).

    Either way ties keep row-major order (a stable sort): of two equal pixels, the earlier in row-major order comes
    first, so the result is deterministic.
    """
    flat = saliency.flatten()
    order = torch.sort(flat, descending=not least_first, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(flat.numel(), device=flat.device)
    return ranks.view(saliency.shape)


def average_drop(full: Sequence[float], masked: Sequence[float]) -> float:
    """Average Drop in %: mean over images of max(0, Y - O) / Y (Y: score on the image, O: on image x map)."""
    pairs = _pairs(full, masked)
    return 100.0 * sum(max(0.0, y - o) / y if y > 0 else 0.0 for y, o in pairs) / len(pairs)


def increase_in_confidence(full: Sequence[float], masked: Sequence[float]) -> float:
    """Increase in Confidence in %: the share of images whose score on image x map beats the score on the image."""
    pairs = _pairs(full, masked)
    return 100.0 * sum(o > y for y, o in pairs) / len(pairs)


def _pairs(full: Sequence[float], masked: Sequence[float]) -> list[tuple[float, float]]:
    if len(full) != len(masked) or not full:
        raise ValueError("need the same number (at least one) of full-image and masked-image scores")
    return [(float(y), float(o)) for y, o in zip(full, masked, strict=True)]


def peak(saliency: torch.Tensor) -> tuple[int, int]:
    """(row, col) of the map's maximum; among equal maxima the first in row-major order."""
    index = int(torch.argmax(saliency.flatten()))
    return divmod(index, saliency.shape[-1])


def distance_to_box(row: int, col: int, box: Box) -> float:
    """Euclidean distance from pixel (row, col)'s centre to a box (0 inside it)."""
    x, y = col + 0.5, row + 0.5
    x1, y1, x2, y2 = box
    dx = max(x1 - x, 0.0, x - x2)
    dy = max(y1 - y, 0.0, y - y2)
    return math.hypot(dx, dy)


def pointing_hit(saliency: torch.Tensor, boxes: Sequence[Box], tolerance: float = POINTING_TOLERANCE) -> bool:
    """Pointing game: a hit when the map's maximum lies within ``tolerance`` pixels of any box."""
    row, col = peak(saliency)
    return any(distance_to_box(row, col, box) <= tolerance for box in boxes)


def box_mask(shape: Sequence[int], boxes: Sequence[Box], device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean (H, W) mask of the pixels whose centres lie in at least one box."""
    height, width = shape
    cols = torch.arange(width, device=device, dtype=torch.float32) + 0.5
    rows = torch.arange(height, device=device, dtype=torch.float32) + 0.5
    mask = torch.zeros(height, width, dtype=torch.bool, device=device)
    for x1, y1, x2, y2 in boxes:
        mask |= ((rows >= y1) & (rows <= y2))[:, None] & ((cols >= x1) & (cols <= x2))[None, :]
    return mask


def energy_inside(saliency: torch.Tensor, boxes: Sequence[Box]) -> float:
    """Energy-based pointing game: the share of the map's total (non-negative) mass inside the boxes.

    NaN for a map with no mass at all (nothing to locate).
    """
    saliency = saliency.float().clamp_min(0.0)
    total = float(saliency.sum())
    if total <= 0.0:
        return math.nan
    inside = float(saliency[box_mask(saliency.shape, boxes, saliency.device)].sum())
    return inside / total


def average_ranks(values: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of a 1-D tensor, tied values sharing the mean of their ranks (as in Spearman's rho)."""
    _, inverse, counts = torch.unique(values, sorted=True, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks: torch.Tensor = mean_rank[inverse]
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two equally shaped maps (tied values get average ranks).

    A constant map has no ranking: two constant maps count as unchanged (1.0), one constant map against a varying
    one as unrelated (0.0).
    """
    if a.shape != b.shape:
        raise ValueError(f"maps differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    ra = average_ranks(a.detach().flatten().float().cpu())  # on the CPU: float64 ranks (MPS has no float64)
    rb = average_ranks(b.detach().flatten().float().cpu())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    norm_a, norm_b = float(ra.norm()), float(rb.norm())
    if norm_a == 0.0 or norm_b == 0.0:
        return 1.0 if norm_a == norm_b else 0.0
    return float((ra * rb).sum()) / (norm_a * norm_b)


def gini(saliency: torch.Tensor) -> float:
    """Sparseness as the Gini index of the map's values (Chalasani et al., ICML 2020; Quantus' ``Sparseness``):
    G = sum_i (2i - n - 1) v_(i) / (n sum_i v_i), v sorted ascending, i = 1..n. 0 for a uniform map, towards 1 when
    one pixel holds everything; 0 for an all-zero map. Higher is sparser."""
    values = saliency.detach().flatten().double().clamp_min(0).sort().values
    total, n = float(values.sum()), values.numel()
    if total == 0.0:
        return 0.0
    weights = 2 * torch.arange(1, n + 1, dtype=torch.float64, device=values.device) - n - 1
    return float((weights * values).sum()) / (n * total)


def entropy(saliency: torch.Tensor) -> float:
    """Complexity as the Shannon entropy of the map taken as a distribution over its pixels (Bhatt et al., IJCAI
    2020; Quantus' ``Complexity``): H = -sum_i p_i ln p_i, p_i = v_i / sum v, divided by ln n so that a uniform map
    scores 1 (an all-zero map too) and a one-pixel map 0. Lower is simpler."""
    values = saliency.detach().flatten().double().clamp_min(0)
    total, n = float(values.sum()), values.numel()
    if total == 0.0 or n < 2:
        return 1.0
    p = values / total
    return float(-(p * torch.log(p.clamp_min(1e-300))).sum()) / math.log(n)


def relative_change(original: torch.Tensor, perturbed: torch.Tensor) -> float:
    """||m' - m||_2 / ||m||_2 of two maps (Yeh et al.'s normalised sensitivity, NeurIPS 2019); a zero original map
    counts as changed (1) unless the other is zero too (0)."""
    norm = float(original.detach().double().norm())
    change = float((perturbed.detach().double() - original.detach().double()).norm())
    if norm == 0.0:
        return 0.0 if change == 0.0 else 1.0
    return change / norm


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson's correlation of two equally long 1-D series, in float64; NaN where either is constant (no
    correlation is defined)."""
    x, y = a.detach().double().flatten().cpu(), b.detach().double().flatten().cpu()
    if x.numel() != y.numel() or x.numel() < 2:
        raise ValueError("need two equally long series of at least two values")
    x, y = x - x.mean(), y - y.mean()
    norm = float(x.norm()) * float(y.norm())
    return float((x * y).sum()) / norm if norm > 0.0 else math.nan


def correlation_subsets(pixels: int, size: int, runs: int, seed: int) -> torch.Tensor:
    """Faithfulness correlation's random subsets: (runs, size) pixel indices (row-major, into ``pixels``), each row
    ``size`` distinct pixels drawn uniformly without replacement, from a CPU generator seeded with ``seed``."""
    if not 0 < size <= pixels or runs < 2:
        raise ValueError(f"need 0 < subset size <= {pixels} pixels and at least 2 runs")
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(pixels, generator=generator)[:size] for _ in range(runs)])


def subset_masks(subsets: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Boolean (runs, H, W) masks of the (runs, size) row-major pixel ``subsets`` of an H x W image (a clip's
    (runs, T, H, W) of its voxels, ``shape`` (T, H, W)): True where a pixel is removed (replaced by the baseline in
    every channel)."""
    masks = torch.zeros(len(subsets), math.prod(shape), dtype=torch.bool, device=subsets.device)
    masks[torch.arange(len(subsets), device=subsets.device)[:, None], subsets] = True
    return masks.view(-1, *shape)


def faithfulness_correlation(saliency: torch.Tensor, subsets: torch.Tensor, drops: torch.Tensor) -> float:
    """Faithfulness correlation (Bhatt et al., IJCAI 2020; Quantus' ``FaithfulnessCorrelation``): Pearson's
    correlation, over the runs, between the map's sum over each run's subset of pixels and the drop in the class
    score when those pixels are replaced by the baseline, ``drops[r] = f(x) - f(x with subsets[r] removed)``.
    Higher is better (-1 to 1); NaN where the sums or the drops do not vary."""
    sums = saliency.detach().double().flatten().cpu()[subsets.cpu()].sum(dim=1)
    return pearson(sums, drops)
