"""Explaining a video with a video model, clip by clip: T x H x W maps over time and space (docs/video.md).

A model that takes clips (its profile's :attr:`~gradcam_cli.models.profile.ModelProfile.clips`: torchvision's
``r3d_18``, ``s3d``, ``mvit_v2_s``, ``swin3d_t``..., a bare 3-D CNN) reads a video as clips of its own ``frames``
frames sampled at its own ``rate``: one clip covers ``span`` = frames x (video fps / rate) video frames, of which it
takes the frame at the centre of each of ``frames`` equal parts (:func:`~gradcam_cli.models.clip_spec.sample_offsets`),
each resized (its shorter side to the model's size, nothing cropped) and normalised as the model's weights say.
Clips start every ``--clip-stride`` video frames (default: ``span``, side by side); one more clip, ending on the last
frame, covers the end of a video that the others leave uncovered (a video shorter than a clip repeats its last
frame). Frames are decoded (the sampled ones prepared) in a thread (:func:`~gradcam_cli.io.video.read_ahead`), overlays
blended and encoded in another during the next clip (:class:`~gradcam_cli.io.video.WriteBehind`). A folder of frames is
a video too (:class:`~gradcam_cli.io.video.FrameFolder`: its images in natural order, at ``--fps``).

Each clip is one prediction and one map per target and method, (span, h, w) at the network input's pixels (the
layer's T' x H' x W' map resized trilinearly: linearly in time over the clip's video frames). Every video frame's
overlay shows the mean of the maps of the clips covering it (overlapping clips blend), resized to the video's own
size; a frame no clip covers (a stride longer than a clip) keeps the map before it. The outputs: the overlay video per
target rank and method (as :class:`~gradcam_cli.pipeline.video.VideoRunner`'s, at the video's size and rate), its
temporal importance plot (:func:`~gradcam_cli.render.curves.draw_curve`, drawn while the writing thread encodes the
last frames), with ``--save-raw`` each clip's map as ``.npy``, and one row per clip, target and method with the clip's
predictions, its ``clip`` (frames, shares of the map, score) and its map's fingerprint.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..cam.explainer import Explainer
from ..cam.records import Answer, ClipInfo, Record
from ..cam.results import Explanation, Prediction
from ..drift.fingerprint import map_fingerprint
from ..errors import GradcamError, ImageError, describe
from ..io.atomic import TEMP_MARKER, write_atomic
from ..io.discovery import InputImage
from ..io.frames import network_frame, network_input, opened_video, rgb_frame
from ..io.naming import clip_curve_path, clip_raw_path, video_output_path
from ..io.video import FOURCC, NO_FRAMES, WriteBehind, opencv_name, read_ahead
from ..models.clip_spec import ClipSpec, sample_offsets
from ..options import OutputOptions, RunOptions
from ..render.colour import Blender, colormap_table
from ..render.curves import draw_curve, preload
from ..render.encode import save_array
from ..render.gallery import save_video_card


@dataclass
class _Frame:
    """A decoded frame waiting for its clips: its RGB pixels, its network input (None: not yet prepared), and per
    output video the sum of the maps of the clips that covered it so far (at the network input's size), their count."""

    index: int
    rgb: np.ndarray
    tensor: torch.Tensor | None
    sums: list[torch.Tensor | None]
    count: int = 0


@dataclass
class ClipDone:
    """One explained clip: its predictions and, per output video, its target, its :class:`ClipInfo`, its map's
    fingerprint and its raw map's path (with ``--save-raw``)."""

    predictions: list[Prediction]
    maps: list[tuple[Prediction, ClipInfo, dict[str, Any], Path | None]]
    answer: Answer | None = None
    """A vision-language model's answer about the clip
    (:class:`~gradcam_cli.pipeline.answer_clips.AnswerClipRunner`), and the method of each map."""
    methods: list[str] = field(default_factory=list)


@dataclass
class VideoState:
    """Running state of one video."""

    fps: float
    span: int
    outputs: list[Path]
    temporaries: list[Path] = field(default_factory=list)  # where each overlay video is written until it is done
    writers: list[Any] = field(default_factory=list)
    waiting: deque[_Frame] = field(default_factory=deque)
    clips: list[ClipDone] = field(default_factory=list)
    held: list[torch.Tensor | None] = field(default_factory=list)
    first_overlays: list[torch.Tensor] = field(default_factory=list)
    raws: list[Path] = field(default_factory=list)
    curves: list[bytes] = field(default_factory=list)  # each overlay video's plot (PNG), drawn as its end is written
    seen: int = 0  # frames decoded
    written: int = 0  # frames written
    covered: int = 0  # frames covered by the clips explained so far (their ends)
    size: tuple[int, int] | None = None  # (width, height) of the video's frames: the first frame's


class ClipRunner:
    """Explain videos with a model that takes clips; the same calls as :class:`~gradcam_cli.pipeline.video.VideoRunner`
    (:meth:`outputs`, :meth:`run`)."""

    def __init__(
        self, explainer: Explainer, clip: ClipSpec, output: OutputOptions | None = None, run: RunOptions | None = None
    ) -> None:
        run = run or RunOptions()
        if run.clip_stride is not None and run.clip_stride < 1:
            raise GradcamError("--clip-stride must be at least 1")
        if run.fps is not None and not run.fps > 0:
            raise GradcamError("--fps must be above 0")
        self.explainer = explainer
        self.clip = clip
        self.output = output or OutputOptions()
        self.stride = run.clip_stride
        self.fps = run.fps
        self.batch_size = run.batch_size or 1
        self.blender = Blender(colormap_table(self.output.colormap), self.output.alpha)  # maps reach it on the CPU

    def outputs(self, video: InputImage) -> list[tuple[str, Path]]:
        """(method, overlay video path) for each overlay video this input produces, in the order of its maps."""
        chosen = self.explainer.chosen
        labels = self.explainer.adapter.video_labels(chosen.target, chosen.top_k, self.explainer.model.class_name)
        return [
            (method, video_output_path(self.output.output_dir, video, method, label))
            for label in labels
            for method in chosen.methods
        ]

    def run(self, video: InputImage, on_frame: Callable[[], Any] | None = None) -> list[Record]:
        """Explain one video; ``on_frame`` is called once per frame written. Returns one record per clip, target and
        method, or one error record (a video that fails leaves no output behind)."""
        started = time.perf_counter()
        outputs = self.outputs(video)
        paths = [path for _, path in outputs]
        if video.path.resolve() in {path.resolve() for path in paths}:
            return [self._error(video, f"{video.path}: refusing to overwrite input file {video.path}")]
        expected = [*paths, *map(clip_curve_path, paths)]
        if self.output.skip_existing and all(path.is_file() for path in expected):
            return [self._record(video, "skipped")]
        pid = os.getpid()  # the temporary names are UTF-8, which OpenCV needs, whatever the output's name
        temporaries = [path.with_name(opencv_name(f".{path.name}{TEMP_MARKER}{pid}.mp4")) for path in paths]
        raws: list[Path] = []  # the raw maps (and gallery files) written so far, removed unless the video is done
        done = False
        try:
            state = self._explain_video(video, VideoState(0.0, 0, paths, temporaries, raws=raws), on_frame)
            if state.written == 0:
                raise ImageError(f"{video.path}: {NO_FRAMES}")
            self._finish(state, outputs, temporaries)
            done = True
        except ImageError as error:
            return [self._error(video, str(error))]
        except GradcamError:
            raise
        except Exception as error:  # one unexplainable video (a failing writer, a full disk) must not end the run
            return [self._error(video, f"{video.path}: {describe(error, video.path)}")]
        finally:
            for path in temporaries if done else [*temporaries, *raws]:
                path.unlink(missing_ok=True)
        return self._rows(video, state, outputs, round(time.perf_counter() - started, 4))

    def _finish(self, state: VideoState, outputs: Sequence[tuple[str, Path]], temporaries: Sequence[Path]) -> None:
        """Put the overlay videos in place, write their temporal importance plots and the gallery's files of each
        (:func:`~gradcam_cli.render.gallery.save_video_card`, added to ``state.raws``: removed if the video fails)."""
        for temporary, (_, path) in zip(temporaries, outputs, strict=True):
            os.replace(temporary, path)
        for curve, (_, path) in zip(state.curves, outputs, strict=True):
            write_atomic(clip_curve_path(path), curve)
        if self.output.report:
            for overlay, (_, path) in zip(state.first_overlays, outputs, strict=True):
                save_video_card(overlay, path, self.output.output_dir, state.raws)

    # --- reading and scheduling -------------------------------------------------------------------------------------

    def _explain_video(self, video: InputImage, state: VideoState, on_frame: Callable[[], Any] | None) -> VideoState:
        """Read, explain and write ``video`` into ``state`` (its outputs, temporaries and raw maps so far), its plots
        drawn (``state.curves``)."""
        with opened_video(video.path, self.fps) as (capture, fps):
            state.fps, state.span, state.held = fps, self._span(fps), [None] * len(state.outputs)
            try:
                with (
                    closing(read_ahead(capture, self._preparer(state))) as decoded,  # its thread ends before release
                    WriteBehind(self._write_frame(state), first=_start_writing) as writing,  # so does this one
                ):
                    self._stream(state, decoded, writing, on_frame)
                    if state.clips:  # the plots drawn while the writing thread encodes the last frames
                        state.curves = [
                            draw_curve([d.maps[place][1] for d in state.clips], state.fps, f"{path.stem}: {method}")
                            for place, (method, path) in enumerate(self._labels(video, state))
                        ]
            finally:
                for writer in state.writers:
                    writer.release()
        return state

    def _labels(self, video: InputImage, state: VideoState) -> list[tuple[str, Path]]:
        """(method, overlay video path) of each of ``video``'s maps, once its clips are explained."""
        return self.outputs(video)

    def _span(self, fps: float) -> int:
        """The video frames one clip covers, for a video of ``fps`` frames per second."""
        return self.clip.span(fps)

    def _stream(
        self,
        state: VideoState,
        decoded: Iterator[tuple[np.ndarray, torch.Tensor | None]],
        writing: WriteBehind[tuple[np.ndarray, list[torch.Tensor]]],
        on_frame: Callable[[], Any] | None,
    ) -> None:
        """Explain each clip as soon as its frames are in (a batch of them at a time), and write each frame once no
        clip to come covers it."""
        stride = self.stride or state.span
        pending: list[int] = []  # clip starts waiting for a batch
        next_start = 0
        for rgb, tensor in decoded:
            state.waiting.append(_Frame(state.seen, rgb, tensor, [None] * len(state.outputs)))
            state.seen += 1
            while next_start + state.span <= state.seen:
                pending.append(next_start)
                next_start += stride
            if len(pending) >= self.batch_size:
                self._explain_clips(state, pending)
                pending = []
            self._release(state, min(pending[0] if pending else next_start, state.seen - state.span), writing, on_frame)
        if pending:
            self._explain_clips(state, pending)
        if state.seen and state.covered < state.seen:  # the end, which no clip covered: one clip ending on it
            self._explain_clips(state, [max(0, state.seen - state.span)])
        self._release(state, state.seen, writing, on_frame)

    def _preparer(self, state: VideoState) -> Callable[[np.ndarray], tuple[np.ndarray, torch.Tensor | None]]:
        """What the decoding thread does to each BGR frame: its RGB pixels (at the first frame's size) and, if a
        clip every stride frames samples it, its network input (the clip that ends on the last frame prepares the
        others it samples itself, :meth:`_input`)."""
        spec = self.explainer.model.input_spec
        stride, offsets = self.stride or state.span, sample_offsets(self.clip.frames, state.span)
        index = -1

        def prepare(frame: np.ndarray) -> tuple[np.ndarray, torch.Tensor | None]:
            nonlocal index
            index += 1
            if state.size is None:
                state.size = (frame.shape[1], frame.shape[0])
            if any(index >= offset and (index - offset) % stride == 0 for offset in offsets):
                return network_frame(frame, state.size, spec)
            return rgb_frame(frame, state.size), None

        return prepare

    def _input(self, frame: _Frame) -> torch.Tensor:
        """``frame``'s network input, prepared now if the decoding thread did not."""
        if frame.tensor is None:
            frame.tensor = network_input(frame.rgb, self.explainer.model.input_spec)
        return frame.tensor

    def _open_writers(self, state: VideoState) -> None:
        """Open each overlay video's writer at its temporary path (before the first frame is written: the outputs
        are known once the first clip is explained)."""
        import cv2

        assert state.size is not None
        for temporary in state.temporaries:
            temporary.parent.mkdir(parents=True, exist_ok=True)
            writer = cv2.VideoWriter(str(temporary), cv2.VideoWriter.fourcc(*FOURCC), state.fps, state.size)
            state.writers.append(writer)
            if not writer.isOpened():
                raise OSError(f"OpenCV cannot write {FOURCC} video to {temporary}")

    # --- explaining ---------------------------------------------------------------------------------------------------

    def _explain_clips(self, state: VideoState, starts: Sequence[int]) -> None:
        """Explain the clips starting at ``starts`` in one batch; add their maps to the frames they cover."""
        by_index = {frame.index: frame for frame in state.waiting}
        last = state.seen - 1
        offsets = sample_offsets(self.clip.frames, state.span)
        batch = torch.stack(
            [torch.stack([self._input(by_index[min(start + o, last)]) for o in offsets], dim=1) for start in starts]
        )
        height, width = batch.shape[-2:]
        results = self.explainer.explain_batch(batch, [(state.span, height, width)] * len(starts))
        adapter = self.explainer.adapter
        for start, result in zip(starts, results, strict=True):
            end = min(start + state.span, state.seen)
            pairs = enumerate(adapter.frame_maps(result))
            maps = [self._clip_map(state, start, end, place, explanation) for place, (explanation, _) in pairs]
            for frame in state.waiting:
                frame.count += start <= frame.index < end
            state.clips.append(ClipDone(result.predictions, maps))
            state.covered = max(state.covered, end)

    def _clip_map(
        self, state: VideoState, start: int, end: int, output: int, explanation: Explanation
    ) -> tuple[Prediction, ClipInfo, dict[str, Any], Path | None]:
        """The ``output``-th map of the clip of video frames ``start`` to ``end``: added to its frames; its shares,
        fingerprint and raw file."""
        number = len(state.clips)
        saliency = explanation.saliency[: end - start].detach().float().cpu()
        for frame in state.waiting:
            if start <= frame.index < end:
                current = frame.sums[output]
                part = saliency[frame.index - start]
                frame.sums[output] = part.clone() if current is None else current + part
        totals = saliency.flatten(1).sum(dim=1).double()
        whole = float(totals.sum())
        shares = (totals / whole).tolist() if whole > 0 else [0.0] * len(totals)
        seconds = (start / state.fps, end / state.fps)
        info = ClipInfo(number, start, end, seconds, shares, explanation.target.probability)
        raw = None
        if self.output.save_raw:
            raw = clip_raw_path(state.outputs[output], number)
            save_array(saliency, raw)
            state.raws.append(raw)
        return explanation.target, info, map_fingerprint(saliency), raw

    # --- writing ------------------------------------------------------------------------------------------------------

    def _release(
        self,
        state: VideoState,
        until: int,
        writing: WriteBehind[tuple[np.ndarray, list[torch.Tensor]]],
        on_frame: Callable[[], Any] | None,
    ) -> None:
        """Hand every waiting frame before ``until`` (no clip to come covers it) to ``writing`` with its maps."""
        while state.waiting and state.waiting[0].index < until:
            if state.written == 0 and not state.writers:
                self._open_writers(state)
            frame = state.waiting.popleft()
            coarse = []
            for output in range(len(state.writers)):
                summed = frame.sums[output]
                held = summed / frame.count if summed is not None else state.held[output]
                state.held[output] = held
                # no clip yet: cannot happen (the first clip starts at the first frame)
                coarse.append(held if held is not None else torch.zeros(1, 1))
            writing.put((frame.rgb, coarse))
            state.written += 1
            if on_frame:
                on_frame()

    def _write_frame(self, state: VideoState) -> Callable[[tuple[np.ndarray, list[torch.Tensor]]], None]:
        """What the writing thread does with each frame: its maps resized to its pixels, blended over them and
        appended to the overlay videos (the first frame's overlays kept for the gallery)."""
        first = True

        def write(item: tuple[np.ndarray, list[torch.Tensor]]) -> None:
            nonlocal first
            rgb, coarse = item
            pixels = torch.from_numpy(rgb)
            height, width = rgb.shape[:2]
            for writer, held in zip(state.writers, coarse, strict=True):
                saliency = F.interpolate(held[None, None], (height, width), mode="bilinear", align_corners=False)
                overlay = self.blender(pixels, saliency[0, 0].clamp(0, 1))
                if first and self.output.report:
                    state.first_overlays.append(overlay)
                writer.write(np.ascontiguousarray(overlay.numpy()[:, :, ::-1]))
            first = False

        return write

    def _rows(
        self, video: InputImage, state: VideoState, outputs: Sequence[tuple[str, Path]], seconds: float
    ) -> list[Record]:
        """One row per clip, target and method: the clip's predictions, the map's target, its overlay video, plot
        and raw map, its :class:`ClipInfo` and fingerprint (``seconds``: the whole video's, reading to writing)."""
        rows = []
        for done in state.clips:
            for (method, path), (target, info, fingerprint, raw) in zip(outputs, done.maps, strict=True):
                files = [str(path), str(clip_curve_path(path)), *([str(raw)] if raw is not None else [])]
                rows.append(
                    self._record(
                        video,
                        "ok",
                        method=method,
                        target=target,
                        predictions=done.predictions,
                        outputs=files,
                        seconds=seconds,
                        fingerprint=fingerprint,
                        clip=info,
                    )
                )
        return rows

    def _record(self, video: InputImage, status: str, **fields: Any) -> Record:
        return Record(str(video.path), status, self.explainer.model.name, self.explainer.layer_label, **fields)

    def _error(self, video: InputImage, message: str) -> Record:
        return self._record(video, "error", error=message)


def _start_writing() -> None:
    """The writing thread's start: PyTorch on one core there (the model has the others), the plot's imports."""
    torch.set_num_threads(1)
    preload()
