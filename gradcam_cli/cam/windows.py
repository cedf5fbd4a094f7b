"""Maps of a whole volume from sliding windows, as nnU-Net predicts a scan.

A segmenter of volumes is run on windows of its patch size (``Windows.patch``) placed as nnU-Net places them
(``compute_steps_for_sliding_window``: steps of at most ``step`` x the patch, 0.5 by default, spread evenly so that
the first window starts at the volume's first voxel and the last ends at its last) and weighted as nnU-Net weights
their logits (``compute_gaussian``: a Gaussian centred on the window, sigma 1/8 of the patch per axis, peak 1, no
zeros). A volume smaller than the patch along an axis is padded with zeros on both sides (``pad_nd_image``) and its
maps cut back.

Each window's map is that of the segmentation score inside the window (:class:`WindowScore`): class c's logits
summed over the window's voxels predicted as c (the window's own argmax, as its logits are what the model predicts
there), or over a region mask's voxels in the window. The windows' maps, upsampled to the patch and unnormalised, are
stitched with the same Gaussian weights, ``sum_w g_w map_w / sum_w g_w``, then normalised over the whole volume (per
class; several layers fuse as :func:`~gradcam_cli.cam.maps.to_image_maps` fuses them). Where one window covers the
volume this is the whole volume's map; ``windows=None`` runs the whole volume in one pass.

Memory: the stitched maps (one (K, D, H, W) float32 array per method and layer), the summed weights (D, H, W) and one
batch of windows: its inputs, logits and the explained layers' activations and gradients (the explainer's).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import UsageError
from ..models.modes import model_state_preserved
from ..models.tasks import describe_output
from .explainer import Explainer
from .maps import fuse, normalise_, upsample
from .methods import METHODS
from .results import ImageExplanation, Prediction
from .scores import Cams, ClassName, MaskedProbability, explanations_of, sum_or_none
from .segmentation import BACKGROUND

STEP = 0.5
"""nnU-Net's default step between windows, as a fraction of the patch (``tile_step_size``)."""
SIGMA = 1.0 / 8
"""nnU-Net's Gaussian sigma, as a fraction of the patch (``compute_gaussian``'s ``sigma_scale``)."""
Slices = tuple[slice, ...]
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Windows:
    """How a volume is cut: ``patch`` (D, H, W) windows ``step`` x the patch apart at most, weighted by a Gaussian
    of sigma ``sigma`` x the patch (``gaussian=False``: all weights 1, MONAI's ``constant`` mode), ``batch_size``
    windows per forward pass."""

    patch: tuple[int, ...]
    step: float = STEP
    sigma: float = SIGMA
    batch_size: int = 1
    gaussian: bool = True

    def __post_init__(self) -> None:
        if not self.patch or min(self.patch) < 1:
            raise UsageError(f"a window's sides must be at least 1 voxel, not {self.patch}")
        if not 0 < self.step <= 1:
            raise UsageError(f"the step between windows is a fraction of the patch in (0, 1], not {self.step:g}")
        if self.batch_size < 1:
            raise UsageError("windows are run at least 1 at a time")


def window_steps(shape: Sequence[int], patch: Sequence[int], step: float = STEP) -> list[list[int]]:
    """Each axis's window starts, as nnU-Net's ``compute_steps_for_sliding_window`` (``shape`` at least ``patch``)."""
    starts = []
    for size, tile in zip(shape, patch, strict=True):
        count = math.ceil((size - tile) / (tile * step)) + 1
        spacing = (size - tile) / (count - 1) if count > 1 else 0.0
        starts.append([round(spacing * i) for i in range(count)])
    return starts


def window_slices(shape: Sequence[int], patch: Sequence[int], step: float = STEP) -> list[Slices]:
    """Every window of a volume of ``shape``, as slices of its spatial axes, the last axis fastest."""
    grids = window_steps(shape, patch, step)
    found: list[Slices] = [()]
    for starts, tile in zip(grids, patch, strict=True):
        found = [(*done, slice(start, start + tile)) for done in found for start in starts]
    return found


