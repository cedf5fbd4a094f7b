"""ROAD, RemOve And Debias (Rong, Leemann, Borisov, Kasneci & Kasneci, "A Consistent and Efficient Evaluation
Strategy for Attribution Methods", ICML 2022): pixels are removed by *noisy linear imputation*, which leaves no
sharp mask for the model to recognise, so that what the removal measures is the information taken away.

Imputation (the authors' ``NoisyLinearImputer``, as pytorch-grad-cam ships it): every removed pixel takes the
weighted mean of its 8 neighbours, direct ones weighing 1/6 and diagonal ones 1/12 (neighbours outside the image
left out), removed neighbours being unknowns too, so the removed pixels solve one sparse linear system per image
and channel: for removed pixel i, (sum_j w_ij) x_i - sum_{j removed} w_ij x_j = sum_{j kept} w_ij x_j. Then
Gaussian noise of standard deviation :data:`ROAD_NOISE` is added to the removed pixels. The system is symmetric
positive definite (wherever a removed region touches a kept pixel). On a CPU it is solved directly, as the
authors do, by SciPy's sparse LU (one factorisation per image, shared by its channels): several times less CPU
time than the iterative solve. On an accelerator it is solved in torch, on the model's device, by conjugate
gradients preconditioned with a multigrid V-cycle, to a relative residual of :data:`ROAD_TOLERANCE` (the noise
is 100 times larger than the difference from the direct solution).

Measures, at removal fractions q in :data:`ROAD_FRACTIONS`: MoRF removes the fraction q of the pixels with the
highest saliency (most relevant first; lower probability is better), LeRF the fraction q with the lowest (least
relevant first; higher is better); ties in the map keep row-major order in both, as in deletion and insertion:
of two pixels with the same saliency, the earlier in row-major order is removed first, by MoRF and by LeRF alike
(Grad-CAM maps have large regions of exact zeros, which LeRF's first fractions remove from the top left on). The
combined score is pytorch-grad-cam's ``ROADCombined``: mean over q of (LeRF_q - MoRF_q) / 2 (higher is better).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
import torch.nn.functional as F

from .metrics import importance_ranks

ROAD_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""The fractions of pixels removed (pytorch-grad-cam's percentiles 10, 20, ..., 90)."""
ROAD_NOISE = 0.01
"""Standard deviation of the noise added to imputed pixels, in the network input's (normalised) units."""
ROAD_TOLERANCE = 1e-5
"""Conjugate gradients stop when every system's residual is below this fraction of its right-hand side."""
_MAX_ITERATIONS = 500
_WEIGHTS = {(dy, dx): (1 / 12 if dy and dx else 1 / 6) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx}
_OFFSETS = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
_CENTRE = _OFFSETS.index((0, 0))
_SMOOTHING = 0.8
"""Weight of each Jacobi sweep in the multigrid preconditioner."""
_COARSEST = 4
"""A multigrid level this small (on its longer side) is solved by :data:`_COARSE_SWEEPS` Jacobi sweeps."""
_COARSE_SWEEPS = 30


def impute(
    images: torch.Tensor,
    removed: torch.Tensor,
    noise: float = ROAD_NOISE,
    generator: torch.Generator | None = None,
    tolerance: float = ROAD_TOLERANCE,
) -> torch.Tensor:
    """Noisy linear imputation of (B, C, H, W) ``images`` at the (B, H, W) boolean ``removed`` pixels (see the
    module docstring); kept pixels are returned unchanged."""
    x = images.detach().float()
    unknown = removed.to(x.dtype).unsqueeze(1)
    if x.device.type == "cpu" and not bool(removed.flatten(1).all(dim=1).any()):  # (all removed: singular)
        filled = torch.stack([_direct(image, mask) for image, mask in zip(x, removed, strict=True)])
    else:
        filled = torch.where(removed.unsqueeze(1), _iterative(x, unknown, tolerance), x)
    if noise:
        filled = filled + unknown * noise * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    return filled.to(images.dtype)


def _iterative(x: torch.Tensor, unknown: torch.Tensor, tolerance: float) -> torch.Tensor:
    """The system's solution by preconditioned conjugate gradients, (B, C, H, W), zero off the removed pixels."""
    stencil = _fine_stencil(unknown)
    rhs = torch.zeros_like(x)
    for dy, dx in _OFFSETS:
        if (dy, dx) != (0, 0):
            rhs = rhs + _WEIGHTS[(dy, dx)] * _shift(x * (1 - unknown), dy, dx)
    return _conjugate_gradients(stencil, rhs * unknown, tolerance)


