"""The black-box methods' passes (RISE and occlusion; their maps are :mod:`gradcam_cli.cam.methods.perturbation`'s):
the model is only run, never differentiated, on the input with parts of it masked, and the map is built from how
the target's score responds. No layer is read.

**Masking.** A mask m (H, W) in [0, 1] multiplies the network input, x ⊙ m, so masked pixels go to zero: the
dataset's mean colour for a classifier whose input is normalised (as the deletion baseline of ``gradcam eval``),
black for a detector, which normalises inside its own transform. Masked inputs run ``batch_size`` at a time
(``Explainer(score_batch_size=...)``, as Score-CAM's), without hooks or autograd.

**The score.** f(x ⊙ m) is what Score-CAM reads from a masked input (:meth:`gradcam_cli.cam.scores.Targets.masked`):
a classifier's probability of the target class (softmax; sigmoid with ``--score sigmoid``), a detector's score of
the detection that is the explained one by the matching rule (the same class, the highest IoU with the explained
box, at least 0.5; 0 when none is: :mod:`gradcam_cli.cam.detection`), a segmenter's mean probability of the class
over the pixels it predicted for it unmasked.

**RISE** (Petsiuk, Das & Saenko, "RISE: Randomized Input Sampling for Explanation of Black-box Models", BMVC 2018):
N masks; each is a ``grid`` x ``grid`` array of cells kept with probability p, upsampled bilinearly
(``align_corners=False``) to (grid + 1) x the cell size ceil(H / grid), ceil(W / grid), and cropped to H x W at a
random offset below one cell, so that the cells do not line up from mask to mask (the authors' procedure). Defaults:
N = 4000, grid 7, p = 0.5 (:class:`gradcam_cli.options.PerturbationOptions`; Xplique's RISE uses the same). The
draws, made on the CPU from a generator seeded with the seed so that every device gets the same masks: first all
N x grid x grid cells (``torch.rand`` < p), then the N row offsets, then the N column offsets (``torch.randint``).

**Occlusion** (Zeiler & Fergus, "Visualizing and Understanding Convolutional Networks", ECCV 2014; computed as
Captum's ``Occlusion`` does): a square window of ``window`` pixels slides over the network input by ``stride``
(starting at 0, with a last window flush with the far edge where the stride does not reach it, so that every pixel
is covered); each position is set to zero in turn. Defaults: window 32, stride 16 (169 positions at 224 x 224).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from ..errors import UsageError
from ..options import PerturbationOptions

Forward = Callable[[torch.Tensor], object]
"""Runs the model on a batch without hooks or autograd and returns its output."""
ScoreReader = Callable[[object, torch.Tensor], torch.Tensor]
"""``(output for masked inputs, the sample each came from)`` -> (B,) score of that sample's target."""
Progress = Callable[[int, int], object]
"""Called as ``progress(done, total)``."""


def check_perturbation(options: PerturbationOptions) -> PerturbationOptions:
    """``options``, or a :class:`UsageError` naming the first value out of range."""
    if options.rise_masks < 1:
        raise UsageError("--rise-masks must be at least 1")
    if options.rise_grid < 1:
        raise UsageError("RISE's grid must have at least one cell")
    if not 0.0 < options.rise_probability <= 1.0:
        raise UsageError("RISE's probability of keeping a cell must be in (0, 1]")
    if options.occlusion_window < 1 or options.occlusion_stride < 1:
        raise UsageError("--occlusion-window and --occlusion-stride must be at least 1")
    return options


def perturbation_settings(options: PerturbationOptions, methods: Sequence[str]) -> dict[str, object]:
    """What a run record notes of ``options`` (they change the maps, not the file names): RISE's mask count where
    ``rise`` or ``drise`` (the same masks) is among ``methods``, occlusion's window and stride where ``occlusion``
    is."""
    rise = {"rise_masks": options.rise_masks} if "rise" in methods or "drise" in methods else {}
    window = {"occlusion_window": options.occlusion_window, "occlusion_stride": options.occlusion_stride}
    return {**rise, **(window if "occlusion" in methods else {})}


def rise_masks(
    options: PerturbationOptions, size: tuple[int, int], batch_size: int, device: torch.device | str = "cpu"
) -> Iterator[torch.Tensor]:
    """RISE's ``options.rise_masks`` masks for an input of ``size`` = (H, W), as (B, H, W) batches of at most
    ``batch_size``, drawn as the module docstring says (the masks do not depend on ``batch_size``)."""
    height, width = size
    grid, count = options.rise_grid, options.rise_masks
    generator = torch.Generator().manual_seed(options.seed)
    cells = (torch.rand(count, grid, grid, generator=generator) < options.rise_probability).float()
    cell_h, cell_w = math.ceil(height / grid), math.ceil(width / grid)
    rows = torch.randint(0, cell_h, (count,), generator=generator)
    cols = torch.randint(0, cell_w, (count,), generator=generator)
    upsampled = ((grid + 1) * cell_h, (grid + 1) * cell_w)
    for start in range(0, count, batch_size):
        chosen = slice(start, start + batch_size)
        smooth = F.interpolate(cells[chosen, None].to(device), size=upsampled, mode="bilinear", align_corners=False)
        ys = (rows[chosen, None] + torch.arange(height)).to(device)  # (B, H)
        xs = (cols[chosen, None] + torch.arange(width)).to(device)  # (B, W)
        index = torch.arange(ys.shape[0], device=device)[:, None, None]
        yield smooth[:, 0][index, ys[:, :, None], xs[:, None, :]]


