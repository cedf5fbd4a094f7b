"""``gradcam eval`` of a video model, clip by clip (docs/evaluation.md, "Clips"): the clips a video is read as, and
the temporal deletion and insertion curves of a clip's T x H x W map.

A video (a file, or a folder of frames at ``--fps``, default :data:`~gradcam_cli.io.video.DEFAULT_FPS`) is read
whole and cut into the clips ``gradcam`` explains it with, side by side
(:func:`~gradcam_cli.models.clip_spec.clip_starts`, :func:`~gradcam_cli.models.clip_spec.sample_offsets`); each clip
is one evaluated input, ``VIDEO#clipN``, scored by the protocol of an image with voxels for pixels
(:class:`ClipEvaluator`), and by its frames in time:

- **Temporal deletion**: the clip's T frames ordered by their share of the map (its sum over the frame's pixels),
  largest first (ties: the earlier frame first), and replaced, in ``min(steps, T)`` equal steps, by the clip's mean
  frame (the mean of its T frames in the network's input space: what stays still over the clip is kept, what moves
  or comes and goes is taken away); the class's probability read after each step. A faithful map's curve falls
  fast: a low area (:func:`~gradcam_cli.evaluation.metrics.auc`).
- **Temporal insertion**: from the clip of mean frames, the frames put back in the same order; a high area is
  faithful.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..errors import GradcamError, ImageError, UsageError
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage, discover_videos
from ..io.frames import network_frame, opened_video
from ..io.images import InputSpec
from ..io.video import NO_FRAMES, frames
from ..models.clip_spec import ClipSpec, clip_starts, sample_offsets
from ..models.profile import LoadedModel
from ..options import EvalOptions
from . import metrics
from .evaluate import Boxes, Evaluator, Inputs, Tick, Told
from .images import scored_safely
from .report import ImageScores, MethodScores

Clip = tuple[str, torch.Tensor]
"""One clip to evaluate: its name, ``VIDEO#clipN`` (clips numbered from 0, as ``gradcam``'s rows and ``gradcam
diff`` show them), and its (3, T, H, W) network input."""


def refuse_for_clips(options: EvalOptions, boxes: Sequence[object] | None = None) -> None:
    """Refuse what ``gradcam eval`` does not measure on clips: ROAD (its imputation fills pixels of one image) and
    ground-truth boxes (boxes name images); a rate that is not above 0."""
    if options.fps is not None and not options.fps > 0:
        raise UsageError("--fps must be above 0")
    if options.road:
        raise UsageError("--road imputes an image's pixels; a video model's clips are measured without it")
    if boxes or options.boxes is not None:
        raise UsageError("--boxes name images; a video model's clips are measured by their curves only")
    for flag, on in (
        ("--arcc", options.arcc),
        ("--random-logit", options.random_logit),
        ("--mprt", options.mprt),
        ("--meta", options.meta),
    ):
        if on:
            raise UsageError(f"{flag} is measured on images; a video model's clips are measured without it")


def evaluated_inputs(
    explainer: Explainer, inputs: Sequence[str | Path], images: list[InputImage], options: EvalOptions
) -> list[InputImage]:
    """What ``gradcam eval`` evaluates of ``inputs``: a video model's videos and folders of frames
    (:func:`~gradcam_cli.io.discovery.discover_videos`), else the ``images`` found; ``--fps`` refused for a model
    that takes images."""
    if explainer.model.profile.clips is not None:
        return discover_videos(inputs, explainer.model.name)
    if options.fps is not None:
        raise UsageError(
            f"--fps is the frame rate of a folder of frames given to a video model; {explainer.model.name} takes images"
        )
    return images


def rank_options(explainer: Explainer, options: EvalOptions) -> EvalOptions:
    """What ``gradcam eval --rank`` measures: the options given and the task's own
    (:meth:`~gradcam_cli.cam.tasks.base.TaskAdapter.rank_options`), but ROAD on a video model's clips only where
    given (and then refused); a volume model's scans by their curves (and ``--masks``), what else was given refused
    (:mod:`~gradcam_cli.evaluation.scans`)."""
    if explainer.model.profile.volume is not None:
        return options
    ranked = explainer.adapter.rank_options(options, bool(explainer.options.targets))
    return replace(ranked, road=options.road) if explainer.model.profile.clips is not None else ranked


def read_clips(path: Path, clip: ClipSpec, spec: InputSpec, fps: float | None = None) -> list[Clip]:
    """The clips of the video (or folder of frames, at ``fps``) at ``path``, side by side, each as its model takes
    it; an :class:`~gradcam_cli.errors.ImageError` when it cannot be read or has no frames."""
    with opened_video(path, fps) as (capture, fps):
        tensors = []
        size: tuple[int, int] | None = None
        for frame in frames(capture):
            size = size or (frame.shape[1], frame.shape[0])
            tensors.append(network_frame(frame, size, spec)[1])
    if not tensors:
        raise ImageError(f"{path}: {NO_FRAMES}")
    span = clip.span(fps)
    offsets = sample_offsets(clip.frames, span)
    last = len(tensors) - 1
    return [
        (f"{path}#clip{number}", torch.stack([tensors[min(start + offset, last)] for offset in offsets], dim=1))
        for number, start in enumerate(clip_starts(len(tensors), span, span))
    ]


def evaluate_clips(
    videos: Sequence[InputImage | str | Path],
    model: LoadedModel,
    fps: float | None,
    scored: Callable[[str, torch.Tensor], ImageScores],
    on_video: Callable[[], Any] | None = None,
    on_failed: Callable[[ImageScores], Any] | None = None,
) -> list[ImageScores]:
    """``scored(name, clip)`` of every clip of every video (:func:`read_clips`; a folder of frames at ``fps``), in
    order, a clip that fails as its ``error``; a video that cannot be read is one failed input, handed to
    ``on_failed``; ``on_video`` is called once per video."""
    results = []
    for video in videos:
        path = video.path if isinstance(video, InputImage) else Path(video)
        try:
            clips = read_clips(path, model.profile.clips or ClipSpec(1), model.input_spec, fps)
        except GradcamError as error:
            clips = []
            results.append(ImageScores(str(path), error=str(error)))
            if on_failed is not None:
                on_failed(results[-1])
        results += [scored_safely(path, partial(scored, name, clip)) for name, clip in clips]
        if on_video is not None:
            on_video()
    return results


def clip_named(
    name: str, model: LoadedModel, fps: float | None, scored: Callable[[str, torch.Tensor], ImageScores]
) -> ImageScores:
    """``scored(name, clip)`` of the clip ``name``, ``VIDEO#clipN``, read again from its video (:func:`read_clips`;
    a folder of frames at ``fps``)."""
    video = name.rpartition("#clip")[0]
    if not video:
        raise ImageError(f"{name}: not the name of a clip (VIDEO#clipN)")
    clips = dict(read_clips(Path(video), model.profile.clips or ClipSpec(1), model.input_spec, fps))
    if name not in clips:
        raise ImageError(f"{name}: no such clip ({len(clips)} in {video})")
    return scored(name, clips[name])


def frame_order(saliency: torch.Tensor) -> torch.Tensor:
    """Each frame's place when the (T, H, W) map's frames are sorted by their share of it, largest first (0: the
    largest; ties: the earlier frame first)."""
    return metrics.importance_ranks(saliency.flatten(1).double().sum(dim=1))


def temporal_inputs(clip: torch.Tensor, saliency: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The perturbed copies of a (3, T, H, W) clip that :func:`temporal_curves` reads, along its (T, H, W) map:
    the inner steps of deletion, those of insertion, then the clip of mean frames (see the module docstring)."""
    count = clip.shape[1]
    counts = metrics.step_counts(count, min(steps, count))[1:-1]
    ranks = frame_order(saliency).to(clip.device).view(1, count, 1, 1)
    mean = clip.mean(dim=1, keepdim=True).expand_as(clip)
    deletion = [torch.where(ranks < k, mean, clip) for k in counts]
    insertion = [torch.where(ranks < k, clip, mean) for k in counts]
    return [*deletion, *insertion, mean]