def gaussian_weights(patch: Sequence[int], sigma: float = SIGMA) -> torch.Tensor:
    """nnU-Net's ``compute_gaussian`` scaled to a peak of 1: a unit impulse at the centre (``i // 2``) filtered by
    scipy's ``gaussian_filter`` (sigma ``sigma`` x each side, truncated at 4 sigma, zero outside), zeros raised to
    the smallest value left."""
    axes = []
    for side in patch:
        s = side * sigma
        offsets = torch.arange(side, dtype=torch.float64) - side // 2
        kernel = torch.exp(-0.5 * (offsets / s) ** 2) if s > 0 else (offsets == 0).double()
        axes.append(torch.where(offsets.abs() <= int(4 * s + 0.5), kernel, 0.0))
    weights = axes[0]
    for axis in axes[1:]:
        weights = weights[..., None] * axis
    weights = weights / weights.max()
    floor = weights[weights > 0].min()
    return torch.where(weights > 0, weights, floor).float()


def padding(shape: Sequence[int], patch: Sequence[int]) -> list[tuple[int, int]]:
    """(before, after) zeros per axis that bring ``shape`` to at least ``patch``, split as nnU-Net splits them."""
    return [
        ((max(0, tile - size)) // 2, max(0, tile - size) - (max(0, tile - size)) // 2)
        for size, tile in zip(shape, patch, strict=True)
    ]


def volume_logits(output: object) -> torch.Tensor:
    """A volume segmenter's (N, classes, D, H, W) logits: the output, its ``out`` entry, or its first (deep
    supervision's full-resolution) entry."""
    logits = output.get("out") if isinstance(output, dict) else output
    logits = logits[0] if isinstance(logits, list | tuple) and logits else logits
    if isinstance(logits, torch.Tensor) and logits.dim() == 5:
        return logits
    raise UsageError(f"the model returned {describe_output(output)}; a volume segmenter returns (N, classes, D, H, W)")


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=1)`` of (N, classes, D, H, W) logits, the same indices (the first of equal maxima), one
    class at a time: torch's CPU argmax over a short axis that is not the last is strided and several times slower
    (a second for a 3-class 128^3 window). Logits with a NaN (its argmax: the first NaN) take torch's own."""
    logits = logits.detach()
    if logits.device.type != "cpu" or logits.shape[1] > 8 or bool(logits.isnan().any()):
        return logits.argmax(dim=1)
    best = logits[:, 0].clone()
    predicted = torch.zeros(best.shape, dtype=torch.long, device=logits.device)
    for c in range(1, logits.shape[1]):
        values = logits[:, c]
        predicted.masked_fill_(values > best, c)
        torch.maximum(best, values, out=best)
    return predicted


class WindowScore:
    """The segmentation score of ``classes`` in a batch of windows: each class's logits summed over the voxels
    predicted as it, or over ``regions`` ((B, d, h, w) bool: the region mask's part in each window)."""

    def __init__(self, classes: Sequence[int], regions: torch.Tensor | None = None) -> None:
        self.classes, self.regions = list(classes), regions
        self.logits: torch.Tensor | None = None
        """The logits of the last batch scored, detached."""
        self.predicted: torch.Tensor | None = None
        """Their argmax over the classes, (B, d, h, w)."""

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> WindowTargets:
        logits = volume_logits(output)
        self.logits, self.predicted = logits.detach(), predicted_classes(logits)
        return WindowTargets(logits, self.predicted, self.classes, self.regions)


class WindowTargets:
    """One window batch's targets: target ``k`` is class ``classes[k]`` in every window."""

    def __init__(
        self, logits: torch.Tensor, predicted: torch.Tensor, classes: list[int], regions: torch.Tensor | None
    ) -> None:
        self.logits, self.predicted, self.classes, self.regions = logits, predicted, classes, regions

    @property
    def count(self) -> int:
        return len(self.classes)

    @property
    def region(self) -> tuple[float, float]:
        return (1.0, 1.0)

    def mask(self, k: int) -> torch.Tensor:
        """(B, d, h, w): the voxels class ``classes[k]``'s score sums its logits over."""
        if self.regions is not None:
            return self.regions.to(self.predicted.device)
        return self.predicted == self.classes[k]

    def value(self, k: int) -> torch.Tensor | None:
        """The logits of class ``classes[k]`` summed over its voxels in each window that has any (``None``: none
        has), zeros put where the mask is off rather than the voxels gathered: half the time, forward and back."""
        mask, c = self.mask(k), self.classes[k]
        logits = self.logits[:, c]
        return sum_or_none([torch.where(mask[n], logits[n], 0).sum() for n in range(len(mask)) if mask[n].any()])

    def masked(self, k: int) -> MaskedProbability:
        mask, c = self.mask(k), self.classes[k]

        def probability(output: object, samples: torch.Tensor) -> torch.Tensor:
            probabilities = volume_logits(output).float().softmax(dim=1)[:, c]
            values = [probabilities[j].masked_select(mask[s]) for j, s in enumerate(samples.tolist())]
            return torch.stack([v.mean() if v.numel() else v.new_zeros(()) for v in values])

        return probability

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        """Each window's own maps (normalised per window: the stitching reads the coarse maps instead)."""
        results = []
        for n, size in enumerate(sizes):
            explanations = []
            for k, c in enumerate(self.classes):
                share = float(self.mask(k)[n].float().mean())
                explanations += explanations_of(cams, n, k, Prediction(c, class_name(c), share, share=share), size)
            results.append(ImageExplanation([], explanations))
        return results


