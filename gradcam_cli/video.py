"""Explaining video clips: read frames with OpenCV, explain every Nth, write an overlay video of the same size and rate.

``gradcam clip.mp4`` writes ``<output_dir>/clip_<method>_top1.mp4`` (``_<index>-<class>`` instead of ``_top1`` with
``--target-class``; ``_top2``... with ``--top-k``). Frames between explained ones (``--every N``) reuse the last map,
blended over their own pixels, so motion stays smooth and the cost drops N-fold. Videos are written with the
``mp4v`` (MPEG-4 Part 2) codec, which OpenCV's bundled FFmpeg always has, to a temporary file that is renamed into
place when the clip is done.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .batch import Record, RunOptions
from .discovery import VIDEO_SUFFIXES, InputImage, slug
from .errors import GradcamError
from .explain import TOP_PREDICTIONS, Explainer, ImageExplanation
from .gallery import save_thumbnail, thumbnail_path
from .images import to_input_tensor
from .render import TEMP_MARKER, blend, colormap_table

FOURCC = "mp4v"
DEFAULT_FPS = 25.0
MAX_BUFFERED_FRAMES = 64
"""Frames held in memory while a batch of explained frames is computed (bounds memory for large --every)."""


def is_video(path: str | Path) -> bool:
    """Whether ``path`` names an existing file with a video suffix (.mp4, .avi, .mov, .mkv, .webm)."""
    path = Path(path)
    return path.suffix.lower() in VIDEO_SUFFIXES and path.is_file()


@dataclass(frozen=True)
class VideoInfo:
    """What the container says: frame rate, frame size, and frame count (0 where it cannot tell)."""

    fps: float
    width: int
    height: int
    frames: int


def probe(path: str | Path) -> VideoInfo:
    """Read a video's frame rate, size and frame count without decoding it; raise GradcamError if unreadable."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise GradcamError(f"{path}: not a video OpenCV can read")
        return _info(capture)
    finally:
        capture.release()


def _info(capture: Any) -> VideoInfo:
    import cv2

    fps = capture.get(cv2.CAP_PROP_FPS)
    frames = capture.get(cv2.CAP_PROP_FRAME_COUNT)
    return VideoInfo(
        fps if fps and math.isfinite(fps) and fps > 0 else DEFAULT_FPS,
        int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)),
        int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
        int(frames) if frames and math.isfinite(frames) and frames > 0 else 0,
    )


def video_output_path(output_dir: Path, video: InputImage, method: str, label: str) -> Path:
    """``<output_dir>/<relative dir>/<stem>_<method>_<label>.mp4``; label is ``top1`` or ``<index>-<class slug>``."""
    stem = video.output_stem
    return output_dir / stem.parent / f"{stem.name}_{slug(method)}_{label}.mp4"


def _frames(capture: Any) -> Iterator[np.ndarray]:
    while True:
        ok, frame = capture.read()
        if not ok:
            return
        yield frame


@dataclass
class _Clip:
    """Running state of one clip: its writers, thumbnails still to write, and prediction sums."""

    writers: list[Any] = field(default_factory=list)
    thumbnails: list[Path] = field(default_factory=list)
    totals: dict[int, float] = field(default_factory=dict)
    frames: int = 0
    explained: int = 0
    held: ImageExplanation | None = None  # the latest key frame's maps, reused until the next key frame