def temporal_curves(full: float, scores: Sequence[float]) -> tuple[list[float], list[float]]:
    """The temporal deletion and insertion curves from the clip's own score ``full`` and the scores of
    :func:`temporal_inputs`' copies, in their order."""
    inner = (len(scores) - 1) // 2
    still = scores[-1]
    return [full, *scores[:inner], still], [still, *scores[inner : 2 * inner], full]


def measure_in_time(
    clip: torch.Tensor,
    saliency: torch.Tensor,
    steps: int,
    full: float,
    score: Callable[[list[torch.Tensor]], list[float]],
) -> tuple[list[float], list[float]]:
    """The temporal deletion and insertion curves of one clip's map, ``score`` giving the class's probability of
    each copy of a list."""
    return temporal_curves(full, score(temporal_inputs(clip, saliency, steps)))


class ClipEvaluator(Evaluator):
    """The protocol on a video model's clips (docs/evaluation.md, "Clips"; the module docstring): each clip one
    input, ``VIDEO#clipN``, scored as an image with voxels for pixels, and in time; ``on_image``: once per video."""

    def _inputs(self, images: Inputs, boxes: Boxes, on_image: Tick, on_result: Told) -> tuple[list[ImageScores], int]:
        refuse_for_clips(self.options, boxes)
        return evaluate_clips(images, self.explainer.model, self.options.fps, self._clip, on_image, on_result), 0

    def evaluate_image(self, path: Path, boxes: Sequence[GroundTruthBox] = ()) -> ImageScores:
        """One clip by its name, ``VIDEO#clipN`` (as the seed spread re-runs it: :mod:`.seeds`)."""
        return scored_safely(path, lambda: clip_named(str(path), self.explainer.model, self.options.fps, self._clip))

    def _clip(self, name: str, clip: torch.Tensor) -> ImageScores:
        return self._scored(name, clip[None].to(self.explainer.device), (clip.shape[-2], clip.shape[-1]), ())

    def _perturbation_scores(
        self, image: torch.Tensor, target: Prediction, maps: dict[str, torch.Tensor], read: Callable[[object], Any]
    ) -> dict[str, MethodScores]:
        """The voxels' curves (:meth:`Evaluator._perturbation_scores`) and the frames' (:func:`measure_in_time`)."""
        scores = super()._perturbation_scores(image, target, maps, read)

        def score(copies: list[torch.Tensor]) -> list[float]:
            return list(self._probabilities([(k,) for k in range(len(copies))], lambda job: copies[job[0]], read))

        for method, saliency in maps.items():
            curves = measure_in_time(image, saliency, self.options.steps, target.probability, score)
            scores[method].temporal_deletion, scores[method].temporal_insertion = curves
        return scores