def window_starts(length: int, window: int, stride: int) -> list[int]:
    """Where the occlusion window starts along one side of ``length`` pixels: 0, stride, ... and, where the stride
    does not end flush, one last start at ``length - window`` (a window longer than the side covers all of it)."""
    last = max(0, length - window)
    starts = list(range(0, last + 1, stride))
    return starts if starts[-1] == last else [*starts, last]


def occlusion_windows(
    options: PerturbationOptions, size: tuple[int, int], batch_size: int, device: torch.device | str = "cpu"
) -> Iterator[torch.Tensor]:
    """The occlusion windows for an input of ``size`` = (H, W), row by row, as (B, H, W) batches of masks that
    are 1 inside the window and 0 elsewhere."""
    height, width = size
    window = options.occlusion_window
    places = [
        (top, left)
        for top in window_starts(height, window, options.occlusion_stride)
        for left in window_starts(width, window, options.occlusion_stride)
    ]
    for start in range(0, len(places), batch_size):
        chosen = places[start : start + batch_size]
        masks = torch.zeros(len(chosen), height, width, device=device)
        for i, (top, left) in enumerate(chosen):
            masks[i, top : top + window, left : left + window] = 1.0
        yield masks


def occlusion_count(options: PerturbationOptions, size: tuple[int, int]) -> int:
    """How many windows :func:`occlusion_windows` yields."""
    window, stride = options.occlusion_window, options.occlusion_stride
    return len(window_starts(size[0], window, stride)) * len(window_starts(size[1], window, stride))


FEWER_PASSES = {
    "rise": "a smaller --rise-masks",
    "drise": "a smaller --rise-masks",
    "occlusion": "a larger --occlusion-stride or --occlusion-window",
}
"""The options that make each black-box method's masked passes fewer."""


def masked_pass_counts(options: PerturbationOptions, size: tuple[int, int]) -> dict[str, int]:
    """The masked forward passes of each black-box method for one image at an input of ``size``: RISE's masks (per
    target), D-RISE's (for every target at once), occlusion's windows and its unmasked pass (per target)."""
    return {"rise": options.rise_masks, "drise": options.rise_masks, "occlusion": occlusion_count(options, size) + 1}


class MaskedPasses:
    """The target's score f(x ⊙ m) for every input x of a batch and every mask m: the passes of RISE and occlusion.

    ``forward`` runs the model without hooks or autograd; ``inputs`` (N, 3, H, W) are the inputs explained;
    ``score(output, samples)`` reads each masked input's score (see the module docstring); ``options`` and ``seed``
    say which masks. Masked inputs run ``batch_size`` at a time; ``progress(done masks, total)`` is called before
    the first pass, after each one, and a last time with ``done == total`` even if a pass fails, as for Score-CAM.
    """

    def __init__(
        self,
        forward: Forward,
        inputs: torch.Tensor,
        score: ScoreReader,
        options: PerturbationOptions | None = None,
        batch_size: int = 32,
        progress: Progress | None = None,
    ) -> None:
        self.forward, self.inputs, self.score = forward, inputs, score
        self.options = check_perturbation(options or PerturbationOptions())
        self.batch_size = max(1, batch_size)
        self.progress = progress

    @property
    def chunk(self) -> int:
        """Masks per step: one forward pass of ``batch_size`` masked inputs for all N inputs, so that ``progress``
        advances with every pass."""
        return max(1, self.batch_size // int(self.inputs.shape[0]))

    @property
    def size(self) -> tuple[int, int]:
        return int(self.inputs.shape[-2]), int(self.inputs.shape[-1])

    def scores(self, masks: torch.Tensor) -> torch.Tensor:
        """(B, H, W) masks -> (N, B) scores f(x_n ⊙ m_b), ``batch_size`` masked inputs per forward pass."""
        n, count = self.inputs.shape[0], masks.shape[0]
        pairs = torch.cartesian_prod(torch.arange(n), torch.arange(count)).view(-1, 2).to(self.inputs.device)
        scores = torch.zeros(n, count, device=self.inputs.device)
        for start in range(0, pairs.shape[0], self.batch_size):
            sample, mask = pairs[start : start + self.batch_size].unbind(dim=1)
            masked = self.inputs[sample] * masks[mask].unsqueeze(1).to(self.inputs.dtype)
            with torch.no_grad():
                scores[sample, mask] = self.score(self.forward(masked), sample).float()
        return scores

    def rise(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """RISE's masks in batches, each with its (N, B) scores."""
        total = self.options.rise_masks
        masks = rise_masks(self.options, self.size, self.chunk, self.inputs.device)
        return self._run(masks, total)

    def occlusion(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The occlusion windows in batches (1 inside), each with the (N, B) scores of the inputs with that window
        set to zero."""
        total = occlusion_count(self.options, self.size)
        windows = occlusion_windows(self.options, self.size, self.chunk, self.inputs.device)
        return ((1 - kept, scores) for kept, scores in self._run((1 - window for window in windows), total))

    def original(self) -> torch.Tensor:
        """(N,) f(x): the unmasked inputs' scores, from a pass like the others."""
        return self.scores(torch.ones(1, *self.size, device=self.inputs.device))[:, 0]

    def _run(self, masks: Iterator[torch.Tensor], total: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        done = 0
        self._report(0, total)
        try:
            for batch in masks:
                scores = self.scores(batch)
                done += batch.shape[0]
                if done < total:
                    self._report(done, total)
                yield batch, scores
        finally:
            self._report(total, total)

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)
