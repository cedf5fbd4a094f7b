"""What the batch writes: :class:`OutputKind` (naming and writing each kind of file), the jobs the writer threads
run, the table-look-up :class:`Blender`, and the index of existing outputs behind ``--skip-existing``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .discovery import InputImage, output_path
from .explain import Explanation, ImageExplanation
from .render import blend, heatmap_image, save_array, save_image

if TYPE_CHECKING:
    from .batch import BatchRunner

BLEND_CHUNK_PIXELS = 1 << 20
"""Overlays of large images are blended this many pixels at a time, so blending needs little memory."""


@dataclass
class WriteJob:
    """What an :class:`OutputKind` writes from: one image, its result, and (per-explanation kinds) one explanation.

    ``overlay`` is blended on first use and shared by the kinds that need it (the overlay file, its thumbnail).
    """

    runner: BatchRunner
    image: InputImage
    pixels: torch.Tensor
    result: ImageExplanation
    explanation: Explanation | None = None
    _overlay: torch.Tensor | None = field(default=None, repr=False)

    @property
    def overlay(self) -> torch.Tensor:
        if self._overlay is None:
            assert self.explanation is not None
            self._overlay = self.runner.blender(self.pixels, self.explanation.saliency)
        return self._overlay


@dataclass(frozen=True)
class OutputKind:
    """One kind of file the batch writes: the extension point for new outputs.

    ``path(runner, image, explanation)`` names the file; per-image kinds (``per_explanation=False``) are called
    with ``explanation=None``. ``write(job, path)`` renders and writes it atomically on a writer thread.
    ``listed`` kinds appear in the records' ``outputs`` (per-image ones in every row of the image) and must all
    exist for ``--skip-existing`` to skip an image; unlisted ones (thumbnails) are extras.
    """

    name: str
    per_explanation: bool
    path: Callable[[BatchRunner, InputImage, Explanation | None], Path]
    write: Callable[[WriteJob, Path], None]
    listed: bool = True


def _overlay_path(runner: BatchRunner, image: InputImage, explanation: Explanation | None) -> Path:
    assert explanation is not None
    target, options = explanation.target, runner.options
    return output_path(
        options.output_dir, image, explanation.method, target.index, target.name, f".{options.image_format}"
    )


def _write_overlay(job: WriteJob, path: Path) -> None:
    save_image(job.overlay, path, job.runner.options.quality)


def _write_raw(job: WriteJob, path: Path) -> None:
    assert job.explanation is not None
    save_array(job.explanation.saliency, path)


def _heatmap_path(runner: BatchRunner, image: InputImage, explanation: Explanation | None) -> Path:
    from .panels import heatmap_path

    assert explanation is not None
    return heatmap_path(runner.options.output_dir, image, explanation, f".{runner.options.image_format}")


def _write_heatmap(job: WriteJob, path: Path) -> None:
    assert job.explanation is not None
    save_image(heatmap_image(job.explanation.saliency, job.runner.table).cpu(), path, job.runner.options.quality)


def _thumbnail_path(runner: BatchRunner, image: InputImage, explanation: Explanation | None) -> Path:
    from .gallery import thumbnail_path

    return thumbnail_path(runner.options.output_dir, _overlay_path(runner, image, explanation))


def _write_thumbnail(job: WriteJob, path: Path) -> None:
    from .gallery import save_thumbnail

    save_thumbnail(job.overlay, path)


def _panel_path(runner: BatchRunner, image: InputImage, _explanation: Explanation | None) -> Path:
    from .panels import panel_path

    return panel_path(runner.options.output_dir, image, f".{runner.options.image_format}")


def _write_panel(job: WriteJob, path: Path) -> None:
    from .panels import save_panel

    o = job.runner.options
    save_panel(path, job.pixels, job.result.explanations, o.colormap, o.alpha, job.image.path.name, o.quality)


OVERLAY = OutputKind("overlay", True, _overlay_path, _write_overlay)
RAW = OutputKind("raw", True, lambda r, i, e: _overlay_path(r, i, e).with_suffix(".npy"), _write_raw)
HEATMAP = OutputKind("heatmap", True, _heatmap_path, _write_heatmap)
THUMBNAIL = OutputKind("thumbnail", True, _thumbnail_path, _write_thumbnail, listed=False)
PANEL = OutputKind("panel", False, _panel_path, _write_panel)


class Blender:
    """:func:`~gradcam_cli.render.blend`, bit for bit, by table look-up: a few times faster, and in small memory.

    ``blend`` is a function of each pixel's value (0-255, per channel) and its colour index (the map value scaled
    to the table), so ``blend`` itself, run once over every (index, value) pair, gives a table from which an
    overlay is two integer operations and a gather per channel. Large images go a band of rows at a time.
    """

    def __init__(self, table: torch.Tensor, alpha: float) -> None:
        self.table, self.alpha = table, alpha
        size = table.shape[0]
        levels = torch.arange(size, dtype=torch.float32).view(size, 1).expand(size, 256) / (size - 1)
        values = torch.arange(256, dtype=torch.uint8).view(1, 256, 1).expand(size, 256, 3).contiguous()
        exact = bool((self._index(levels) == torch.arange(size, dtype=torch.int32).view(size, 1)).all())
        lut = blend(values, levels, table.cpu(), alpha).numpy()  # (colour index, pixel value, channel)
        self.lut = np.ascontiguousarray(lut.transpose(0, 2, 1)).reshape(-1) if exact else None
        self.offsets = np.arange(3, dtype=np.int32) * 256

    def _index(self, saliency: torch.Tensor) -> torch.Tensor:
        """The colour index exactly as :func:`~gradcam_cli.render.colorize` computes it."""
        return (saliency.clamp(0.0, 1.0) * (self.table.shape[0] - 1)).round().to(torch.int32)

    def __call__(self, pixels: torch.Tensor, saliency: torch.Tensor) -> torch.Tensor:
        """The (H, W, 3) uint8 overlay of (H, W, 3) uint8 ``pixels`` and an (H, W) map in [0, 1], on the CPU."""
        height, width = pixels.shape[:2]
        rows = max(1, BLEND_CHUNK_PIXELS // max(1, width))
        out = torch.empty((height, width, 3), dtype=torch.uint8)
        for top in range(0, height, rows):
            out[top : top + rows] = self._blend(pixels[top : top + rows], saliency[top : top + rows])
        return out

    def _blend(self, pixels: torch.Tensor, saliency: torch.Tensor) -> torch.Tensor:
        if self.lut is None or saliency.device.type != "cpu" or pixels.dtype != torch.uint8:
            return blend(pixels, saliency, self.table, self.alpha).cpu()
        index = self._index(saliency.detach()).numpy()
        flat = index[..., None] * (3 * 256) + self.offsets + pixels.numpy()
        return torch.from_numpy(np.take(self.lut, flat))


_TARGET_TAIL = re.compile(r"\d+-[a-z0-9+-]+")


class _OutputIndex:
    """The names in each output folder, listed once: ``--skip-existing`` over N images costs one listing per
    folder, not a directory scan per image.

    Per-explanation outputs are named ``<prefix>_<class index>-<class slug><ending>``; :meth:`matches` finds every
    name with a given prefix and ending, whatever the class.
    """

    def __init__(self) -> None:
        self._names: dict[Path, set[str]] = {}
        self._by_prefix: dict[tuple[Path, str], dict[str, list[str]]] = {}

    def names(self, folder: Path) -> set[str]:
        if folder not in self._names:
            try:
                self._names[folder] = {entry.name for entry in os.scandir(folder) if entry.is_file()}
            except OSError:
                self._names[folder] = set()
        return self._names[folder]

    def matches(self, folder: Path, prefix: str, ending: str) -> list[str]:
        key = (folder, ending)
        if key not in self._by_prefix:
            index: dict[str, list[str]] = {}
            for name in self.names(folder):
                if not name.endswith(ending):
                    continue
                head, _, tail = name[: len(name) - len(ending)].rpartition("_")
                if head and _TARGET_TAIL.fullmatch(tail):
                    index.setdefault(head, []).append(name)
            self._by_prefix[key] = index
        return sorted(self._by_prefix[key].get(prefix, []))
