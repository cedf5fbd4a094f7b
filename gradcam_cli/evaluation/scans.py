"""``gradcam eval`` of a volume model, scan by scan (docs/volumes.md, "Evaluating maps on scans"): voxel deletion and
insertion along a scan's map, the score read through the model's own sliding windows.

Each scan is read and normalised as ``gradcam`` reads it (never resampled) and explained as ``gradcam`` explains it:
a segmenter over its sliding windows (:func:`~gradcam_cli.cam.windows.explain_volume`), the class of
``--target-class``, else the one it predicts on most voxels other than the background; a classifier on the whole
volume (:func:`~gradcam_cli.cam.whole_volume.explain_classified`), ``--target-class``, else its top class. The score
of a (perturbed) copy of the scan:

- **a segmenter**: the class's softmax probability averaged over the region, the voxels the model predicts as the
  class on the scan itself (or ``--target region:MASK``'s), from the logits of the copy's windows stitched with
  nnU-Net's Gaussian weights, as nnU-Net stitches a prediction;
- **a classifier**: the class's softmax probability of the copy, resized as the model takes it.

**Deletion**: the voxels, ordered by the map (highest first, ties in C order), set to 0 (the normalised scan's
mean, for a z-scored one) in ``--steps`` equal steps, every channel; **insertion**: put back, in the same order, into
the scan blurred by a 3-D Gaussian (:data:`~gradcam_cli.evaluation.report.BLUR_KERNEL` voxels,
:data:`~gradcam_cli.evaluation.report.BLUR_SIGMA`). A faithful map's deletion curve falls fast (a low area), its
insertion curve rises fast (a high area). The masked probability (the scan times its map), sparseness and complexity
are an image's; with ``--masks``, pointing, energy and Dice against each scan's label mask (:mod:`.scan_masks`).
ROAD, the sanity check, stability, faithfulness correlation and boxes are refused; ``--rank`` ranks what is measured.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..cam.whole_volume import explain_classified, model_input
from ..cam.windows import Windows, explain_volume, gaussian_weights, padding, volume_logits, window_slices
from ..errors import ImageError, UsageError
from ..io.discovery import InputImage
from ..io.volumes import Volume, read_region, read_volume
from ..models.modes import model_state_preserved
from ..models.volume_spec import VolumeSpec
from ..options import EvalOptions
from . import metrics
from .images import report_of, scored_safely
from .report import BLUR_KERNEL, BLUR_SIGMA, EvalReport, ImageScores, MethodScores
from .scan_masks import class_voxels, mask_file, mask_scores
from .shared import methods_to_run

Score = Callable[[list[torch.Tensor]], list[float]]
"""The explained class's score of each (C, D, H, W) copy of a scan."""


def refuse_for_scans(options: EvalOptions, boxes: Sequence[object] | None = None) -> None:
    """Refuse, in one line, what ``gradcam eval`` does not measure on scans."""
    given = {
        "--road": options.road,
        "--sanity": options.sanity,
        "--stability": options.stability,
        "--faithfulness-correlation": options.correlation,
        "--boxes": bool(boxes) or options.boxes is not None,
        "--fps": options.fps is not None,
        "--meta": options.meta,
    }
    refused = next((name for name, value in given.items() if value), None)
    if refused is not None:
        raise UsageError(f"{refused} is not measured on scans; a scan's maps are measured by deletion and insertion")


def blurred(volume: torch.Tensor) -> torch.Tensor:
    """A (C, D, H, W) volume blurred by a separable 3-D Gaussian (BLUR_KERNEL voxels a side, sigma BLUR_SIGMA), its
    edges replicated."""
    half = BLUR_KERNEL // 2
    t = torch.arange(BLUR_KERNEL, dtype=torch.float32, device=volume.device) - half
    kernel = torch.exp(-(t**2) / (2 * BLUR_SIGMA**2))
    kernel = kernel / kernel.sum()
    y = volume.float()[:, None]
    for axis in range(3):
        shape = [1, 1, 1, 1, 1]
        shape[2 + axis] = BLUR_KERNEL
        pad = [0] * 6
        pad[2 * (2 - axis)] = pad[2 * (2 - axis) + 1] = half
        y = F.conv3d(F.pad(y, pad, mode="replicate"), kernel.view(shape))
    return y[:, 0]


