"""What the batch writes: each kind of file as an :class:`OutputKind` (its name and how to write it), and the
:class:`WriteJob` a writer thread renders them from.

Kinds receive what they need and nothing more: names come from the :class:`OutputOptions` and the image (and,
per explanation, its method and target); writing gets a :class:`WriteJob` with the pixels, the maps and the
rendering settings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cam.results import Explanation, ImageExplanation
from ..io.discovery import InputImage
from ..io.naming import detection_path, heatmap_path, output_path, panel_path, thumbnail_path
from ..options import OutputOptions
from ..render.colour import Blender, heatmap_image
from ..render.encode import save_array, save_image
from ..render.overlay import mark


@dataclass
class WriteJob:
    """What an :class:`OutputKind` writes from: one image, its result, and (per-explanation kinds) one explanation.

    ``overlay`` is blended on first use, marked (a detection's box, a segmenter's region outline:
    :func:`~gradcam_cli.render.overlay.mark`) and shared by the kinds that need it (the overlay file, its thumbnail).
    """

    options: OutputOptions
    blender: Blender
    image: InputImage
    pixels: torch.Tensor
    result: ImageExplanation
    explanation: Explanation | None = None
    _overlay: torch.Tensor | None = field(default=None, repr=False)

    @property
    def overlay(self) -> torch.Tensor:
        if self._overlay is None:
            overlay = self.blender(self.pixels, self.saliency)
            self._overlay = mark(self.result, overlay, self.explanation) if self.explanation is not None else overlay
        return self._overlay

    @property
    def saliency(self) -> torch.Tensor:
        """The map of this job's explanation (per-explanation kinds only)."""
        if self.explanation is None:
            raise ValueError("a per-image output has no single map")
        return self.explanation.saliency


@dataclass(frozen=True)
class OutputKind:
    """One kind of file the batch writes: the extension point for new outputs.

    ``path(options, image, explanation)`` names the file; per-image kinds (``per_explanation=False``) are called
    with ``explanation=None``. ``write(job, path)`` renders and writes it atomically on a writer thread.
    ``listed`` kinds appear in the records' ``outputs`` (per-image ones in every row of the image) and must all
    exist for ``--skip-existing`` to skip an image; unlisted ones (thumbnails) are extras.
    """

    name: str
    per_explanation: bool
    path: Callable[[OutputOptions, InputImage, Explanation | None], Path]
    write: Callable[[WriteJob, Path], None]
    listed: bool = True


def _explained(explanation: Explanation | None) -> Explanation:
    if explanation is None:
        raise ValueError("a per-explanation output needs an explanation")
    return explanation


def _named(options: OutputOptions, image: InputImage, explanation: Explanation | None, prefix: str = "") -> Path:
    """An explanation's file, named by class (or, a detection, by rank and class); ``prefix`` before the method."""
    e = _explained(explanation)
    method, suffix = f"{prefix}{e.method}", options.chosen_format.suffix_for(image.path)
    if e.rank is not None:
        return detection_path(options.output_dir, image, method, e.rank, e.target.index, e.target.name, suffix)
    return output_path(options.output_dir, image, method, e.target.index, e.target.name, suffix)


def _overlay_path(options: OutputOptions, image: InputImage, explanation: Explanation | None) -> Path:
    return _named(options, image, explanation)


def _raw_path(options: OutputOptions, image: InputImage, explanation: Explanation | None) -> Path:
    return _overlay_path(options, image, explanation).with_suffix(".npy")


def _heatmap_path(options: OutputOptions, image: InputImage, explanation: Explanation | None) -> Path:
    e = _explained(explanation)
    if e.rank is not None:
        return _named(options, image, explanation, "heatmap-")
    suffix = options.chosen_format.suffix_for(image.path)
    return heatmap_path(options.output_dir, image, e.method, e.target.index, e.target.name, suffix)


def _thumbnail_path(options: OutputOptions, image: InputImage, explanation: Explanation | None) -> Path:
    return thumbnail_path(options.output_dir, _overlay_path(options, image, explanation))


def _panel_path(options: OutputOptions, image: InputImage, _explanation: Explanation | None) -> Path:
    return panel_path(options.output_dir, image, options.chosen_format.suffix_for(image.path))


def _write_overlay(job: WriteJob, path: Path) -> None:
    save_image(job.overlay, path, job.options.quality)


def _write_raw(job: WriteJob, path: Path) -> None:
    save_array(job.saliency, path)


def _write_heatmap(job: WriteJob, path: Path) -> None:
    save_image(heatmap_image(job.saliency, job.blender.table).cpu(), path, job.options.quality)


def _write_thumbnail(job: WriteJob, path: Path) -> None:
    from ..render.gallery import save_thumbnail

    save_thumbnail(job.overlay, path)


def _write_panel(job: WriteJob, path: Path) -> None:
    from ..render.panels import save_panel

    o = job.options
    save_panel(path, job.pixels, job.result.explanations, o.colormap, o.alpha, job.image.path.name, o.quality)


OVERLAY = OutputKind("overlay", True, _overlay_path, _write_overlay)
RAW = OutputKind("raw", True, _raw_path, _write_raw)
HEATMAP = OutputKind("heatmap", True, _heatmap_path, _write_heatmap)
THUMBNAIL = OutputKind("thumbnail", True, _thumbnail_path, _write_thumbnail, listed=False)
PANEL = OutputKind("panel", False, _panel_path, _write_panel)


def output_kinds(options: OutputOptions) -> list[OutputKind]:
    """The files written for each image, in the order they are listed in a record's ``outputs``."""
    kinds = [OVERLAY]
    kinds += [RAW] if options.save_raw else []
    kinds += [HEATMAP] if options.save_heatmap else []
    kinds += [THUMBNAIL] if options.report else []
    kinds += [PANEL] if options.panel else []
    return kinds
