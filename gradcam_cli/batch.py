"""Explaining many images: streaming decode, shape-bucketed batches, atomic writes, one record per output."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from .discovery import InputImage, output_path
from .errors import GradcamError
from .explain import Explainer, ImageExplanation, Prediction
from .images import InputSpec, load_image, to_input_tensor, to_pixel_tensor
from .render import blend, colormap_table, save_array, save_image


@dataclass
class RunOptions:
    """What to write and how to batch."""

    output_dir: Path = Path("gradcam_out")
    alpha: float = 0.5
    colormap: str = "jet"
    save_raw: bool = False
    image_format: str = "png"
    target: int | None = None
    top_k: int = 1
    batch_size: int = 8
    workers: int = 0
    skip_existing: bool = False


@dataclass
class Record:
    """One manifest row: an image with one target and method, or an image that failed or was skipped."""

    input: str
    status: str
    model: str
    layer: str
    method: str | None = None
    target: Prediction | None = None
    predictions: list[Prediction] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


@dataclass
class _Sample:
    index: int
    tensor: torch.Tensor | None
    pixels: torch.Tensor | None
    error: str | None


class _ImageDataset(Dataset):
    def __init__(self, images: Sequence[InputImage], spec: InputSpec) -> None:
        self.images = images
        self.spec = spec

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> _Sample:
        try:
            image = load_image(self.images[index].path)
            return _Sample(index, to_input_tensor(image, self.spec), to_pixel_tensor(image), None)
        except GradcamError as error:
            return _Sample(index, None, None, str(error))
        except Exception as error:  # a worker must never die on one bad file
            return _Sample(index, None, None, f"{self.images[index].path}: {type(error).__name__}: {error}")


def _keep_sample(sample: _Sample) -> _Sample:
    return sample


def default_workers() -> int:
    """Decoding processes: one per spare core, at most four (none on a single core)."""
    return max(0, min(4, (os.cpu_count() or 1) - 1))


def bucketed(samples: Iterator[_Sample], batch_size: int) -> Iterator[list[_Sample]]:
    """Group samples whose inputs have the same shape into batches of at most ``batch_size``.

    Failed samples come out alone at once. At most ``4 * batch_size`` samples wait in buckets, so memory does not
    grow with the number of images: past that, the fullest bucket is flushed.
    """
    buckets: dict[tuple[int, ...], list[_Sample]] = {}
    waiting = 0
    for sample in samples:
        if sample.tensor is None:
            yield [sample]
            continue
        bucket = buckets.setdefault(tuple(sample.tensor.shape), [])
        bucket.append(sample)
        waiting += 1
        if len(bucket) >= batch_size or waiting >= 4 * batch_size:
            fullest = max(buckets, key=lambda shape: len(buckets[shape]))
            flushed = buckets.pop(fullest)
            waiting -= len(flushed)
            yield flushed
    yield from (bucket for bucket in buckets.values() if bucket)


def expected_outputs_exist(image: InputImage, options: RunOptions, methods: Sequence[str]) -> bool:
    """Whether a previous run already wrote every output for ``image`` (for ``--skip-existing``)."""
    folder = options.output_dir / image.output_stem.parent
    wanted = 1 if options.target is not None else options.top_k
    suffixes = [f".{options.image_format}"] + ([".npy"] if options.save_raw else [])
    for method in methods:
        for suffix in suffixes:
            pattern = f"{glob_escape(image.output_stem.name)}_{method}_*{suffix}"
            if len(list(folder.glob(pattern))) < wanted:
                return False
    return True


def glob_escape(text: str) -> str:
    """Escape glob metacharacters in a literal file-name part."""
    return "".join(f"[{ch}]" if ch in "*?[]" else ch for ch in text)


class BatchRunner:
    """Run an :class:`Explainer` over many images and write overlays (and raw maps) for each."""

    def __init__(self, explainer: Explainer, options: RunOptions) -> None:
        self.explainer = explainer
        self.options = options
        self.table = colormap_table(options.colormap, explainer.device)
        self.model_name = explainer.model.name
        self.layer_label = "+".join(explainer.layer_names)

    def run(self, images: Sequence[InputImage], on_image: Callable[[], Any] | None = None) -> Iterator[Record]:
        """Yield records as images finish; ``on_image`` is called once per image (for progress bars)."""
        inputs = {image.path.resolve() for image in images}
        todo = []
        for image in images:
            if self.options.skip_existing and expected_outputs_exist(image, self.options, self.explainer.methods):
                yield Record(str(image.path), "skipped", self.model_name, self.layer_label)
                if on_image:
                    on_image()
            else:
                todo.append(image)
        if not todo:
            return
        loader = DataLoader(
            _ImageDataset(todo, self.explainer.model.input_spec),
            batch_size=None,
            num_workers=self.options.workers,
            collate_fn=_keep_sample,
        )
        with ThreadPoolExecutor(max_workers=2) as writer:
            for batch in bucketed(iter(loader), self.options.batch_size):
                started = time.perf_counter()
                records = self._process(batch, todo, inputs, writer)
                seconds = (time.perf_counter() - started) / len(batch)
                for record in records:
                    record.seconds = round(seconds, 4)
                    yield record
                if on_image:
                    for _ in batch:
                        on_image()

    def _process(
        self, batch: list[_Sample], images: Sequence[InputImage], inputs: set[Path], writer: ThreadPoolExecutor
    ) -> list[Record]:
        if batch[0].tensor is None:
            return [self._error(images[batch[0].index], batch[0].error or "unreadable")]
        sizes = [tuple(sample.pixels.shape[:2]) for sample in batch]
        try:
            results = self.explainer.explain_batch(
                torch.stack([sample.tensor for sample in batch]), sizes, self.options.target, self.options.top_k
            )
        except GradcamError:
            raise
        except Exception as error:
            if len(batch) == 1:
                return [self._error(images[batch[0].index], f"{type(error).__name__}: {error}")]
            return [record for sample in batch for record in self._process([sample], images, inputs, writer)]
        records = []
        for sample, result in zip(batch, results, strict=True):
            image = images[sample.index]
            rows = self._write(image, sample.pixels, result, inputs, writer)
            records.extend(rows)
        return records

    def _write(
        self,
        image: InputImage,
        pixels: torch.Tensor,
        result: ImageExplanation,
        inputs: set[Path],
        writer: ThreadPoolExecutor,
    ) -> list[Record]:
        rows = []
        pending: list[Future[None]] = []
        for explanation in result.explanations:
            target = explanation.target
            overlay_path = output_path(
                self.options.output_dir,
                image,
                explanation.method,
                target.index,
                target.name,
                f".{self.options.image_format}",
            )
            paths = [overlay_path]
            if self.options.save_raw:
                paths.append(overlay_path.with_suffix(".npy"))
            clash = next((p for p in paths if p.resolve() in inputs), None)
            if clash is not None:
                rows.append(self._error(image, f"refusing to overwrite input file {clash}"))
                continue
            overlay = blend(pixels, explanation.saliency, self.table, self.options.alpha).cpu()
            pending.append(writer.submit(save_image, overlay, overlay_path))
            if self.options.save_raw:
                pending.append(writer.submit(save_array, explanation.saliency, paths[1]))
            rows.append(
                Record(
                    str(image.path),
                    "ok",
                    self.model_name,
                    self.layer_label,
                    explanation.method,
                    target,
                    result.predictions,
                    [str(p) for p in paths],
                )
            )
        try:
            for future in pending:
                future.result()
        except OSError as error:
            return [self._error(image, f"cannot write output: {error.strerror or error}")]
        return rows

    def _error(self, image: InputImage, message: str) -> Record:
        return Record(str(image.path), "error", self.model_name, self.layer_label, error=message)