def stitched_probabilities(module: torch.nn.Module, volumes: torch.Tensor, windows: Windows) -> torch.Tensor:
    """(N, K, D, H, W): a segmenter's softmax of (N, C, D, H, W) volumes' logits stitched over ``windows`` (each
    window's logits weighted by the Gaussian, divided by the summed weights: nnU-Net's prediction), padding cut off;
    the N volumes' windows at one place are one forward pass."""
    shape = tuple(volumes.shape[2:])
    pads = padding(shape, windows.patch)
    flat = [side for before, after in reversed(pads) for side in (before, after)]
    padded = F.pad(volumes, flat) if any(flat) else volumes
    slices = window_slices(tuple(padded.shape[2:]), windows.patch, windows.step)
    weights = gaussian_weights(windows.patch, windows.sigma).to(volumes.device)
    total = torch.zeros(padded.shape[2:], device=volumes.device)
    summed: torch.Tensor | None = None
    for s in slices:
        window = _every_volume_and_channel(s)
        logits = volume_logits(module(padded[window])).float()
        if summed is None:
            summed = torch.zeros((len(volumes), logits.shape[1], *padded.shape[2:]), device=volumes.device)
        summed[window] += logits * weights
        total[s] += weights
    assert summed is not None
    crop = tuple(slice(before, before + side) for (before, _), side in zip(pads, shape, strict=True))
    return (summed / total).softmax(dim=1)[_every_volume_and_channel(crop)]


def _every_volume_and_channel(window: tuple[slice, ...]) -> tuple[slice, ...]:
    everything = (slice(None), slice(None), *window)
    return everything