def _direct(image: torch.Tensor, removed: torch.Tensor) -> torch.Tensor:
    """The (C, H, W) ``image`` with its (H, W) ``removed`` pixels replaced by the system's exact solution (SciPy's
    sparse LU in float64, one factorisation for all channels)."""
    height, width = removed.shape
    values = image.double().reshape(image.shape[0], -1).numpy().copy()
    unknowns = np.flatnonzero(removed.reshape(-1).numpy())
    if not unknowns.size:
        return image.clone()
    index = np.full(height * width, -1, dtype=np.int64)
    index[unknowns] = np.arange(unknowns.size)
    ys, xs = np.divmod(unknowns, width)
    rows, cols, coefficients = [], [], []
    diagonal = np.zeros(unknowns.size)
    rhs = np.zeros((unknowns.size, values.shape[0]))
    for (dy, dx), weight in _WEIGHTS.items():
        y, x = ys + dy, xs + dx
        inside = np.flatnonzero((y >= 0) & (y < height) & (x >= 0) & (x < width))
        neighbours = y[inside] * width + x[inside]
        diagonal[inside] += weight
        removed_too = index[neighbours] >= 0
        rows.append(inside[removed_too])
        cols.append(index[neighbours[removed_too]])
        coefficients.append(np.full(int(removed_too.sum()), -weight))
        np.add.at(rhs, inside[~removed_too], weight * values[:, neighbours[~removed_too]].T)
    every = np.arange(unknowns.size)
    matrix = scipy.sparse.csc_matrix(
        (np.concatenate([*coefficients, diagonal]), (np.concatenate([*rows, every]), np.concatenate([*cols, every]))),
        shape=(unknowns.size, unknowns.size),
    )
    values[:, unknowns] = scipy.sparse.linalg.splu(matrix).solve(rhs).T
    return torch.from_numpy(values).reshape(image.shape).to(image.dtype)


