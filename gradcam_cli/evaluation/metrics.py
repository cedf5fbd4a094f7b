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
- Random-logit test: Sixt, Granz, Landgraf, "When Explanations Lie: Why Many Modified BP Attributions Fail", ICML 2020.
- sMPRT and eMPRT: Hedstrom et al., "Sanity Checks Revisited: An Exploration to Repair the Model Parameter
  Randomisation Test", XAI in Action workshop, NeurIPS 2023.
- ARCC: the RefineCAM paper (ICPR 2026), after ADCC (Poppi et al., "Revisiting the Evaluation of Class Activation
  Mapping for Explainability", CVPR Workshops 2021).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

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


SSIM_WINDOW = 7
"""SSIM's window side (scikit-image's default, Wang et al. 2004's uniform variant)."""
ENTROPY_BINS = 100
"""eMPRT's histogram bins (Quantus' ``discrete_entropy`` default)."""


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = SSIM_WINDOW) -> float:
    """Structural similarity of two equally shaped maps (1 to 3 axes), as scikit-image's ``structural_similarity``
    computes it: means, (sample) variances and covariance over every ``window``-wide window wholly inside the map (a
    uniform filter along each axis), ``C1 = (0.01 R)^2``, ``C2 = (0.03 R)^2`` with ``R`` the range of both maps'
    values together, and the mean over the windows of
    ``(2 mu_a mu_b + C1)(2 s_ab + C2) / ((mu_a^2 + mu_b^2 + C1)(s_a^2 + s_b^2 + C2))``. 1 for equal maps (also two
    equal constant ones)."""
    if a.shape != b.shape:
        raise ValueError(f"maps differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    if min(a.shape) < window or not 1 <= a.dim() <= 3:
        raise ValueError(f"SSIM takes maps of 1 to 3 axes, each at least {window} long: {tuple(a.shape)}")
    x, y = a.detach().double().cpu(), b.detach().double().cpu()
    value_range = float(torch.maximum(x.max(), y.max()) - torch.minimum(x.min(), y.min()))
    if value_range == 0.0:
        return 1.0

    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[x.dim()]

    def local_mean(t: torch.Tensor) -> torch.Tensor:  # the mean of every window wholly inside the map
        return pool(t[None, None], window, stride=1)[0, 0]

    n = window ** x.dim()
    sample = n / (n - 1)
    mx, my = local_mean(x), local_mean(y)
    vx = sample * (local_mean(x * x) - mx * mx)
    vy = sample * (local_mean(y * y) - my * my)
    vxy = sample * (local_mean(x * y) - mx * my)
    c1, c2 = (0.01 * value_range) ** 2, (0.03 * value_range) ** 2
    index = (2 * mx * my + c1) * (2 * vxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    return float(index.mean())


def discrete_entropy(saliency: torch.Tensor, bins: int = ENTROPY_BINS) -> float:
    """eMPRT's complexity of a map (Hedstrom et al. 2023; Quantus' ``discrete_entropy``): the Shannon entropy (nats)
    of the histogram of its values in ``bins`` equal bins over their own range, ``-sum_k p_k ln p_k``,
    ``p_k = count_k / n``."""
    counts, _ = np.histogram(saliency.detach().double().flatten().cpu().numpy(), bins=bins)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def efficient_mprt(original: torch.Tensor, randomised: torch.Tensor, bins: int = ENTROPY_BINS) -> float:
    """eMPRT (Hedstrom et al. 2023; Quantus' ``EfficientMPRT``): the relative rise in complexity,
    ``(H(e_rand) - H(e)) / H(e)`` with ``H`` :func:`discrete_entropy`, from the trained model's map ``e`` to the
    fully randomised model's ``e_rand``. Higher is better (a map that follows the model turns noisy when the model
    is noise); NaN where the trained model's map has zero entropy (a constant map)."""
    before = discrete_entropy(original, bins)
    return (discrete_entropy(randomised, bins) - before) / before if before > 0.0 else math.nan


def smooth_mprt(original: torch.Tensor, randomised: torch.Tensor) -> float:
    """sMPRT (Hedstrom et al. 2023; Quantus' ``SmoothMPRT``): the Spearman correlation of the trained model's map and
    the fully randomised model's, each the mean of its maps of N copies of the input (``original`` and
    ``randomised``: (N, ...) stacks), N - 1 of them noisy, and taken in absolute value. Lower is better."""
    return spearman(original.double().mean(dim=0).abs(), randomised.double().mean(dim=0).abs())


def coherency(saliency: torch.Tensor, remapped: torch.Tensor) -> float:
    """ADCC's and ARCC's coherency: ``(rho + 1) / 2``, ``rho`` Pearson's correlation of the map with the map of the
    input multiplied by it (same method, same class); 1 when explaining the highlighted part alone gives the same
    map. A constant map has no correlation: 0.5."""
    rho = pearson(saliency, remapped)
    return 0.5 if math.isnan(rho) else (rho + 1.0) / 2


ARCC_FRACTIONS = (0.2, 0.4, 0.6, 0.8)
"""The fractions of pixels removed for ARCC's ROAD (pytorch-grad-cam's ``ARCC``: percentiles 20, 40, 60, 80)."""


def arcc(complexity: float, coherent: float, road_score: float) -> float:
    """ARCC: the harmonic mean of coherency, ``1 - complexity`` and ROAD,
    ``3 / (1/coherency + 1/(1 - complexity) + 1/road')``, where ``complexity`` is the map's mean (its L1 norm over
    its pixels, maps in [0, 1]) and ``road' = clip(2 road, 0, 1)``, ``road`` ROADCombined (mean of (LeRF - MoRF) / 2)
    over :data:`ARCC_FRACTIONS`. 0 (the harmonic mean's limit) when any of the three is 0. Higher is better."""
    parts = (coherent, 1.0 - complexity, min(max(2.0 * road_score, 0.0), 1.0))
    return 0.0 if min(parts) <= 0.0 else 3.0 / sum(1.0 / part for part in parts)