class ScanEvaluator:
    """The deletion and insertion of a volume model's maps on scans (the module docstring)."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        spec = explainer.model.profile.volume
        if spec is None:
            raise UsageError(f"{explainer.model.name} takes no scans")
        refuse_for_scans(self.options)
        self.spec: VolumeSpec = spec
        self.classifier = explainer.adapter.whole_scans
        if explainer.options.region is not None and self.classifier:
            raise UsageError(f"--target region: is for segmenters; {explainer.model.name} classifies scans")
        patch = spec.patch if spec.patch and not self.classifier else (1, 1, 1)
        self.windows = Windows(patch, spec.step)  # explained one window at a time, as gradcam does by default
        self.sanity_modules: list[str] = []
        self.on_result: Callable[[ImageScores], Any] | None = None
        self.done: Mapping[str, ImageScores] = {}
        self.undetected = 0  # scans whose label mask has no voxel of the explained class

    def run(
        self,
        images: Sequence[InputImage | str | Path],
        boxes: Sequence[object] | None = None,
        on_image: Callable[[], Any] | None = None,
        on_result: Callable[[ImageScores], Any] | None = None,
        on_method: Callable[[str], Any] | None = None,
        done: Mapping[str, ImageScores] | None = None,
    ) -> EvalReport:
        """Every scan's figures, in order; ``on_result`` with each (scan, method)'s figures as they are ready and with
        each failed scan (``--rank --report``'s rows file); ``done``: scan path -> the methods already finished on
        it (``--skip-existing``), kept, not computed again."""
        refuse_for_scans(self.options, boxes)
        self.on_result, self.done, self.undetected = on_result, done or {}, 0
        results = []
        for scan in images:
            item = scan if isinstance(scan, InputImage) else InputImage(Path(scan), Path(Path(scan).name))
            results.append(scored_safely(item.path, partial(self.evaluate_scan, item, on_method)))
            if on_result is not None and results[-1].error is not None:
                on_result(results[-1])
            if on_image is not None:
                on_image()
        return report_of(self.explainer, self.options, results, 0, undetected=self.undetected)

    def evaluate_scan(self, scan: InputImage, on_method: Callable[[str], Any] | None = None) -> ImageScores:
        """One scan's figures per method (the module docstring), the methods :meth:`run`'s ``done`` holds kept."""
        name, methods = str(scan.path), self.explainer.chosen.methods
        done = self.done.get(name)
        todo = tuple(m for m in methods if done is None or m not in done.methods)
        if done is not None and not todo:
            return ImageScores(name, done.target, dict(done.methods))
        explainer = self.explainer if len(todo) == len(methods) else self.explainer.with_options(methods=todo)
        volume = read_volume(scan.channels or (scan.path,))
        axes = self.spec.axes(scan.path.name.lower().endswith((".nii", ".nii.gz")))
        x = self.spec.normalise(torch.from_numpy(volume.data).permute(0, *(a + 1 for a in axes)))
        x = x.to(self.explainer.device)
        explained, maps, score = self._explained(explainer, scan, volume, axes, x)
        explained.probability = full = score([x])[0]
        inside = self._labelled(scan, volume, axes, explained.index)
        figures: dict[str, MethodScores] = {}
        for method in methods_to_run(methods, done, figures, on_method):
            saliency = maps[method].to(self.explainer.device)
            figures[method] = self._curves(x, saliency, full, score)
            if inside is not None:
                box, dice = mask_scores(saliency, inside, explained)
                figures[method].boxes, figures[method].extra["dice"] = [box], dice
            if self.on_result is not None:
                self.on_result(ImageScores(name, explained, {method: figures[method]}))
        return ImageScores(name, explained, figures)

    def _explained(
        self, explainer: Explainer, scan: InputImage, volume: Volume, axes: tuple[int, ...], x: torch.Tensor
    ) -> tuple[Prediction, dict[str, torch.Tensor], Score]:
        """The class explained on the normalised scan ``x``, each method's map, and the score of a copy of it."""
        target = explainer.chosen.target
        classes = [target] if isinstance(target, int) else None
        device = explainer.device
        if self.classifier:
            whole = explain_classified(explainer, x, self.spec.patch, classes, 1)
            if not whole.targets:
                raise ImageError(f"{scan.path}: nothing to explain")
            explained = whole.targets[0]
            return explained, {m: each[0] for m, each in whole.maps.items()}, partial(self._classified, explained.index)
        mask = explainer.options.region
        region = None if mask is None else torch.from_numpy(read_region(mask, volume)).permute(axes).to(device)
        result = explain_volume(explainer, x, self.windows, classes, 1, region)
        if not result.classes:
            raise ImageError(f"{scan.path}: the model predicts nothing but the background; no class to evaluate")
        c = result.classes[0]
        with model_state_preserved(explainer.model.module), torch.inference_mode():
            inside = region if region is not None else self._probabilities(x[None])[0].argmax(dim=0) == c
        if not inside.any():
            raise ImageError(f"{scan.path}: no voxel is predicted as {explainer.model.class_name(c)}")
        share = float(result.shares[c]) if c < len(result.shares) else 0.0
        explained = Prediction(c, explainer.model.class_name(c), 0.0, share=share)
        return explained, {m: each[0] for m, each in result.maps.items()}, partial(self._segmented, c, inside)

    def _labelled(self, scan: InputImage, volume: Volume, axes: tuple[int, ...], index: int) -> torch.Tensor | None:
        """With ``--masks``: the scan's voxels of class ``index`` in its label mask, as the model takes the scan
        (:mod:`.scan_masks`); ``None``: no mask, or none of the class's voxels in it (counted)."""
        path = mask_file(self.options.masks, scan) if self.options.masks is not None else None
        if path is None:
            return None
        inside = torch.from_numpy(class_voxels(path, volume, index)).permute(axes).to(self.explainer.device)
        if not inside.any():
            self.undetected += 1
            return None
        return inside

    def _curves(self, x: torch.Tensor, saliency: torch.Tensor, full: float, score: Score) -> MethodScores:
        steps = self.options.steps
        counts = metrics.step_counts(saliency.numel(), steps)
        ranks = metrics.importance_ranks(saliency)[None]
        baseline, start = torch.zeros_like(x), blurred(x)
        deletion = [torch.where(ranks < counts[k], baseline, x) for k in range(1, steps)]
        insertion = [torch.where(ranks < counts[k], x, start) for k in range(1, steps)]
        values = score([*deletion, *insertion, baseline, start, x * saliency[None]])
        inner = steps - 1
        figures = MethodScores(
            deletion=[full, *values[:inner], values[-3]],
            insertion=[values[-2], *values[inner : 2 * inner], full],
            masked_probability=values[-1],
        )
        figures.gini, figures.entropy = metrics.gini(saliency.cpu()), metrics.entropy(saliency.cpu())
        return figures

    def _probabilities(self, copies: torch.Tensor) -> torch.Tensor:
        return stitched_probabilities(self.explainer.model.module, copies, self.windows)

    def _segmented(self, c: int, inside: torch.Tensor, copies: list[torch.Tensor]) -> list[float]:
        """The class's mean probability over ``inside`` of each copy, through the windows, ``--batch-size`` copies
        at a time."""
        size, found = self.options.batch_size, []
        with model_state_preserved(self.explainer.model.module), torch.inference_mode():
            for start in range(0, len(copies), size):
                probabilities = self._probabilities(torch.stack(copies[start : start + size]))[:, c]
                found += probabilities[:, inside].mean(dim=1).tolist()
        return found

    def _classified(self, c: int, copies: list[torch.Tensor]) -> list[float]:
        """The class's probability of each copy, ``--batch-size`` copies per forward pass."""
        module, size, found = self.explainer.model.module, self.options.batch_size, []
        with model_state_preserved(module), torch.inference_mode():
            for start in range(0, len(copies), size):
                batch = torch.cat([model_input(copy, self.spec.patch) for copy in copies[start : start + size]])
                found += module(batch).float().softmax(dim=1)[:, c].tolist()
        return found
