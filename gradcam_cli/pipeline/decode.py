"""Decoding images for the batch: a torch ``Dataset`` that never raises, checks made before opening a file, and
:func:`bucketed`, which groups decoded inputs of the same shape into batches in bounded memory."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from ..errors import GradcamError, ImageError, describe
from ..io.discovery import InputImage
from ..io.images import InputSpec, load_sized_image, to_input_tensor, to_pixel_tensor

WAITING_PIXELS = 64_000_000
"""At most about this many image pixels wait in shape buckets, and as many again for the writers."""


@dataclass
class Sample:
    """One decoded image: its network input and pixels (shrunk to ``max_side``), or the one-line ``error``;
    ``original``: the (height, width) of the image at full size, which rows' boxes are measured in."""

    index: int
    tensor: torch.Tensor | None
    pixels: torch.Tensor | None
    error: str | None
    original: tuple[int, int] | None = None


class ImageDataset(Dataset[Sample]):
    def __init__(self, images: Sequence[InputImage], spec: InputSpec, max_side: int | None) -> None:
        self.images = images
        self.spec = spec
        self.max_side = max_side

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Sample:
        path = self.images[index].path
        try:
            image, original = load_sized_image(path, self.max_side)
            return Sample(index, to_input_tensor(image, self.spec), to_pixel_tensor(image), None, original)
        except GradcamError as error:
            return Sample(index, None, None, str(error))
        except Exception as error:  # a worker must never die on one bad file
            return Sample(index, None, None, f"{path}: cannot read it ({describe(error, path)})")


def keep_sample(sample: Any) -> Any:
    """The loader's ``collate_fn`` (``batch_size=None``: one sample at a time): each :class:`Sample` as it is."""
    return sample


def default_workers() -> int:
    """Decoding processes: one per spare core, at most four; none on one or two cores, where a decoding thread
    is faster (handing a decoded image from a process to this one costs about as much CPU as decoding it)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return 0 if cores <= 2 else min(4, cores - 1)


def decode_in_thread(dataset: ImageDataset, ahead: int) -> Iterator[Sample]:
    """Every sample of ``dataset`` in order, decoded by a background thread at most ``ahead`` samples ahead of the
    consumer. The thread runs PyTorch on one core (the model has the others) and stops soon after the consumer
    does, also when it stops early (an error, Ctrl-C); an exception in the thread is raised in the consumer."""
    ready: queue.Queue[Sample | BaseException | None] = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def hand_over(item: Sample | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        torch.set_num_threads(1)  # this thread's own setting; the model's threads are untouched
        try:
            for index in range(len(dataset)):
                if not hand_over(dataset[index]):
                    return
        except BaseException as error:  # ImageDataset never raises; anything else ends the run in the consumer
            hand_over(error)
            return
        hand_over(None)

    thread = threading.Thread(target=produce, name="gradcam-decoder", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def default_batch_size(device: torch.device) -> int:
    """Images per forward pass: 4 on the CPU (measured a little faster than 8 with resnet50 on 2 cores: smaller
    activations stay in cache), 16 on a GPU."""
    return 4 if device.type == "cpu" else 16


def bucketed(
    samples: Iterable[Sample], batch_size: int, max_waiting_pixels: int = WAITING_PIXELS
) -> Iterator[list[Sample]]:
    """Group samples whose inputs have the same shape into batches of at most ``batch_size``.

    Failed samples come out alone at once. At most ``4 * batch_size`` samples, holding at most about
    ``max_waiting_pixels`` image pixels, wait in buckets, so memory does not grow with the number of images:
    past either limit, the fullest bucket is flushed. No sample waits while more than ``4 * batch_size`` others
    arrive after it (a rare shape's bucket is flushed then), so results leave roughly in input order and the
    batch's reorder buffer stays small. What is left comes out at the end.
    """
    buckets: dict[tuple[int, ...], list[Sample]] = {}
    oldest: dict[tuple[int, ...], int] = {}  # arrival number of each bucket's first sample
    waiting = waiting_pixels = 0
    for number, sample in enumerate(samples):
        if sample.tensor is None:
            yield [sample]
            continue
        shape = tuple(sample.tensor.shape)
        bucket = buckets.setdefault(shape, [])
        oldest.setdefault(shape, number)
        bucket.append(sample)
        waiting += 1
        waiting_pixels += _pixel_count(sample)
        while buckets and (
            len(bucket) >= batch_size
            or waiting >= 4 * batch_size
            or waiting_pixels > max_waiting_pixels
            or number - min(oldest.values()) >= 4 * batch_size
        ):
            late = min(oldest, key=oldest.__getitem__)
            fullest = late if number - oldest[late] >= 4 * batch_size else max(buckets, key=lambda s: len(buckets[s]))
            flushed = buckets.pop(fullest)
            del oldest[fullest]
            waiting -= len(flushed)
            waiting_pixels -= sum(_pixel_count(s) for s in flushed)
            yield flushed
            bucket = buckets.get(shape, [])
    yield from (bucket for bucket in buckets.values() if bucket)


def _pixel_count(sample: Sample) -> int:
    return 0 if sample.pixels is None else sample.pixels.shape[0] * sample.pixels.shape[1]


def decoded(samples: Iterator[Sample]) -> Iterator[Sample]:
    """Samples from the loader; a crashed decoding process ends the run with a one-line error, not a traceback."""
    while True:
        try:
            sample = next(samples)
        except StopIteration:
            return
        except RuntimeError as error:  # e.g. "DataLoader worker (pid N) is killed by signal: ..."
            raise ImageError(f"a decoding process failed: {describe(error)}") from error
        yield sample
