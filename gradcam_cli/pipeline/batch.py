"""Explaining many images: streaming decode, shape-bucketed batches, background writes, one record per output.

The pipeline, for ``gradcam DIR`` and :class:`BatchRunner`:

1. Images are decoded, each into a network input and its pixels (shrunk by a whole factor to fit within
   ``max_side`` when larger): by a torch ``DataLoader``'s worker processes (``workers``), or with ``workers`` 0 by
   a background thread (on one or two cores, where it is faster).
2. :func:`bucketed` groups inputs of the same resized shape into batches of up to ``batch_size``: images of
   different sizes never share a batch, so batching changes no result. Few samples wait (a bounded number and
   a bounded number of pixels), so memory does not grow with the number of images.
3. The main thread runs the model on each batch (forward, then one backward pass per target); in runs of
   ``FOLD_MIN_IMAGES`` or more, with batch norms folded into the convolutions (:meth:`Explainer.folded`). On a GPU the
   batch is stacked in pinned memory and copied without blocking, and the maps come back the same way
   (:mod:`~gradcam_cli.pipeline.gpu`); a batch that runs out of GPU memory is halved and retried.
4. Writer threads blend, encode and atomically write each image's files while the next batch computes; at most
   a bounded number of images wait for them.
5. Records come out in the order of the input list whatever order the batches finish in: finished images' rows
   (never their pixels) wait in a reorder buffer until every image before them is done.

Every file the batch writes is an :class:`~gradcam_cli.pipeline.outputs.OutputKind`; ``output_kinds`` lists
them, and new kinds plug in there (naming, writing, and --skip-existing all follow from the kind).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..cam.explainer import Explainer
from ..cam.records import Record, in_original_pixels
from ..cam.results import Explanation, ImageExplanation
from ..drift.fingerprint import empty_fingerprint, map_fingerprint
from ..errors import GradcamError, describe
from ..io.discovery import InputImage
from ..options import OutputOptions, RunOptions
from ..render.colour import Blender, colormap_table
from .decode import (
    WAITING_PIXELS,
    ImageDataset,
    Sample,
    bucketed,
    decode_in_thread,
    decoded,
    default_batch_size,
    default_workers,
    keep_sample,
)
from .detection_resume import CombinedOutputs, resumed_detection_rows
from .gpu import is_out_of_memory, release_cached_memory, results_to_host, stack_inputs
from .ordering import InOrder, deferred_interrupt
from .outputs import OutputKind, WriteJob, output_kinds
from .resume import EarlierRows, ExistingOutputs, FoundExplanation, resumed_rows

FOLD_MIN_IMAGES = 32
"""Runs of at least this many images fold batch norms into convolutions (:meth:`Explainer.folded`): folding a
ResNet-50 takes about 0.15 s, and saves a few milliseconds per image."""


@dataclass
class _Pending:
    """An image handed to the writers (or failed before that): its rows, once ``future`` is done. ``index``: its
    place in the list being run."""

    index: int
    image: InputImage
    rows: list[Record]
    future: Future[tuple[float, str | None]] | None = None
    pixels: int = 0
    seconds: float = 0.0


class BatchRunner:
    """Run an :class:`Explainer` over many images and write overlays (and the other outputs) for each.

    ``output`` says what to write and where; ``run`` how to batch, decode and write (its ``None`` batch size and
    worker count become the defaults for the explainer's device and this machine). ``earlier``: the manifest rows
    of earlier runs, which images skipped by ``--skip-existing`` get back. ``notify`` receives the one line said
    when the GPU runs out of memory and batches are halved.
    """

    def __init__(
        self,
        explainer: Explainer,
        output: OutputOptions | None = None,
        run: RunOptions | None = None,
        earlier: EarlierRows | None = None,
        notify: Callable[[str], object] | None = None,
    ) -> None:
        self.explainer = explainer
        self.notify = notify
        self.earlier = earlier or EarlierRows()
        self.output = output or OutputOptions()
        self.run_options = run = run or RunOptions()
        self.batch_size = run.batch_size or default_batch_size(explainer.device)
        self.workers = default_workers() if run.workers is None else run.workers
        self.writers = run.writers
        self.max_side = run.max_side or None
        self.blender = Blender(colormap_table(self.output.colormap), self.output.alpha)  # maps reach it on the CPU
        self.kinds = output_kinds(self.output)
        self._channels_last = explainer.device.type == "cpu"
        self._halved = False  # the batches were halved after running out of memory (said once)

    def run(
        self,
        images: Sequence[InputImage],
        on_image: Callable[[], Any] | None = None,
        on_skipped: Callable[[], Any] | None = None,
    ) -> Iterator[Record]:
        """Yield every image's records in the order of ``images`` (skipped ones in their place, with their earlier
        rows); ``on_image`` is called once per image as it finishes (progress), or ``on_skipped`` instead where
        given, for an image skipped because its outputs exist. After an error or Ctrl-C, the rows of every image
        that finished still come out (in order, around the gaps) before the exception."""
        inputs = {os.path.realpath(image.path) for image in images}
        existing = self.existing_outputs()
        in_order = InOrder()
        todo: list[InputImage] = []
        places: list[int] = []
        for place, image in enumerate(images):
            found = existing.find(image) if self.output.skip_existing else None
            rows = self.skipped(image, found) if found is not None else None
            if rows is None:
                todo.append(image)
                places.append(place)
                continue
            in_order.add(place, rows)
            if tick := on_skipped or on_image:
                tick()
        try:
            yield from in_order.ready()
            if todo:
                with deferred_interrupt() as interrupted:
                    for index, rows in self.explain_images(todo, inputs, on_image, interrupted):
                        in_order.add(places[index], rows)
                        yield from in_order.ready()
        except GeneratorExit:
            raise
        except BaseException:
            yield from in_order.rest()
            raise
        yield from in_order.rest()

    def skipped(self, image: InputImage, found: Sequence[FoundExplanation]) -> list[Record] | None:
        """The rows of an image whose outputs exist: its earlier rows, or rows rebuilt from the files found; ``None``
        where the manifest being resumed lacks some of its rows (:attr:`EarlierRows.required`): explain it again."""

        def row(**fields: Any) -> Record:
            return self._record(image, "skipped", **fields)

        earlier, required = self.earlier.get(str(image.path)), self.earlier.required
        if self.explainer.adapter.combined_tail is not None:  # a detector's: by its combined maps
            rows = resumed_detection_rows(found, earlier, row, required)
        else:
            rows = resumed_rows(found, earlier, row, self.explainer.model.class_name, required)
        return rows if rows is None else rows or [row()]

    def explain_images(
        self,
        todo: list[InputImage],
        inputs: set[str],
        on_image: Callable[[], Any] | None,
        interrupted: Callable[[], bool],
    ) -> Iterator[tuple[int, list[Record]]]:
        """(index in ``todo``, rows) of each image as it finishes: decoded by a ``DataLoader``, then
        :meth:`explain_samples`. ``inputs``: the real paths no output may overwrite. The Ray engine replaces this."""
        dataset = ImageDataset(todo, self.explainer.model.input_spec, self.max_side)
        workers = min(self.workers, len(todo))
        if len(todo) == 1:  # nothing to overlap with: decode it here
            samples: Iterator[Sample] = iter([dataset[0]])
        elif workers == 0:
            samples = decode_in_thread(dataset, 2 * self.batch_size)
        else:
            loader = DataLoader(
                dataset,
                batch_size=None,
                num_workers=workers,
                collate_fn=keep_sample,
                prefetch_factor=max(2, math.ceil(self.batch_size / workers)),
            )
            samples = decoded(iter(loader))  # worker processes start here, before any writer thread exists
        with self.explainer.folded() if len(todo) >= FOLD_MIN_IMAGES else nullcontext(self.explainer) as explainer:
            yield from self.explain_samples(samples, todo, inputs, on_image, interrupted, explainer)

    def explain_samples(
        self,
        samples: Iterator[Sample],
        images: Sequence[InputImage],
        inputs: set[str],
        on_image: Callable[[], Any] | None = None,
        interrupted: Callable[[], bool] = lambda: False,
        explainer: Explainer | None = None,
    ) -> Iterator[tuple[int, list[Record]]]:
        """(index in ``images``, rows) of each decoded sample (``sample.index`` indexes ``images``) once its files
        are written: shape buckets, the model (``explainer``, else the runner's own), the writer threads."""
        limit_images = self.batch_size + 2 * self.writers
        pending: deque[_Pending] = deque()
        with ThreadPoolExecutor(max_workers=self.writers, thread_name_prefix="gradcam-writer") as pool:
            try:
                for batch in bucketed(samples, self.batch_size):
                    if interrupted():
                        break
                    for item in self._process(batch, images, inputs, pool, explainer or self.explainer):
                        pending.append(item)
                        # Hand back finished images; wait for the oldest while too many images or pixels are queued.
                        while pending and (
                            _done(pending[0])
                            or len(pending) > limit_images
                            or sum(p.pixels for p in pending) > WAITING_PIXELS
                        ):
                            yield self._finish(pending.popleft(), on_image)
            except KeyboardInterrupt:  # a second Ctrl-C: stop now, but record what the writers finish anyway
                while pending:
                    yield self._finish(pending.popleft(), on_image)
                raise
            while pending:  # also after a first Ctrl-C: what the writers have in hand is finished and recorded
                yield self._finish(pending.popleft(), on_image)
        if interrupted():
            raise KeyboardInterrupt

    def existing_outputs(self) -> ExistingOutputs:
        """What ``--skip-existing`` looks for: this run's listed outputs, for its methods and targets."""
        explainer = self.explainer
        target = explainer.prediction(explainer.chosen.target, 0.0) if explainer.chosen.target is not None else None
        kind = ExistingOutputs if explainer.adapter.combined_tail is None else CombinedOutputs
        return kind(self.output, self.kinds, explainer.chosen.methods, target, explainer.chosen.top_k)

    def _finish(self, item: _Pending, on_image: Callable[[], Any] | None) -> tuple[int, list[Record]]:
        rows, seconds = item.rows, item.seconds
        if item.future is not None:
            write_seconds, error = item.future.result()
            seconds += write_seconds
            if error is not None:
                rows = [self._error(item.image, error)]
        for row in rows:
            row.seconds = round(seconds, 4)
        item.rows = []
        if on_image:
            on_image()
        return item.index, rows

    def _process(
        self, batch: list[Sample], images: Sequence[InputImage], inputs: set[str], pool: Executor, by: Explainer
    ) -> list[_Pending]:
        ready = [(s.index, s.tensor, s.pixels) for s in batch if s.tensor is not None and s.pixels is not None]
        originals = {s.index: s.original for s in batch}
        if not ready:  # a sample that failed to decode comes alone
            index, image = batch[0].index, images[batch[0].index]
            return [_Pending(index, image, [self._error(image, batch[0].error or f"{image.path}: unreadable")])]
        if len(batch) > self.batch_size:  # smaller batches since the GPU ran out of memory
            parts = [batch[i : i + self.batch_size] for i in range(0, len(batch), self.batch_size)]
            return [item for part in parts for item in self._process(part, images, inputs, pool, by)]
        started = time.perf_counter()
        sizes = [(int(pixels.shape[0]), int(pixels.shape[1])) for _, _, pixels in ready]
        try:
            device = self.explainer.device
            results = self._explain(by, stack_inputs([tensor for _, tensor, _ in ready], device), sizes)
            results_to_host(results)
        except GradcamError:
            raise
        except Exception as error:
            if is_out_of_memory(error) and len(batch) > 1:
                self._halve_batches(len(batch))
                return self._process(batch, images, inputs, pool, by)
            if len(batch) == 1:
                index = batch[0].index
                image = images[index]
                message = f"{image.path}: the model failed on this image ({describe(error, image.path)})"
                return [_Pending(index, image, [self._error(image, message)])]
            return [item for sample in batch for item in self._process([sample], images, inputs, pool, by)]
        seconds = (time.perf_counter() - started) / len(batch)
        items = []
        for (index, _, pixels), result in zip(ready, results, strict=True):
            item = self._submit(index, images[index], pixels, result, inputs, pool, originals[index])
            item.seconds = seconds
            items.append(item)
        return items

    def _halve_batches(self, size: int) -> None:
        """After running out of memory on a batch of ``size``: half as many images per batch from now on (said once)."""
        release_cached_memory()
        halved = max(1, size // 2)
        if self.notify is not None and not self._halved:
            self.notify(f"warning: out of memory with {size} images per batch; going on with {halved} per batch")
        self._halved = True
        self.batch_size = min(self.batch_size, halved)

    def _explain(self, by: Explainer, inputs: torch.Tensor, sizes: list[tuple[int, int]]) -> list[ImageExplanation]:
        """``by`` on one batch. On the CPU the batch goes in channels-last: oneDNN's convolutions run about
        a fifth faster so, and the maps differ from a contiguous input's by about 1e-6. A model that cannot take
        such an input (one that calls ``.view`` on it) gets contiguous batches from then on."""
        if self._channels_last and inputs.dim() == 4:
            try:
                return by.explain_batch(inputs.contiguous(memory_format=torch.channels_last), sizes)
            except GradcamError:
                raise
            except Exception as error:
                if is_out_of_memory(error):
                    raise
                self._channels_last = False
        return by.explain_batch(inputs, sizes)

    def _submit(
        self,
        index: int,
        image: InputImage,
        pixels: torch.Tensor,
        result: ImageExplanation,
        inputs: set[str],
        pool: Executor,
        original: tuple[int, int] | None = None,
    ) -> _Pending:
        """Name this image's files and rows (measured in the ``original`` image's pixels: docs/batch.md, Large
        images), and hand the writing to a writer thread."""
        files: list[tuple[OutputKind, Path, Explanation | None]] = []
        rows = []
        combined: dict[str, tuple[list[str], Explanation]] = {}
        for explanation in result.explanations:
            named = [(kind, kind.path(self.output, image, explanation)) for kind in self.kinds if kind.per_explanation]
            files.extend((kind, path, explanation) for kind, path in named)
            listed = [str(path) for kind, path in named if kind.listed]
            if explanation.rank == 0:  # a detector's combined map: listed in its method's rows
                combined[explanation.method] = listed, explanation
                continue
            rows.append(
                self._record(
                    image,
                    "ok",
                    method=explanation.method,
                    target=explanation.target,
                    predictions=result.predictions,
                    outputs=listed,
                    fingerprint=map_fingerprint(explanation.saliency),
                )
            )
        for method, (listed, explanation) in combined.items():
            own = [row for row in rows if row.method == method]
            for row in own:
                row.outputs += listed
            if not own:  # no detection above the threshold: a row without a target says so, with the (empty) map
                fingerprint = map_fingerprint(explanation.saliency)
                rows.append(self._record(image, "ok", method=method, outputs=list(listed), fingerprint=fingerprint))
        if not rows:  # a segmenter that sees nothing but the background: the same, with an empty map's fingerprint
            empty = empty_fingerprint(int(pixels.shape[0]), int(pixels.shape[1]))
            rows = [
                self._record(image, "ok", method=m, predictions=result.predictions, fingerprint=empty)
                for m in self.explainer.chosen.methods
            ]
        for kind in self.kinds:
            if not kind.per_explanation:
                path = kind.path(self.output, image, None)
                files.append((kind, path, None))
                for row in rows if kind.listed else []:
                    row.outputs.append(str(path))
        rows = in_original_pixels(rows, (int(pixels.shape[0]), int(pixels.shape[1])), original)
        clash = next((path for _, path, _ in files if os.path.realpath(path) in inputs), None)
        if clash is not None:
            message = f"{image.path}: refusing to overwrite input file {clash}"
            return _Pending(index, image, [self._error(image, message)])
        future = pool.submit(self._write_files, image, pixels, result, files)
        return _Pending(index, image, rows, future, pixels=pixels.shape[0] * pixels.shape[1])

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
                job = jobs[id(explanation)] = WriteJob(self.output, self.blender, image, pixels, result, explanation)
            try:
                kind.write(job, path)
            except Exception as error:
                return time.perf_counter() - started, f"{image.path}: cannot write {path}: {describe(error, path)}"
        return time.perf_counter() - started, None

    def _record(self, image: InputImage, status: str, **fields: Any) -> Record:
        return Record(str(image.path), status, self.explainer.model.name, self.explainer.layer_label, **fields)

    def _error(self, image: InputImage, message: str) -> Record:
        return self._record(image, "error", error=message)


def _done(item: _Pending) -> bool:
    return item.future is None or item.future.done()
