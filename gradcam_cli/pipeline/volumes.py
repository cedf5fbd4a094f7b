"""Explaining scans with a volume model (an nnU-Net folder, a MONAI bundle, a ``monai:NAME`` network): each scan read
as it is stored, a segmenter's maps made over its sliding windows (:func:`~gradcam_cli.cam.windows.explain_volume`),
a classifier's on the whole volume (:func:`~gradcam_cli.cam.whole_volume.explain_classified`), and written back on
the scan's own grid (docs/volumes.md, "From the command line").

A scan (:attr:`~gradcam_cli.io.discovery.InputKind.VOLUME`) is read by :func:`~gradcam_cli.io.volumes.read_volume`
(never resampled: a model trained at another spacing is said once, in a note), its axes put in the order the model
takes them (:meth:`~gradcam_cli.models.volume_spec.VolumeSpec.axes`: an nnU-Net model reads a NIfTI as SimpleITK
does, its axes reversed, then its plans' ``transpose_forward``), normalised as the model's profile says, and
explained window by window: the classes asked for (``--target-class``), else the ``--top-k`` classes the windows
predict most, other than the background. Each map, put back in the scan's axis order, is written per method and class
as NIfTI (float32, the scan's affine and grid), as a PNG montage of the three planes through its peak
(:mod:`gradcam_cli.render.montage`) and, with ``--save-raw``, as ``.npy``; each file atomically. One row per method
and class carries the map's peak in voxels and in RAS millimetres (:class:`~gradcam_cli.cam.records.VolumeInfo`)
and its fingerprint, a (D, H, W) map's (:func:`~gradcam_cli.drift.fingerprint.map_fingerprint`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cam.explainer import Explainer
from ..cam.records import Record, VolumeInfo
from ..cam.results import Prediction
from ..cam.whole_volume import explain_classified
from ..cam.windows import VolumeExplanation, Windows, explain_volume, window_slices
from ..drift.fingerprint import map_fingerprint
from ..errors import GradcamError, UsageError, describe
from ..io.discovery import InputImage, discover_clips
from ..io.naming import MONTAGE_TAIL, NIFTI_SUFFIX, slug, volume_paths
from ..io.volumes import Volume, channel_files, peak, read_region, read_volume, spacing_note, write_nifti
from ..models.volume_spec import VolumeSpec
from ..options import ExplainOptions, ModelOptions, OutputOptions, RunOptions, WindowLevel
from ..render.colour import colormap_table
from ..render.encode import save_array
from ..render.gallery import save_scan_card
from ..render.montage import Window, montage, strips, write_montage
from .resume import EarlierRows, FoundExplanation, OutputIndex, resumed_rows

VOLUME_MODELS = "nnunet:DIR, bundle:DIR or monai:NAME"
Bars = Callable[[str, int], AbstractContextManager[Callable[[], Any]]]
"""``progress(label, total)``: a context whose value is called once per window explained."""
Found = tuple[dict[str, torch.Tensor], list[Prediction], list[Prediction], int]
"""A scan's maps (method: (K, D, H, W) in the model's axis order), the K targets, the predictions, the windows."""


def _no_bars(_label: str, _total: int) -> AbstractContextManager[Callable[[], Any]]:
    return nullcontext(lambda: None)


class _WindowCounter:
    """``explain_volume``'s ``progress(done, total)`` (after each window batch of each pass) as one tick per
    window."""

    def __init__(self, tick: Callable[[], Any]) -> None:
        self.tick, self.done = tick, 0

    def __call__(self, done: int, total: int) -> None:
        if self.done >= total:  # the next pass
            self.done = 0
        for _ in range(done - self.done):
            self.tick()
        self.done = done


def refused_for_volumes(model: ModelOptions, explain: ExplainOptions, output: OutputOptions, run: RunOptions) -> str:
    """The first option given that does not apply to scans (``--panel``, ``--every``...), or ``""``."""
    given = {
        "--save-heatmap": output.save_heatmap,
        "--panel": output.panel,
        "--format": output.image_format is not None,
        "--every": run.every is not None,
        "--clip-stride": run.clip_stride is not None,
        "--engine ray": run.engine == "ray",
        "--input-size": model.input_size is not None,
        "--aug-smooth": explain.aug_smooth,
        "--score": explain.score is not None,
        "--score-threshold": explain.score_threshold is not None,
        "--max-detections": explain.max_detections is not None,
        "--target": bool(explain.targets),
        "--embedding": explain.embedding is not None,
    }
    return next((name for name, value in given.items() if value), "")


def check_scans(
    explainer: Explainer,
    others: Sequence[InputImage],
    scans: Sequence[InputImage],
    output: OutputOptions,
    run: RunOptions,
) -> None:
    """Refuse, in one line, inputs that are not scans beside ``scans`` and the options that do not apply to them (a
    library caller's: the command line refused them before the model loaded, :func:`check_volume_options`)."""
    if others:
        raise UsageError(f"scans are explained alone, by {VOLUME_MODELS}; {others[0].path} is not a scan")
    refused = refused_for_volumes(ModelOptions(), explainer.options, output, run)
    if refused:
        raise UsageError(f"{refused} does not apply to scans ({scans[0].path}); run the scans without it")


def check_volume_options(
    model: ModelOptions,
    explain: ExplainOptions,
    output: OutputOptions,
    run: RunOptions,
    scans: Sequence[InputImage],
    videos: Sequence[InputImage] = (),
) -> None:
    """Before the model loads: refuse, in one line, the options that do not apply to ``scans`` and videos beside
    them."""
    if not scans:
        for option, value in (("--window-level", output.window_level), ("--target region:", explain.region)):
            if value is not None:
                raise UsageError(f"{option} is for scans (.nii, .nii.gz, .npy, DICOM folders); none was given")
        return
    if explain.region is not None:
        channel_files([explain.region], "--target region")  # a scan file, before the model loads
    option = refused_for_volumes(model, explain, output, run)
    if option:
        raise UsageError(f"{option} does not apply to scans ({scans[0].path}); run the scans without it")
    if videos:
        raise UsageError(f"scans and videos are explained by different models; {videos[0].path} is a video")


def volume_inputs(
    explainer: Explainer,
    named: Sequence[str],
    images: Sequence[InputImage],
    videos: Sequence[InputImage],
    scans: Sequence[InputImage],
) -> tuple[list[InputImage], list[InputImage], list[InputImage]]:
    """(images, videos, scans) the loaded model takes: a volume model takes scans (an image or video named is
    refused, those found in folders left out), any other model images and videos (a scan named is refused, those
    found in folders left out, as before scans were inputs)."""
    given = {Path(raw) for raw in named}
    model = explainer.model
    if model.profile.volume is None:
        named_scan = next((scan for scan in scans if scan.path in given), None)
        if named_scan is not None:
            raise UsageError(f"{named_scan.path} is a scan; {model.name} takes images: scans need {VOLUME_MODELS}")
        return list(images), list(videos), []
    named_other = next((item for item in [*images, *videos] if item.path in given), None)
    if named_other is not None:
        raise UsageError(f"{model.name} takes scans; {named_other.path} is not one (.nii, .nii.gz, .npy, DICOM)")
    if scans and not explainer.adapter.scans:
        raise UsageError(
            f"{model.name} is a volume {explainer.adapter.noun}: only segmenters' and classifiers' scans are explained"
        )
    return [], [], list(scans)


def model_inputs(
    explainer: Explainer,
    named: Sequence[str],
    found: tuple[Sequence[InputImage], Sequence[InputImage], Sequence[InputImage]],
    exclude: Path | None = None,
) -> tuple[list[InputImage], list[InputImage], list[InputImage]]:
    """(images, videos, scans) the loaded model takes of the inputs ``named``, ``found`` as
    :func:`~gradcam_cli.io.discovery.discover_inputs` found them before it loaded: :func:`volume_inputs`'s, and a
    video model's folders as folders of frames (:func:`~gradcam_cli.io.discovery.discover_clips`, ``exclude`` left
    out); a usage error when none is left."""
    images, videos, scans = volume_inputs(explainer, named, *found)
    if explainer.model.profile.clips is not None:  # its folders are folders of frames (docs/video.md)
        images, videos = discover_clips(named, exclude=exclude)
    if not (images or videos or scans):
        raise UsageError(f"no images found in {' '.join(named)}")
    return images, videos, scans


def check_channels(explainer: Explainer, channels: Sequence[Path], counted: int) -> None:
    """``--channels``' files hold ``counted`` channels: a usage error naming both counts where the model takes
    another number."""
    spec = explainer.model.profile.volume
    if channels and spec is not None and counted != spec.channels:
        names = f" ({', '.join(spec.channel_names)})" if spec.channel_names else ""
        files = ", ".join(path.name for path in channels)
        raise UsageError(
            f"--channels gives {counted} channel(s) ({files}); {explainer.model.name} takes {spec.channels} channel(s)"
            f"{names}"
        )


def scan_window(spec: VolumeSpec, volume: Volume, given: WindowLevel | None = None) -> Window:
    """The montage's intensity window: ``--window-level``'s, else the range the model clips its first channel to
    (nnU-Net's CT percentiles, a bundle's ``ScaleIntensityRange``), else the scan's 0.5th to 99.5th percentiles."""
    if given is not None:
        return Window(*given.bounds)
    first = spec.intensities[0] if spec.intensities else None
    if first is not None and first.scheme in ("ct", "range") and first.low is not None and first.high is not None:
        return Window(first.low, first.high)
    return Window.of(volume.data[0])


class VolumeRunner:
    """Explain scans one by one: :meth:`run_volumes` yields each scan's rows (its earlier ones with
    ``--skip-existing`` where its maps exist)."""

    def __init__(
        self,
        explainer: Explainer,
        output: OutputOptions,
        run: RunOptions,
        earlier: EarlierRows | None = None,
        notify: Callable[[str], object] | None = None,
    ) -> None:
        spec = explainer.model.profile.volume
        if spec is None:
            raise UsageError(f"{explainer.model.name} takes no scans; they need {VOLUME_MODELS}")
        self.explainer, self.spec, self.output = explainer, spec, output
        self.classifier = explainer.adapter.whole_scans
        self.region = explainer.options.region
        if self.region is not None and self.classifier:
            raise UsageError(f"--target region: is for segmenters; {explainer.model.name} classifies scans")
        patch = spec.patch if spec.patch and not self.classifier else (1, 1, 1)  # a classifier's are not used
        self.windows = Windows(patch, spec.step, batch_size=run.batch_size or 1)
        self.earlier = earlier or EarlierRows()
        self.notify = notify
        self.table = colormap_table(output.colormap)
        self.index = OutputIndex()
        self._noted: set[str] = set()

    def run_volumes(self, scans: Sequence[InputImage], progress: Bars | None = None) -> Iterator[Record]:
        """Every scan's rows, in order; ``progress(label, total)``: a context whose value is called once per window
        explained (``total`` windows: those of each pass over the scan)."""
        for scan in scans:
            rows = self.skipped(scan) if self.output.skip_existing else None
            yield from rows if rows is not None else self.run(scan, progress)

    def run(self, scan: InputImage, progress: Bars | None = None) -> list[Record]:
        """One scan's rows: one per method and class explained, or one error row (a scan that cannot be read or
        that the model does not take; its files, where some were written, removed)."""
        started = time.perf_counter()
        try:
            volume = read_volume(scan.channels or (scan.path,))
            axes = self.spec.axes(scan.path.name.lower().endswith((".nii", ".nii.gz")))
            x = self.spec.normalise(torch.from_numpy(volume.data).permute(0, *(a + 1 for a in axes)))
            region = None if self.region is None else torch.from_numpy(read_region(self.region, volume)).permute(axes)
        except GradcamError as error:
            return [self._record(scan, "error", error=str(error))]
        self._note(volume, axes)
        try:
            explained = self._explain(scan, x.to(self.explainer.device), region, volume.data[0].size, progress)
        except GradcamError:
            raise
        except Exception as error:  # one scan the model cannot take (too small for its pooling) must not end the run
            return [self._record(scan, "error", error=f"{scan.path}: {describe(error)}")]
        del x  # the normalised scan: not held while the maps are written
        back = [axes.index(axis) for axis in range(3)]  # the model's axes back to the scan's
        written: list[Path] = []
        try:
            rows = self._write_all(scan, volume, explained, back, written)
        except OSError as error:
            for path in written:
                path.unlink(missing_ok=True)
            return [self._record(scan, "error", error=f"{scan.path}: {describe(error)}")]
        seconds = round(time.perf_counter() - started, 4)
        for row in rows:
            row.seconds = seconds
        return rows or [self._record(scan, "ok", predictions=explained[2])]

    def _explain(
        self, scan: InputImage, x: torch.Tensor, region: torch.Tensor | None, voxels: int, progress: Bars | None
    ) -> Found:
        """One scan's maps, explained classes, predictions and window count: a classifier's whole volume, a
        segmenter's windows (``progress``: a bar of windows)."""
        chosen = self.explainer.chosen
        classes = [chosen.target] if isinstance(chosen.target, int) else None
        if self.classifier:
            self._note_resize(tuple(x.shape[1:]))
            with (progress or _no_bars)(f"{scan.path.name}: volume", 1) as tick:
                whole = explain_classified(self.explainer, x, self.spec.patch, classes, chosen.top_k)
                tick()
            return whole.maps, whole.targets, whole.predictions[:5], 1
        shape = [max(side, tile) for side, tile in zip(x.shape[1:], self.windows.patch, strict=True)]
        total = len(window_slices(shape, self.windows.patch, self.windows.step)) * (1 if classes else 2)
        with (progress or _no_bars)(f"{scan.path.name}: windows", total) as tick:
            result = explain_volume(
                self.explainer, x, self.windows, classes, chosen.top_k, region, _WindowCounter(tick)
            )
        targets = [self._prediction(c, result, voxels) for c in result.classes]
        return result.maps, targets, self._predictions(result, voxels), result.windows

    def _write_all(
        self, scan: InputImage, volume: Volume, found: Found, back: list[int], written: list[Path]
    ) -> list[Record]:
        maps, targets, predictions, count = found
        window = scan_window(self.spec, volume, self.output.window_level)
        rows = []
        for k, target in enumerate(targets):
            for method in self.explainer.chosen.methods:
                values = maps[method][k].permute(*back).detach().float().cpu()
                outputs = self._write(scan, volume, method, target, values.numpy(), window, written)
                voxel, mm = peak(values.numpy(), volume.affine)
                info = VolumeInfo(volume.grid, volume.spacing, voxel, mm, count, (window.low, window.high))
                fields = {"target": target, "predictions": predictions, "volume": info}
                rows.append(self._record(scan, "ok", method=method, outputs=outputs, **fields))
                rows[-1].fingerprint = map_fingerprint(values)
        return rows

    def _write(
        self,
        scan: InputImage,
        volume: Volume,
        method: str,
        target: Prediction,
        values: np.ndarray[Any, Any],
        window: Window,
        written: list[Path],
    ) -> list[str]:
        """The map's files (NIfTI, montage, ``--save-raw``'s ``.npy``), each written atomically, and with
        ``--report`` the montage's thumbnail, which the gallery shows for the NIfTI, and each plane's strip of slices
        its sliders move through."""
        nifti, montage_path, raw = volume_paths(self.output.output_dir, scan, method, target.index, target.name)
        nifti.parent.mkdir(parents=True, exist_ok=True)
        files = [nifti, montage_path, *([raw] if self.output.save_raw else [])]
        written.extend(files)  # removed if the scan fails
        write_nifti(nifti, values, volume.affine)
        voxel, _ = peak(values, volume.affine)
        image = montage(volume.data[0], values, volume.affine, voxel, self.table, self.output.alpha, window)
        write_montage(montage_path, image)
        if self.output.save_raw:
            save_array(torch.from_numpy(values), raw)
        if self.output.report:
            shown = strips(volume.data[0], values, volume.affine, self.table, self.output.alpha, window)
            save_scan_card(image, shown, nifti, self.output.output_dir, written)
        return [str(path) for path in files]

    def _prediction(self, c: int, result: VolumeExplanation, voxels: int) -> Prediction:
        """Class ``c`` with its share of the scan's ``voxels`` (and their number, as ``voxels``)."""
        share = float(result.shares[c]) if c < len(result.shares) else 0.0
        details = {"voxels": round(share * voxels)}
        return Prediction(c, self.explainer.model.class_name(c), share, share=share, details=details)

    def _predictions(self, result: VolumeExplanation, voxels: int) -> list[Prediction]:
        """The classes the windows predict, most voxels first (the background too), at most five."""
        order = result.shares.argsort(descending=True, stable=True).tolist() if len(result.shares) else []
        return [self._prediction(c, result, voxels) for c in order if result.shares[c] > 0][:5]

    def _note_resize(self, grid: tuple[int, ...]) -> None:
        """Say once that a classifier takes the scan resized to its profile's size (its maps are put back)."""
        size = self.spec.patch
        if self.notify is None or not size or tuple(size) == grid or "resize" in self._noted:
            return
        self._noted.add("resize")
        shown = "x".join(map(str, grid)), "x".join(map(str, size))
        self.notify(f"note: {self.explainer.model.name} takes scans resized from {shown[0]} to {shown[1]} voxels")

    def _note(self, volume: Volume, axes: tuple[int, ...]) -> None:
        """Say once that the model was trained at another spacing (the scan is not resampled)."""
        if self.notify is None or self.spec.spacing is None:
            return
        expected = [0.0] * 3
        for place, axis in enumerate(axes):
            expected[axis] = self.spec.spacing[place]
        note = spacing_note(volume, expected)
        if note is not None and "spacing" not in self._noted:
            self._noted.add("spacing")
            self.notify(f"note: {note}")

    def skipped(self, scan: InputImage) -> list[Record] | None:
        """The rows of a scan whose maps exist (each method's NIfTI maps, with the montage and ``.npy`` beside them
        that exist): its earlier rows, or rows rebuilt from the file names; ``None``: explain it."""
        folder = self.output.output_dir / scan.output_stem.parent
        chosen = self.explainer.chosen
        found: list[FoundExplanation] = []
        for method in chosen.methods:
            prefix = f"{scan.output_stem.name}_{slug(method)}"
            names = self.index.matches(folder, prefix, NIFTI_SUFFIX)
            if isinstance(chosen.target, int):
                wanted = f"{prefix}_{chosen.target}-{slug(self.explainer.model.class_name(chosen.target))}"
                names = [name for name in names if name == wanted + NIFTI_SUFFIX]
            if not names:
                return None
            for name in names:
                tail = name[len(prefix) + 1 : -len(NIFTI_SUFFIX)]
                stem = name[: -len(NIFTI_SUFFIX)]
                beside = [folder / (stem + MONTAGE_TAIL), folder / (stem + ".npy")]
                companions = [str(folder / name)] + [str(path) for path in beside if path.is_file()]
                found.append(FoundExplanation(method, tail, companions))

        def row(**fields: Any) -> Record:
            return self._record(scan, "skipped", **fields)

        earlier = self.earlier.get(str(scan.path))
        return resumed_rows(found, earlier, row, self.explainer.model.class_name, self.earlier.required)

    def _record(self, scan: InputImage, status: str, **fields: Any) -> Record:
        return Record(str(scan.path), status, self.explainer.model.name, self.explainer.layer_label, **fields)