def _shift(values: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """values[..., i + dy, j + dx], zero outside the grid."""
    padded = F.pad(values, (1, 1, 1, 1))
    h, w = values.shape[-2:]
    return padded[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]


def _fine_stencil(unknown: torch.Tensor) -> torch.Tensor:
    """The system's 9-point stencil, (B, 9, H, W): the coefficient of v[i + offset] in (A v)_i, zero off the
    removed pixels (the kept ones are no unknowns)."""
    ones = torch.ones_like(unknown)
    stencil = torch.zeros(unknown.shape[0], 9, *unknown.shape[-2:], dtype=unknown.dtype, device=unknown.device)
    for index, (dy, dx) in enumerate(_OFFSETS):
        if (dy, dx) != (0, 0):
            weight = _WEIGHTS[(dy, dx)]
            stencil[:, index] = -weight * (unknown * _shift(unknown, dy, dx))[:, 0]
            stencil[:, _CENTRE] += weight * (unknown * _shift(ones, dy, dx))[:, 0]
    return stencil


def _apply(stencil: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A v for (B, C, h, w) values and a (B, 9, h, w) stencil (one padded copy, nine views of it)."""
    padded = F.pad(values, (1, 1, 1, 1))
    h, w = values.shape[-2:]
    result = stencil[:, _CENTRE : _CENTRE + 1] * values
    for index, (dy, dx) in enumerate(_OFFSETS):
        if (dy, dx) != (0, 0):
            result.addcmul_(stencil[:, index : index + 1], padded[..., 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w])
    return result


def _even(values: torch.Tensor) -> torch.Tensor:
    return F.pad(values, (0, values.shape[-1] % 2, 0, values.shape[-2] % 2))


def _restrict(values: torch.Tensor) -> torch.Tensor:
    """Sums over 2 x 2 blocks (the transpose of :func:`_prolong`)."""
    return F.avg_pool2d(_even(values), 2) * 4


def _prolong(values: torch.Tensor, size: torch.Size) -> torch.Tensor:
    """Each coarse value repeated over its 2 x 2 block, cropped to ``size``."""
    return values.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)[..., : size[0], : size[1]]


def _coarsen(stencil: torch.Tensor) -> torch.Tensor:
    """The Galerkin stencil P^T A P of 2 x 2 aggregates: each fine coupling lands on the coarse offset between the
    two pixels' blocks."""
    fine = _even(stencil)
    coarse = torch.zeros(*fine.shape[:2], fine.shape[2] // 2, fine.shape[3] // 2, dtype=fine.dtype, device=fine.device)
    for index, (dy, dx) in enumerate(_OFFSETS):
        for a in (0, 1):
            for b in (0, 1):
                coarse[:, _OFFSETS.index(((a + dy) // 2, (b + dx) // 2))] += fine[:, index, a::2, b::2]
    return coarse


class _Multigrid:
    """A symmetric V-cycle (weighted Jacobi sweeps, 2 x 2 aggregates), the conjugate gradients' preconditioner."""

    def __init__(self, stencil: torch.Tensor) -> None:
        self.levels = [stencil]
        while max(self.levels[-1].shape[-2:]) > _COARSEST:
            self.levels.append(_coarsen(self.levels[-1]))
        self.inverses = [
            torch.where(diagonal > 0, 1 / diagonal.clamp_min(1e-30), 0)
            for diagonal in (level[:, _CENTRE : _CENTRE + 1] for level in self.levels)
        ]

    def __call__(self, residual: torch.Tensor, depth: int = 0) -> torch.Tensor:
        stencil, inverse = self.levels[depth], self.inverses[depth]
        last = depth == len(self.levels) - 1
        sweeps = _COARSE_SWEEPS if last else 2
        correction = _SMOOTHING * inverse * residual
        for _ in range(sweeps - 1):
            correction = correction + _SMOOTHING * inverse * (residual - _apply(stencil, correction))
        if last:
            return correction
        coarse = self(_restrict(residual - _apply(stencil, correction)), depth + 1)
        correction = correction + _prolong(coarse, residual.shape[-2:])
        for _ in range(sweeps):
            correction = correction + _SMOOTHING * inverse * (residual - _apply(stencil, correction))
        return correction


def _conjugate_gradients(stencil: torch.Tensor, rhs: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Solve A x = rhs, one system per sample and channel, by conjugate gradients preconditioned with a multigrid
    V-cycle, until every residual is below ``tolerance`` times its right-hand side."""
    multigrid = _Multigrid(stencil)

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(dim=(2, 3), keepdim=True)

    solution = torch.zeros_like(rhs)
    residual = rhs.clone()
    preconditioned = multigrid(residual)
    direction = preconditioned
    rho = dot(residual, preconditioned)
    goal = tolerance * dot(rhs, rhs).sqrt()
    for _ in range(_MAX_ITERATIONS):
        if bool((dot(residual, residual).sqrt() <= goal).all()):
            break
        product = _apply(stencil, direction)
        curvature = dot(direction, product)
        step = torch.where(curvature > 0, rho / torch.where(curvature > 0, curvature, 1), 0)
        solution = solution + step * direction
        residual = residual - step * product
        preconditioned = multigrid(residual)
        rho_next = dot(residual, preconditioned)
        direction = preconditioned + torch.where(rho > 0, rho_next / torch.where(rho > 0, rho, 1), 0) * direction
        rho = rho_next
    return solution


def road_masks(
    saliency: torch.Tensor, fractions: Sequence[float] = ROAD_FRACTIONS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(MoRF, LeRF) boolean masks of the pixels removed at each fraction, each (len(fractions), H, W): the
    ``round(q * H * W)`` most salient pixels, and as many least salient ones; among equal values, the earlier
    pixels in row-major order go first in both."""
    most, least = importance_ranks(saliency), importance_ranks(saliency, least_first=True)
    pixels = most.numel()
    counts = torch.tensor([round(q * pixels) for q in fractions], device=most.device).view(-1, 1, 1)
    return most.unsqueeze(0) < counts, least.unsqueeze(0) < counts


def combined(morf: Sequence[float], lerf: Sequence[float]) -> float:
    """pytorch-grad-cam's ``ROADCombined``: mean over the fractions of (LeRF - MoRF) / 2."""
    if len(morf) != len(lerf) or not morf:
        raise ValueError("need as many (at least one) MoRF as LeRF scores")
    return sum((le - mo) / 2 for mo, le in zip(morf, lerf, strict=True)) / len(morf)
