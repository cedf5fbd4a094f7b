"""Explaining video clips: read frames with OpenCV, explain every Nth, write an overlay video of the same size and rate.

``gradcam clip.mp4`` writes ``<output_dir>/clip_<method>_top1.mp4`` (``_<index>-<class>`` instead of ``_top1`` with
``--target-class``; ``_top2``... with ``--top-k``; a detector's: ``clip_<method>_boxes.mp4``, the combined map of
each frame's detections with their boxes drawn). Frames between explained ones (``--every N``) reuse the last map,
blended over their own pixels, so motion stays smooth and the cost drops N-fold. Videos are written with the
``mp4v`` (MPEG-4 Part 2) codec, which OpenCV's bundled FFmpeg always has, to a temporary file that is renamed into
place when the clip is done. ``--save-raw``, ``--save-heatmap`` and ``--panel`` are for images: a run with videos
refuses them (:func:`check_video_options`); ``--report`` shows a clip by its first overlay frame and plays a
small WebM preview of it (:func:`~gradcam_cli.render.gallery.save_video_card`). This is how a
model that takes images explains a video; one that takes clips is explained clip by clip
(:mod:`gradcam_cli.pipeline.clips`; :func:`video_runner` picks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cam.explainer import Explainer
from ..cam.records import Record
from ..cam.results import TOP_PREDICTIONS, ImageExplanation
from ..errors import GradcamError, ImageError, UsageError, describe
from ..io.atomic import TEMP_MARKER
from ..io.discovery import InputImage
from ..io.images import to_input_tensor
from ..io.naming import video_output_path
from ..io.video import (
    FOURCC,
    NO_FRAMES,
    UNREADABLE,
    capture_info,
    frames,
    opencv_name,
    opened_by_name,
)
from ..options import OutputOptions, RunOptions
from ..render.colour import blend, colormap_table
from ..render.gallery import save_video_card
from ..render.overlay import mark
from .clips import ClipRunner
from .decode import default_batch_size

MAX_BUFFERED_FRAMES = 64
"""Frames held in memory while a batch of explained frames is computed (bounds memory for large --every)."""
IMAGE_ONLY_OPTIONS = {"save_raw": "--save-raw", "save_heatmap": "--save-heatmap", "panel": "--panel"}
"""The OutputOptions fields (and their command-line names) that write files only an image has."""


def check_video_options(output: OutputOptions, videos: Sequence[InputImage], clips: bool = False) -> None:
    """Refuse, with a UsageError, the image-only outputs (``--save-raw``, ``--save-heatmap``, ``--panel``) when the
    inputs include videos, naming every such option given and the videos; ``clips``: the model takes clips (or may:
    the command checks before loading it), whose maps ``--save-raw`` saves (docs/video.md)."""
    allowed = {"save_raw"} if clips else set()
    given = [flag for name, flag in IMAGE_ONLY_OPTIONS.items() if getattr(output, name) and name not in allowed]
    if not videos or not given:
        return
    options = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
    verb, pronoun = ("does", "it") if len(given) == 1 else ("do", "them")
    names = ", ".join(str(video.path) for video in videos[:3])
    if len(videos) > 3:
        names += f" and {len(videos) - 3} more"
    raise UsageError(f"{options} {verb} not apply to video inputs ({names}); run the videos without {pronoun}")


def takes_clips(model: str) -> bool:
    """Whether the ``--model`` named may take clips, as far as its name tells before it loads (torchvision's video
    models, and a Hugging Face folder or hub id, which may hold a video classifier): the command refuses
    ``--save-raw`` with videos before loading any other model, and after loading one of these that takes images."""
    from ..models.hub import HF_PREFIX
    from ..models.tasks import torchvision_video_names

    return model.startswith(HF_PREFIX) or model in torchvision_video_names()


def check_video_model(
    explainer: Explainer,
    output: OutputOptions,
    run: RunOptions,
    videos: Sequence[InputImage],
    images: Sequence[InputImage] = (),
) -> None:
    """Refuse what the model does not take: videos unless its task explains them (classifiers, detectors), videos
    with ``--engine ray``, images when it takes clips; ``--fps`` without a folder of frames read as a video; with
    videos, ``--save-raw`` and
    ``--clip-stride`` with a model that takes images (explained frame by frame), ``--every`` with one that takes
    clips."""
    clips = explainer.model.profile.clips is not None
    name = explainer.model.name
    if videos and not explainer.adapter.videos:
        raise UsageError(
            f"videos are explained with classifiers and detectors only; {videos[0].path} is a video and "
            f"{name} a {explainer.adapter.noun}"
        )
    if videos and run.engine == "ray":
        raise UsageError(f"--engine ray explains images only; {videos[0].path} is a video: run videos without it")
    if clips and images:
        raise UsageError(f"{name} takes clips: give it videos; {images[0].path} is an image")
    if run.fps is not None and not any(video.frames for video in videos):
        raise UsageError(
            "--fps is the frame rate of a folder of frames given to a video model; none is among the inputs"
        )
    if not videos:
        return
    check_video_options(output, videos, clips)
    if run.clip_stride is not None and not clips:
        raise UsageError(f"--clip-stride is for video models; {name} takes images, explained frame by frame (--every)")
    if run.every is not None and clips:
        raise UsageError(f"--every is for image models; {name} takes clips: space them with --clip-stride")


def video_runner(explainer: Explainer, output: OutputOptions, run: RunOptions) -> VideoRunner | ClipRunner:
    """The runner of videos for ``explainer``'s model: clip by clip for a model that takes clips
    (:class:`~gradcam_cli.pipeline.clips.ClipRunner`), else frame by frame (:class:`VideoRunner`)."""
    clip = explainer.model.profile.clips
    if clip is None:
        return VideoRunner(explainer, output, run)
    return ClipRunner(explainer, clip, output, run)


@dataclass
class _Clip:
    """Running state of one clip: its writers, its first overlay frames (for the gallery's thumbnails, written only
    once the clip is done), and prediction sums."""

    writers: list[Any] = field(default_factory=list)
    first_overlays: list[torch.Tensor] = field(default_factory=list)
    totals: dict[int, float] = field(default_factory=dict)
    frames: int = 0
    explained: int = 0
    held: ImageExplanation | None = None  # the latest key frame's maps, reused until the next key frame


class VideoRunner:
    """Explain the frames of video files and write one overlay video per target rank and method."""

    def __init__(
        self, explainer: Explainer, output: OutputOptions | None = None, run: RunOptions | None = None
    ) -> None:
        run = run or RunOptions()
        if run.every is not None and run.every < 1:
            raise GradcamError("--every must be at least 1")
        self.explainer = explainer
        self.output = output or OutputOptions()
        self.every = run.every or 1
        self.batch_size = run.batch_size or default_batch_size(explainer.device)
        self.table = colormap_table(self.output.colormap, explainer.device)

    def outputs(self, video: InputImage) -> list[tuple[str, Path]]:
        """(method, output path) for each video this input produces, in the order of its explanations."""
        explainer = self.explainer
        chosen = explainer.chosen
        labels = explainer.adapter.video_labels(chosen.target, chosen.top_k, explainer.model.class_name)
        return [
            (method, video_output_path(self.output.output_dir, video, method, label))
            for label in labels
            for method in chosen.methods
        ]

    def run(self, video: InputImage, on_frame: Callable[[], Any] | None = None) -> list[Record]:
        """Explain one clip; ``on_frame`` is called once per frame written (for progress bars).

        Returns one record per output video, or one error record. A clip that fails leaves no output behind.
        """
        started = time.perf_counter()
        outputs = self.outputs(video)
        if video.path.resolve() in {path.resolve() for _, path in outputs}:
            return [self._error(video, f"{video.path}: refusing to overwrite input file {video.path}")]
        if self.output.skip_existing and all(path.is_file() for _, path in outputs):
            return [self._record(video, "skipped")]
        pid = os.getpid()  # the temporary names are UTF-8, which OpenCV needs, whatever the output's name
        temporaries = [path.with_name(opencv_name(f".{path.name}{TEMP_MARKER}{pid}.mp4")) for _, path in outputs]
        written: list[Path] = []  # the files put in place so far, removed unless the clip is done
        done = False
        try:
            clip = self._explain_clip(video, [path for _, path in outputs], temporaries, on_frame)
            if clip.frames == 0:
                raise ImageError(f"{video.path}: {NO_FRAMES}")
            for temporary, (_, path) in zip(temporaries, outputs, strict=True):
                written.append(path)
                os.replace(temporary, path)
            if self.output.report:
                for overlay, (_, path) in zip(clip.first_overlays, outputs, strict=True):
                    save_video_card(overlay, path, self.output.output_dir, written)
            done = True
        except ImageError as error:
            return [self._error(video, str(error))]
        except GradcamError:
            raise
        except Exception as error:  # one unexplainable clip (a failing writer, a full disk) must not end the run
            return [self._error(video, f"{video.path}: {describe(error, video.path)}")]
        finally:
            for temporary in temporaries if done else [*temporaries, *written]:
                temporary.unlink(missing_ok=True)
        seconds = round(time.perf_counter() - started, 4)  # each row: the whole clip (reading, model, writing)
        mean = {index: total / clip.explained for index, total in clip.totals.items()}
        ranked = sorted(mean.items(), key=lambda item: -item[1])[:TOP_PREDICTIONS]
        predictions = [self.explainer.prediction(index, p) for index, p in ranked]
        target = None
        if self.explainer.chosen.target is not None:
            target = self.explainer.prediction(
                self.explainer.chosen.target, mean.get(self.explainer.chosen.target, 0.0)
            )
        return [
            self._record(
                video, "ok", method=method, target=target, predictions=predictions, outputs=[str(path)], seconds=seconds
            )
            for method, path in outputs
        ]

    def _explain_clip(
        self, video: InputImage, outputs: list[Path], temporaries: list[Path], on_frame: Callable[[], Any] | None
    ) -> _Clip:
        import cv2

        with opened_by_name(video.path) as name:
            capture = cv2.VideoCapture(name)
        clip = _Clip()
        try:
            if not capture.isOpened():
                raise ImageError(f"{video.path}: {UNREADABLE}")
            info = capture_info(capture)
            # Key frames (every Nth) are explained per_batch at a time, so the frames between them wait in memory
            # until their key's map exists; when that would hold too many frames, each key is explained alone as it
            # arrives and the frames after it stream out with its map (nothing buffered).
            per_batch = max(1, min(self.batch_size, MAX_BUFFERED_FRAMES // self.every))
            chunk: list[np.ndarray] = []
            size: tuple[int, int] | None = None  # (width, height) of the output: the first frame's
            for frame in frames(capture):
                if size is None:
                    size = (frame.shape[1], frame.shape[0])
                    for temporary in temporaries:
                        temporary.parent.mkdir(parents=True, exist_ok=True)
                        writer = cv2.VideoWriter(str(temporary), cv2.VideoWriter.fourcc(*FOURCC), info.fps, size)
                        clip.writers.append(writer)
                        if not writer.isOpened():
                            raise OSError(f"OpenCV cannot write {FOURCC} video to {temporary}")
                elif (frame.shape[1], frame.shape[0]) != size:
                    frame = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
                if per_batch == 1 and clip.held is not None and clip.frames % self.every != 0:
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
        results = self.explainer.explain_batch(inputs, [(height, width)] * len(keys))
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
        adapter = self.explainer.adapter
        for writer, (explanation, marked) in zip(clip.writers, adapter.frame_maps(result), strict=True):
            overlay = blend(pixels, explanation.saliency, self.table, self.output.alpha).cpu()
            if marked:
                overlay = mark(result, overlay, explanation)
            if clip.frames == 0 and self.output.report:
                clip.first_overlays.append(overlay)
            writer.write(np.ascontiguousarray(overlay.numpy()[:, :, ::-1]))
        clip.frames += 1
        if on_frame:
            on_frame()

    def _record(self, video: InputImage, status: str, **fields: Any) -> Record:
        return Record(str(video.path), status, self.explainer.model.name, self.explainer.layer_label, **fields)

    def _error(self, video: InputImage, message: str) -> Record:
        return self._record(video, "error", error=message)
