"""A vision-language model's answer about a video (docs/video.md, "A vision-language model's answer"): the
:class:`~gradcam_cli.pipeline.clips.ClipRunner` of a prompted video, whose one clip is the whole video, sampled at
the model's video processor's rate and put through its video path with the video's prompt."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cam.answers import SampledClip
from ..cam.explainer import Explainer
from ..cam.prompted import explain_clip_prompt
from ..cam.records import Answer, Record, answer_prediction
from ..cam.results import Explanation
from ..cam.tasks.answer import EMPTY_ANSWER, answer_score
from ..errors import GradcamError, ImageError, UsageError, describe
from ..io.atomic import TEMP_MARKER
from ..io.discovery import InputImage
from ..io.frames import rgb_frame
from ..io.naming import answer_video_path
from ..io.video import NO_FRAMES, opencv_name
from ..models.clip_spec import ClipSpec, sample_offsets
from ..options import OutputOptions, RunOptions
from .answers import kept_answer, token_rows
from .clips import ClipDone, ClipRunner, VideoState
from .resume import EarlierRows

WHOLE_VIDEO = sys.maxsize
"""The span of a clip that is the whole video: no clip is explained before its last frame is read."""
CLIP_STRIDE = (
    "--clip-stride is for video models; a vision-language model is asked about a whole video as one clip (its "
    "processor's sampling): cut the video to ask about a part"
)
"""Why a run of prompted videos refuses ``--clip-stride``."""


class AnswerClipRunner(ClipRunner):
    """A vision-language model's answer about each prompted video (docs/video.md, "A vision-language model's
    answer"): the video is one clip, all of it, sampled at the video processor's rate
    (:meth:`~gradcam_cli.cam.answers.Prompter.video_frames`, :func:`~gradcam_cli.models.clip_spec.sample_offsets`)
    and put through its video path with the video's prompt (:func:`~gradcam_cli.cam.prompted.explain_clip_prompt`).
    Its overlay videos, one per answer target and method, are known once the answer is; the rest is
    :class:`ClipRunner`'s: the maps (span, h, w) over the video's frames, the plots, ``--save-raw``, the rows (with
    the answer)."""

    def __init__(
        self,
        explainer: Explainer,
        output: OutputOptions | None = None,
        run: RunOptions | None = None,
        earlier: EarlierRows | None = None,
    ) -> None:
        score = answer_score(explainer)
        refusal = score.video_refusal()
        if refusal is not None:
            raise UsageError(refusal)
        if run is not None and run.clip_stride is not None:
            raise UsageError(CLIP_STRIDE)
        super().__init__(explainer, ClipSpec(1), output, run)
        self.score = score
        self.earlier = earlier or EarlierRows()
        self.video = InputImage(Path(), Path())  # the video being answered

    def outputs(self, video: InputImage) -> list[tuple[str, Path]]:
        """None before the answer: its targets name the overlay videos."""
        return []

    def run(self, video: InputImage, on_frame: Callable[[], Any] | None = None) -> list[Record]:
        """Answer ``video``'s prompt about it and map the answer; its rows (the first with the answer's tokens), or
        one error row (a video that fails leaves no output behind)."""
        if self.output.skip_existing:  # its earlier rows, when they hold this question and all their outputs exist
            methods = self.explainer.chosen.methods
            kept = kept_answer(self.earlier, video, (methods, self.score.question.answer))
            if kept is not None:
                return kept
        started = time.perf_counter()
        self.video = video
        state = VideoState(0.0, 0, [])
        done = False
        try:
            self._explain_video(video, state, on_frame)
            if state.written == 0:
                raise ImageError(f"{video.path}: {NO_FRAMES}")
            self._finish(state, self._labelled(state), state.temporaries)
            done = True
        except GradcamError as error:  # a word the answer does not hold: this video's failure
            message = str(error)
            return [self._error(video, message if message.startswith(f"{video.path}:") else f"{video.path}: {message}")]
        except Exception as error:  # one unexplainable video must not end the run
            return [self._error(video, f"{video.path}: {describe(error, video.path)}")]
        finally:
            for path in state.temporaries if done else [*state.temporaries, *state.raws]:
                path.unlink(missing_ok=True)
        return self._rows(video, state, self._labelled(state), round(time.perf_counter() - started, 4))

    def _labelled(self, state: VideoState) -> list[tuple[str, Path]]:
        """(method, overlay video) of each map of the video's answer."""
        if not state.clips:
            return []
        return list(zip(state.clips[0].methods, state.outputs, strict=True))

    def _labels(self, video: InputImage, state: VideoState) -> list[tuple[str, Path]]:
        return self._labelled(state)

    def _span(self, fps: float) -> int:
        return WHOLE_VIDEO

    def _preparer(self, state: VideoState) -> Callable[[np.ndarray], tuple[np.ndarray, torch.Tensor]]:
        """Each BGR frame's RGB pixels (at the first frame's size), also as the processor's input (H, W, 3)."""

        def prepare(frame: np.ndarray) -> tuple[np.ndarray, torch.Tensor]:
            if state.size is None:
                state.size = (frame.shape[1], frame.shape[0])
            rgb = rgb_frame(frame, state.size)
            return rgb, torch.from_numpy(rgb)

        return prepare

    def _explain_clips(self, state: VideoState, starts: Sequence[int]) -> None:
        """Answer the one clip, the whole video (``starts``: its first frame, 0); its maps added to every frame."""
        state.span = state.seen
        frames = list(state.waiting)
        offsets = sample_offsets(self.score.video_frames(state.seen, state.fps), state.span)
        sampled = torch.stack([self._input(frames[offset]) for offset in offsets])
        prompt = self.video.prompt or ""
        clip = SampledClip(sampled, tuple(offsets), state.span, state.fps)
        result = explain_clip_prompt(self.explainer, clip, prompt, self.score.question.answer)
        answer = Answer(result.prompt, result.answer, result.generated, token_rows(result))
        if not result.tokens:
            answer.tokens, answer.note = [], EMPTY_ANSWER
        output_dir = self.output.output_dir
        explained = [
            Explanation(m.method, answer_prediction(m.target.label, m.target.token, m.score), m.saliency)
            for m in result.maps
        ]
        state.outputs = [answer_video_path(output_dir, self.video, e.method, e.target.name) for e in explained]
        pid = os.getpid()
        state.temporaries = [p.with_name(opencv_name(f".{p.name}{TEMP_MARKER}{pid}.mp4")) for p in state.outputs]
        state.held = [None] * len(state.outputs)
        for frame in state.waiting:
            frame.sums = [None] * len(state.outputs)
            frame.count += 1
        maps = [self._clip_map(state, 0, state.seen, place, e) for place, e in enumerate(explained)]
        state.clips.append(ClipDone([], maps, answer, [e.method for e in explained]))
        state.covered = state.seen

    def _rows(
        self, video: InputImage, state: VideoState, outputs: Sequence[tuple[str, Path]], seconds: float
    ) -> list[Record]:
        """:class:`ClipRunner`'s rows, each with the answer (its tokens on the first); an empty answer: one row
        without outputs whose ``note`` says so."""
        rows = super()._rows(video, state, outputs, seconds)
        answer = state.clips[0].answer if state.clips else None
        if answer is None:
            return rows
        if not rows:
            return [self._record(video, "ok", answer=answer, seconds=seconds)]
        for index, row in enumerate(rows):
            row.answer = answer if index == 0 else replace(answer, tokens=None)
        return rows