@dataclass
class VolumeExplanation:
    """A volume's maps: ``maps[method]`` (K, D, H, W) in [0, 1], map k explaining class ``classes[k]``;
    ``shares``: (classes,) the fraction of the volume each class is predicted on (the windows' predictions,
    weighted as their maps are); ``windows``: how many windows ran per pass."""

    classes: list[int]
    maps: dict[str, torch.Tensor]
    shares: torch.Tensor
    windows: int
    layers: tuple[str, ...] = field(default=())


def _all_channels(window: Slices) -> Slices:
    """``window``'s voxels of every channel (or class)."""
    everything = (slice(None), *window)
    return everything


class _Stitcher:
    """The volume padded to the patch, its windows and their summed weights, and the running sums."""

    def __init__(self, volume: torch.Tensor, windows: Windows | None) -> None:
        shape = tuple(volume.shape[1:])
        self.windows = windows or Windows(shape, gaussian=False)
        patch = self.windows.patch
        if len(patch) != len(shape):
            raise UsageError(
                f"a {len(patch)}-D window cannot cut a {len(shape)}-D volume ({'x'.join(map(str, shape))})"
            )
        self.pads = padding(shape, patch)
        flat = [side for before, after in reversed(self.pads) for side in (before, after)]
        self.volume = F.pad(volume, flat) if any(flat) else volume
        self.shape = tuple(self.volume.shape[1:])
        self.crop = tuple(slice(before, before + side) for (before, _), side in zip(self.pads, shape, strict=True))
        self.slices = window_slices(self.shape, patch, self.windows.step)
        self.counted: torch.Tensor | None = None  # the volume's voxels, where padding was added
        if self.shape != shape:
            self.counted = torch.zeros(self.shape, dtype=torch.bool, device=volume.device)
            self.counted[self.crop] = True
        device = volume.device
        g = gaussian_weights(patch, self.windows.sigma) if self.windows.gaussian else torch.ones(patch)
        self.weights = g.to(device)
        self.total = torch.zeros(self.shape, device=device)
        for s in self.slices:
            self.total[s] += self.weights

    def batches(self) -> Iterator[list[Slices]]:
        size = self.windows.batch_size
        for start in range(0, len(self.slices), size):
            yield self.slices[start : start + size]

    def inputs(self, batch: list[Slices]) -> torch.Tensor:
        return torch.stack([self.volume[_all_channels(s)] for s in batch])

    def pad_region(self, region: torch.Tensor | None) -> torch.Tensor | None:
        if region is None:
            return None
        flat = [side for before, after in reversed(self.pads) for side in (before, after)]
        return F.pad(region.to(self.volume.device, torch.uint8), flat).bool()

    def add(self, into: torch.Tensor, batch: list[Slices], values: torch.Tensor) -> None:
        """``values`` (B, K, d, h, w) of the windows of ``batch`` added into (K, D, H, W) ``into``, weighted."""
        values = values.to(into.device) * self.weights
        for s, value in zip(batch, values, strict=True):
            into[_all_channels(s)] += value

    def results(self, sums: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """Each of ``sums`` made the weighted mean of the windows in place, cut back to the volume; the summed
        weights are dropped (the volume's maps and their normalised copies are what is held from here on)."""
        means = [summed.div_(self.total)[_all_channels(self.crop)] for summed in sums]
        del self.total
        return means


def explain_volume(
    explainer: Explainer,
    volume: torch.Tensor,
    windows: Windows | None = None,
    classes: Sequence[int] | None = None,
    top_k: int = 1,
    region: torch.Tensor | None = None,
    progress: Progress | None = None,
) -> VolumeExplanation:
    """Explain a (C, D, H, W) ``volume`` (normalised as the model takes it) with ``explainer``'s methods and layers,
    window by window (``windows``; ``None``: the whole volume in one pass).

    ``classes``: the classes explained; ``None``: the classes the windows predict (other than the background), most
    voxels first, at most ``top_k`` (a first pass without gradients counts them). ``region``: a (D, H, W) mask; each
    class's score then sums its logits over the mask's voxels. ``progress(done, total)`` after each window batch of
    each pass."""
    stitcher = _Stitcher(volume, windows)
    padded_region = stitcher.pad_region(region)
    if classes is None:
        shares = _shares(explainer, stitcher, padded_region, progress)
        order = shares.argsort(descending=True, stable=True).tolist()
        classes = [c for c in order if shares[c] > 0 and c != BACKGROUND][:top_k]
    classes = list(classes)
    layers = explainer.chosen.layers or ("",)
    sums = {
        (m, layer): torch.zeros((len(classes), *stitcher.shape), device=volume.device)
        for m in explainer.chosen.methods
        for layer in layers
    }
    votes: torch.Tensor | None = None
    done, total = 0, len(stitcher.slices)
    for batch in stitcher.batches():
        regions = _window_regions(padded_region, batch)
        runner = copy.copy(explainer)
        runner.score = score = WindowScore(classes, regions)
        targets, cams = runner.compute_targets(stitcher.inputs(batch))
        if score.logits is not None and score.predicted is not None:
            votes = _vote(stitcher, votes, score.logits.shape[1], score.predicted, batch, padded_region)
        for (method, layer), summed in sums.items():
            index = layers.index(layer)
            per_class = [upsample(cams[method][k][index], stitcher.windows.patch) for k in range(len(classes))]
            if per_class:
                stitcher.add(summed, batch, torch.stack(per_class, dim=1))
        del targets, cams, score
        done += len(batch)
        if progress is not None:
            progress(done, total)
    shares = _shares_of(stitcher, votes)
    means = dict(zip(sums, stitcher.results(sums.values()), strict=True))
    del sums
    maps = {}
    for method in explainer.chosen.methods:
        per_layer = [normalise_(means.pop((method, layer))).contiguous() for layer in layers] if classes else []
        maps[method] = fuse(per_layer, METHODS[method].fusion) if per_layer else torch.zeros((0, *volume.shape[1:]))
    return VolumeExplanation(classes, maps, shares, len(stitcher.slices), explainer.chosen.layers)


def _window_regions(region: torch.Tensor | None, batch: list[Slices]) -> torch.Tensor | None:
    return None if region is None else torch.stack([region[s] for s in batch])


def _vote(
    stitcher: _Stitcher,
    votes: torch.Tensor | None,
    classes: int,
    predicted: torch.Tensor,
    batch: list[Slices],
    region: torch.Tensor | None,
) -> torch.Tensor:
    """(classes,) running sums of each class's weighted votes, ``g_w(v) / sum_w g_w(v)`` per voxel a window predicts
    it on (``predicted``: (B, d, h, w) the windows' argmax; inside ``region``): the windows' predicted share of the
    volume, summed."""
    votes = votes if votes is not None else torch.zeros(classes, dtype=torch.float64, device=stitcher.total.device)
    for s, window in zip(batch, predicted, strict=True):
        weight = (stitcher.weights / stitcher.total[s])[None]
        if region is not None:
            weight = weight * region[s]
        if stitcher.counted is not None:
            weight = weight * stitcher.counted[s]
        votes += torch.bincount(
            window.to(weight.device).flatten(), weights=weight.flatten().double(), minlength=classes
        )
    return votes


def _shares_of(stitcher: _Stitcher, votes: torch.Tensor | None) -> torch.Tensor:
    voxels = math.prod(side.stop - side.start for side in stitcher.crop)
    return (votes / voxels).float() if votes is not None else torch.zeros(0)


def _shares(
    explainer: Explainer, stitcher: _Stitcher, region: torch.Tensor | None, progress: Progress | None
) -> torch.Tensor:
    """Each class's predicted share of the volume (inside ``region``) from a pass without gradients."""
    module = explainer.network[0]
    votes = None
    done, total = 0, len(stitcher.slices)
    with model_state_preserved(module), torch.no_grad():
        for batch in stitcher.batches():
            logits = volume_logits(module(stitcher.inputs(batch).to(explainer.device))).float()
            votes = _vote(stitcher, votes, logits.shape[1], predicted_classes(logits), batch, region)
            del logits
            done += len(batch)
            if progress is not None:
                progress(done, total)
    return _shares_of(stitcher, votes)
