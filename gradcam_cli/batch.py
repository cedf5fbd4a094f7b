"""Explaining many images: streaming decode, shape-bucketed batches, background writes, one record per output.

The pipeline, for ``gradcam DIR`` and :class:`BatchRunner`:

1. A torch ``DataLoader`` decodes images in worker processes (``workers``), each into a network input and its
   pixels (shrunk by a whole factor to fit within ``max_side`` when larger).
2. :func:`bucketed` groups inputs of the same resized shape into batches of up to ``batch_size``: images of
   different sizes never share a batch, so batching changes no result. Few samples wait (a bounded number and
   a bounded number of pixels), so memory does not grow with the number of images.
3. The main thread runs the model on each batch (forward, then one backward pass per target).
4. Writer threads blend, encode and atomically write each image's files while the next batch computes; at most
   a bounded number of images wait for them.

Every file the batch writes is an :class:`OutputKind`; :meth:`BatchRunner.output_kinds` lists them, and new
kinds plug in there (naming, writing, and --skip-existing all follow from the kind).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from .discovery import InputImage
from .errors import GradcamError
from .explain import Explainer, Explanation, ImageExplanation, Prediction
from .loading import WAITING_PIXELS, _decoded, _ImageDataset, _keep_sample, _Sample, bucketed
from .outputs import HEATMAP, OVERLAY, PANEL, RAW, THUMBNAIL, Blender, OutputKind, WriteJob, _OutputIndex
from .render import colormap_table

DEFAULT_MAX_SIDE = 4096
"""Images whose longer side is larger are shrunk by a whole factor to fit first (``--max-side``; 0: never)."""

_PROBE_TARGET = Prediction(0, "x", 0.0)
_PROBE_MARK = "_0-x"


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
    quality: int = 90  # JPEG/WebP quality of overlays, heatmaps and panels
    save_heatmap: bool = False  # also write the colour-mapped map alone
    panel: bool = False  # also write one matplotlib panel per image (see panels.py)
    report: bool = False  # also write gallery thumbnails (index.html itself is written from the records at the end)
    max_side: int | None = DEFAULT_MAX_SIDE  # downscale larger images to this longer side first (None/0: never)
    writers: int = 2  # threads that blend, encode and write outputs while the model runs

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)


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
class _Pending:
    """An image handed to the writers (or failed before that): its rows, once ``future`` is done."""

    image: InputImage
    rows: list[Record]
    future: Future[tuple[float, str | None]] | None = None
    pixels: int = 0
    seconds: float = 0.0


class BatchRunner:
    """Run an :class:`Explainer` over many images and write overlays (and the other outputs) for each."""

    def __init__(self, explainer: Explainer, options: RunOptions) -> None:
        self.explainer = explainer
        self.options = options
        self.table = colormap_table(options.colormap, explainer.device)
        self.blender = Blender(self.table, options.alpha)
        self.model_name = explainer.model.name
        self.layer_label = "+".join(explainer.layer_names)
        self.kinds = self.output_kinds()
        self._channels_last = explainer.device.type == "cpu"

    def output_kinds(self) -> list[OutputKind]:
        """The files written for each image, in the order they are listed in a record's ``outputs``."""
        o = self.options
        kinds = [OVERLAY]
        kinds += [RAW] if o.save_raw else []
        kinds += [HEATMAP] if o.save_heatmap else []
        kinds += [THUMBNAIL] if o.report else []
        kinds += [PANEL] if o.panel else []
        return kinds

    def run(self, images: Sequence[InputImage], on_image: Callable[[], Any] | None = None) -> Iterator[Record]:
        """Yield records as images finish, in a stable order; ``on_image`` is called once per image (progress)."""
        inputs = {os.path.realpath(image.path) for image in images}
        todo = []
        index = _OutputIndex()
        for image in images:
            found = self.existing_outputs(image, index) if self.options.skip_existing else None
            if found is not None:
                yield Record(str(image.path), "skipped", self.model_name, self.layer_label, outputs=found)
                if on_image:
                    on_image()
            else:
                todo.append(image)
        if not todo:
            return
        with _deferred_interrupt() as interrupted:
            yield from self._run(todo, inputs, on_image, interrupted)

    def _run(
        self,
        todo: list[InputImage],
        inputs: set[str],
        on_image: Callable[[], Any] | None,
        interrupted: Callable[[], bool],
    ) -> Iterator[Record]:
        workers = min(self.options.workers, len(todo))
        loader = DataLoader(
            _ImageDataset(todo, self.explainer.model.input_spec, self.options.max_side or None),
            batch_size=None,
            num_workers=workers,
            collate_fn=_keep_sample,
            prefetch_factor=max(2, math.ceil(self.options.batch_size / workers)) if workers else None,
        )
        samples = iter(loader)  # worker processes start here, before any writer thread exists
        limit_images = self.options.batch_size + 2 * self.options.writers
        pending: deque[_Pending] = deque()
        with ThreadPoolExecutor(max_workers=self.options.writers, thread_name_prefix="gradcam-writer") as pool:
            try:
                for batch in bucketed(_decoded(samples), self.options.batch_size):
                    if interrupted():
                        break
                    for item in self._process(batch, todo, inputs, pool):
                        pending.append(item)
                        # Hand back finished images; wait for the oldest while too many images or pixels are queued.
                        while pending and (
                            _done(pending[0])
                            or len(pending) > limit_images
                            or sum(p.pixels for p in pending) > WAITING_PIXELS
                        ):
                            yield from self._finish(pending.popleft(), on_image)
            except KeyboardInterrupt:  # a second Ctrl-C: stop now, but record what the writers finish anyway
                while pending:
                    yield from self._finish(pending.popleft(), on_image)
                raise
            while pending:  # also after a first Ctrl-C: what the writers have in hand is finished and recorded
                yield from self._finish(pending.popleft(), on_image)
        if interrupted():
            raise KeyboardInterrupt

    def existing_outputs(self, image: InputImage, index: _OutputIndex | None = None) -> list[str] | None:
        """The outputs a previous run wrote for ``image`` if all of them exist, else ``None`` (--skip-existing).

        Without ``--target-class``, each method's listed per-explanation kinds must exist for ``top_k`` classes
        (whichever they were); per-image kinds must exist as named.
        """
        index = index or _OutputIndex()
        o = self.options
        found: list[str] = []
        folder: Path | None = None
        for method in self.explainer.methods:
            for kind in self.kinds:
                if not kind.listed or not kind.per_explanation:
                    continue
                if o.target is not None:
                    target = self.explainer.prediction(o.target, 0.0)
                    path = kind.path(self, image, Explanation(method, target, torch.empty(0)))
                    if path.name not in index.names(path.parent):
                        return None
                    found.append(str(path))
                    continue
                probe = kind.path(self, image, Explanation(method, _PROBE_TARGET, torch.empty(0)))
                cut = probe.name.rfind(_PROBE_MARK)
                if cut < 0:
                    continue  # a kind not named by class: cannot be matched without knowing the class
                folder = probe.parent
                names = index.matches(folder, probe.name[:cut], probe.name[cut + len(_PROBE_MARK) :])
                if len(names) < o.top_k:
                    return None
                found.extend(str(folder / name) for name in names)
        for kind in self.kinds:
            if kind.listed and not kind.per_explanation:
                path = kind.path(self, image, None)
                if path.name not in index.names(path.parent):
                    return None
                found.append(str(path))
        return found

    def _finish(self, item: _Pending, on_image: Callable[[], Any] | None) -> Iterator[Record]:
        rows = item.rows
        seconds = item.seconds
        if item.future is not None:
            write_seconds, error = item.future.result()
            seconds += write_seconds
            if error is not None:
                rows = [self._error(item.image, error)]
        for row in rows:
            row.seconds = round(seconds, 4)
        item.rows = []
        yield from rows
        if on_image:
            on_image()

    def _process(
        self, batch: list[_Sample], images: Sequence[InputImage], inputs: set[str], pool: ThreadPoolExecutor
    ) -> list[_Pending]:
        if batch[0].tensor is None:
            image = images[batch[0].index]
            return [_Pending(image, [self._error(image, batch[0].error or f"{image.path}: unreadable")])]
        started = time.perf_counter()
        sizes = [tuple(sample.pixels.shape[:2]) for sample in batch]
        try:
            results = self._explain(torch.stack([sample.tensor for sample in batch]), sizes)
        except GradcamError:
            raise
        except Exception as error:
            if len(batch) == 1:
                image = images[batch[0].index]
                return [_Pending(image, [self._error(image, f"{image.path}: {type(error).__name__}: {error}")])]
            return [item for sample in batch for item in self._process([sample], images, inputs, pool)]
        seconds = (time.perf_counter() - started) / len(batch)
        items = []
        for sample, result in zip(batch, results, strict=True):
            item = self._submit(images[sample.index], sample.pixels, result, inputs, pool)
            item.seconds = seconds
            items.append(item)
        return items

    def _explain(self, inputs: torch.Tensor, sizes: list[tuple[int, ...]]) -> list[ImageExplanation]:
        """The explainer on one batch. On the CPU the batch goes in channels-last: oneDNN's convolutions run about
        a fifth faster so, and the maps differ from a contiguous input's by about 1e-6. A model that cannot take
        such an input (one that calls ``.view`` on it) gets contiguous batches from then on."""
        o = self.options
        if self._channels_last and inputs.dim() == 4:
            try:
                return self.explainer.explain_batch(
                    inputs.contiguous(memory_format=torch.channels_last), sizes, o.target, o.top_k
                )
            except GradcamError:
                raise
            except Exception:
                self._channels_last = False
        return self.explainer.explain_batch(inputs, sizes, o.target, o.top_k)

    def _submit(
        self,
        image: InputImage,
        pixels: torch.Tensor,
        result: ImageExplanation,
        inputs: set[str],
        pool: ThreadPoolExecutor,
    ) -> _Pending:
        """Name this image's files and rows, and hand the writing to a writer thread."""
        files: list[tuple[OutputKind, Path, Explanation | None]] = []
        rows = []
        for explanation in result.explanations:
            named = [(kind, kind.path(self, image, explanation)) for kind in self.kinds if kind.per_explanation]
            files.extend((kind, path, explanation) for kind, path in named)
            rows.append(
                Record(
                    str(image.path),
                    "ok",
                    self.model_name,
                    self.layer_label,
                    explanation.method,
                    explanation.target,
                    result.predictions,
                    [str(path) for kind, path in named if kind.listed],
                )
            )
        for kind in self.kinds:
            if not kind.per_explanation:
                path = kind.path(self, image, None)
                files.append((kind, path, None))
                for row in rows if kind.listed else []:
                    row.outputs.append(str(path))
        clash = next((path for _, path, _ in files if os.path.realpath(path) in inputs), None)
        if clash is not None:
            return _Pending(image, [self._error(image, f"{image.path}: refusing to overwrite input file {clash}")])
        future = pool.submit(self._write_files, image, pixels, result, files)
        return _Pending(image, rows, future, pixels=pixels.shape[0] * pixels.shape[1])

    def _write_files(
        self,
        image: InputImage,
        pixels: torch.Tensor,
        result: ImageExplanation,
        files: list[tuple[OutputKind, Path, Explanation | None]],
    ) -> tuple[float, str | None]:
        """Runs on a writer thread: every file of one image. Returns (seconds, error message or None)."""
        started = time.perf_counter()
        jobs: dict[int, WriteJob] = {}
        for kind, path, explanation in files:
            job = jobs.get(id(explanation))
            if job is None:
                job = jobs[id(explanation)] = WriteJob(self, image, pixels, result, explanation)
            try:
                kind.write(job, path)
            except OSError as error:
                return time.perf_counter() - started, f"{image.path}: cannot write {path}: {error.strerror or error}"
            except Exception as error:
                reason = f"{type(error).__name__}: {error}"
                return time.perf_counter() - started, f"{image.path}: cannot write {path}: {reason}"
        return time.perf_counter() - started, None

    def _error(self, image: InputImage, message: str) -> Record:
        return Record(str(image.path), "error", self.model_name, self.layer_label, error=message)


@contextmanager
def _deferred_interrupt() -> Iterator[Callable[[], bool]]:
    """While a batch runs, the first Ctrl-C only asks to stop: the batch in hand is finished, written and recorded,
    then :class:`KeyboardInterrupt` is raised. A second Ctrl-C interrupts at once. Only in the main thread, and only
    where Ctrl-C has Python's default meaning (a notebook's own handler is left alone)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: False
        return
    asked: list[bool] = []

    def on_interrupt(_signum: int, _frame: object) -> None:
        asked.append(True)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: bool(asked)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _done(item: _Pending) -> bool:
    return item.future is None or item.future.done()