class VideoRunner:
    """Explain the frames of video files and write one overlay video per target rank and method."""

    def __init__(self, explainer: Explainer, options: RunOptions, every: int = 1) -> None:
        if every < 1:
            raise GradcamError("--every must be at least 1")
        self.explainer = explainer
        self.options = options
        self.every = every
        self.table = colormap_table(options.colormap, explainer.device)
        self.model_name = explainer.model.name
        self.layer_label = "+".join(explainer.layer_names)

    def outputs(self, video: InputImage) -> list[tuple[str, Path]]:
        """(method, output path) for each video this input produces, in the order of its explanations."""
        target = self.options.target
        rows = []
        for rank in range(1 if target is not None else self.options.top_k):
            for method in self.explainer.methods:
                if target is not None:
                    label = f"{target}-{slug(self.explainer.model.class_name(target))}"
                else:
                    label = f"top{rank + 1}"
                rows.append((method, video_output_path(self.options.output_dir, video, method, label)))
        return rows

    def run(self, video: InputImage, on_frame: Callable[[], Any] | None = None) -> list[Record]:
        """Explain one clip; ``on_frame`` is called once per frame written (for progress bars).

        Returns one record per output video, or one error record. A clip that fails leaves no output behind.
        """
        started = time.perf_counter()
        outputs = self.outputs(video)
        if video.path.resolve() in {path.resolve() for _, path in outputs}:
            return [self._error(video, f"refusing to overwrite input file {video.path}")]
        if self.options.skip_existing and all(path.is_file() for _, path in outputs):
            return [Record(str(video.path), "skipped", self.model_name, self.layer_label)]
        temporaries = [path.with_name(f".{path.name}{TEMP_MARKER}{os.getpid()}.mp4") for _, path in outputs]
        try:
            clip = self._explain_clip(video, [path for _, path in outputs], temporaries, on_frame)
            if clip.frames == 0:
                raise ValueError("no frames could be decoded")
            for temporary, (_, path) in zip(temporaries, outputs, strict=True):
                os.replace(temporary, path)
        except GradcamError:
            raise
        except Exception as error:  # one unreadable or unexplainable clip must not end the run
            return [self._error(video, f"{video.path}: {type(error).__name__}: {error}")]
        finally:
            for temporary in temporaries:
                temporary.unlink(missing_ok=True)
        seconds = round((time.perf_counter() - started) / clip.frames, 4)
        mean = {index: total / clip.explained for index, total in clip.totals.items()}
        ranked = sorted(mean.items(), key=lambda item: -item[1])[:TOP_PREDICTIONS]
        predictions = [self.explainer.prediction(index, p) for index, p in ranked]
        target = None
        if self.options.target is not None:
            target = self.explainer.prediction(self.options.target, mean.get(self.options.target, 0.0))
        return [
            Record(
                str(video.path),
                "ok",
                self.model_name,
                self.layer_label,
                method,
                target,
                predictions,
                [str(path)],
                seconds=seconds,
            )
            for method, path in outputs
        ]

    def _explain_clip(
        self, video: InputImage, outputs: list[Path], temporaries: list[Path], on_frame: Callable[[], Any] | None
    ) -> _Clip:
        import cv2

        capture = cv2.VideoCapture(str(video.path))
        clip = _Clip()
        if self.options.report:
            clip.thumbnails = [thumbnail_path(self.options.output_dir, path) for path in outputs]
        try:
            if not capture.isOpened():
                raise ValueError("not a video OpenCV can read")
            info = _info(capture)
            # Key frames (every Nth) are explained per_batch at a time, so the frames between them wait in memory
            # until their key's map exists; when that would hold too many frames, each key is explained alone as it
            # arrives and the frames after it stream out with its map (nothing buffered).
            per_batch = max(1, min(self.options.batch_size, MAX_BUFFERED_FRAMES // self.every))
            chunk: list[np.ndarray] = []
            size: tuple[int, int] | None = None  # (width, height) of the output: the first frame's
            for frame in _frames(capture):
                if size is None:
                    size = (frame.shape[1], frame.shape[0])
                    for temporary in temporaries:
                        temporary.parent.mkdir(parents=True, exist_ok=True)
                        writer = cv2.VideoWriter(str(temporary), cv2.VideoWriter_fourcc(*FOURCC), info.fps, size)
                        clip.writers.append(writer)
                        if not writer.isOpened():
                            raise OSError(f"OpenCV cannot write {FOURCC} video to {temporary}")
                elif (frame.shape[1], frame.shape[0]) != size:
                    frame = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
                if per_batch == 1 and clip.frames % self.every != 0:
                    self._write_frame(np.ascontiguousarray(frame[:, :, ::-1]), clip.held, clip, on_frame)
                    continue
                chunk.append(frame)
                if len(chunk) == per_batch * self.every or per_batch == 1:
                    self._flush(chunk, clip, on_frame)
                    chunk = []
            if chunk:
                self._flush(chunk, clip, on_frame)
        finally:
            for writer in clip.writers:
                writer.release()
            capture.release()
        return clip

    def _flush(self, chunk: list[np.ndarray], clip: _Clip, on_frame: Callable[[], Any] | None) -> None:
        """Explain every ``every``-th frame of ``chunk`` (which starts on an explained frame) and write all of it."""
        from PIL import Image

        rgb = [np.ascontiguousarray(frame[:, :, ::-1]) for frame in chunk]
        keys = rgb[:: self.every]
        spec = self.explainer.model.input_spec
        inputs = torch.stack([to_input_tensor(Image.fromarray(frame), spec) for frame in keys])
        height, width = rgb[0].shape[:2]
        results = self.explainer.explain_batch(
            inputs, [(height, width)] * len(keys), self.options.target, self.options.top_k
        )
        for result in results:
            for prediction in result.predictions:
                clip.totals[prediction.index] = clip.totals.get(prediction.index, 0.0) + prediction.probability
        clip.explained += len(keys)
        clip.held = results[-1]
        for offset, frame in enumerate(rgb):
            self._write_frame(frame, results[offset // self.every], clip, on_frame)

    def _write_frame(
        self, frame: np.ndarray, result: ImageExplanation, clip: _Clip, on_frame: Callable[[], Any] | None
    ) -> None:
        """Blend one RGB frame with each of ``result``'s maps and append it to the matching output video."""
        pixels = torch.from_numpy(frame)
        for number, (writer, explanation) in enumerate(zip(clip.writers, result.explanations, strict=True)):
            overlay = blend(pixels, explanation.saliency, self.table, self.options.alpha).cpu()
            if clip.frames == 0 and clip.thumbnails:
                save_thumbnail(overlay, clip.thumbnails[number])
            writer.write(np.ascontiguousarray(overlay.numpy()[:, :, ::-1]))
        clip.frames += 1
        if on_frame:
            on_frame()

    def _error(self, video: InputImage, message: str) -> Record:
        return Record(str(video.path), "error", self.model_name, self.layer_label, error=message)
