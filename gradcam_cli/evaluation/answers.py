"""How faithful an answer's map is: ``gradcam eval --prompt``'s deletion and insertion curves of the answer's
probability (docs/vlm.md).

As ``gradcam eval`` does for a class (docs/evaluation.md), the photo's pixels are taken away (deletion: set to the
processor's mean colour, which it normalises to 0) or put back into a blurred copy (insertion), most salient first,
in ``steps`` equal steps, and the answer is scored again with teacher forcing at each step. The score is the
answer's probability per token, exp(log p / n) for an answer of n tokens, so that answers of any length are on one
[0, 1] scale. A faithful map makes the deletion curve fall fast (a low area) and the insertion curve rise fast (a
high area).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torchvision.transforms.functional as TF
from PIL import Image

from ..cam.explainer import Explainer
from ..cam.prompted import explain_prompt
from ..cam.results import Prediction
from ..cam.tasks.answer import EMPTY_ANSWER, AnswerScore, answer_score
from ..errors import GradcamError, UsageError, describe
from ..io.boxes import GroundTruthBox
from ..io.discovery import InputImage
from ..io.images import load_image, to_pixel_tensor
from ..options import EvalOptions
from .images import report_of
from .metrics import auc, importance_ranks, step_counts
from .report import BLUR_KERNEL, BLUR_SIGMA, EvalReport, ImageScores, MethodScores


@dataclass(frozen=True)
class AnswerCurves:
    """The answer's per-token probability at each step of deletion and of insertion (``steps + 1`` points each)."""

    deletion: list[float]
    insertion: list[float]

    @property
    def deletion_auc(self) -> float:
        """The deletion curve's area (lower: more faithful)."""
        return auc(self.deletion)

    @property
    def insertion_auc(self) -> float:
        """The insertion curve's area (higher: more faithful)."""
        return auc(self.insertion)


def answer_curves(
    score: AnswerScore,
    image: Image.Image,
    prompt: str,
    answer: Sequence[int],
    saliency: torch.Tensor,
    steps: int = 10,
) -> AnswerCurves:
    """Deletion and insertion curves of ``answer`` (token ids) about ``image`` along ``saliency`` (H, W), scored by
    the answer task's ``score`` (an explainer's: :func:`~gradcam_cli.cam.tasks.answer.answer_score`)."""
    pixels = to_pixel_tensor(image).permute(2, 0, 1)
    mean = getattr(score.model.processor.image_processor, "image_mean", None) or (0.5, 0.5, 0.5)
    grey = (torch.tensor([float(v) for v in mean]) * 255).round().to(torch.uint8).view(3, 1, 1).expand_as(pixels)
    blurred = TF.gaussian_blur(pixels.float(), [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA]).round()
    blurred = blurred.clamp(0, 255).to(torch.uint8)
    ranks = importance_ranks(saliency.cpu())
    counts = step_counts(ranks.numel(), steps)

    def scored(chosen: torch.Tensor) -> float:
        photo = Image.fromarray(chosen.permute(1, 2, 0).contiguous().numpy())
        return math.exp(score.answer_logprob(photo, prompt, answer) / len(answer))

    deletion = [scored(torch.where(ranks < count, grey, pixels)) for count in counts]
    insertion = [scored(torch.where(ranks < count, pixels, blurred)) for count in counts]
    return AnswerCurves(deletion, insertion)


class AnswerEvaluator:
    """``gradcam eval``'s evaluator of a vision-language model's answers (the answer task's,
    :func:`~gradcam_cli.evaluation.choose.evaluator_for`): per prompted image (its ``prompt``) and method, the
    deletion and insertion curves of the answer's (``--answer``, or the generated one) per-token probability along
    its map (:func:`answer_curves`, in ``options.steps``)."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        self.score = answer_score(explainer)
        if self.options.steps < 2:
            raise UsageError("--steps must be at least 2")
        if self.options.meta:
            raise UsageError("--meta is measured on a classifier's images; an answer is measured by its curves only")

    def rows(self, images: Sequence[InputImage]) -> Iterator[dict[str, Any]]:
        """Each image's rows, one per method (an empty answer: one with its ``note``); an image that fails gives an
        error row."""
        for image in images:
            try:
                yield from self._image_rows(image, image.prompt or "")
            except GradcamError as error:  # each failure line starts with its input's path (docs/cli.md)
                message = str(error) if str(error).startswith(f"{image.path}:") else f"{image.path}: {error}"
                yield {"input": str(image.path), "status": "error", "error": message}
            except (RuntimeError, ValueError, OSError) as error:
                message = f"{image.path}: {describe(error, str(image.path))}"
                yield {"input": str(image.path), "status": "error", "error": message}

    def _image_rows(self, image: InputImage, prompt: str) -> Iterator[dict[str, Any]]:
        photo = load_image(image.path)
        result = explain_prompt(self.explainer, photo, prompt, self.score.question.answer, False, ())
        if not result.tokens:
            yield {"input": str(image.path), "status": "ok", "note": EMPTY_ANSWER, "prompt": prompt, "answer": ""}
            return
        ids = [token.id for token in result.tokens]
        for explained in result.maps:
            curves = answer_curves(self.score, photo, prompt, ids, explained.saliency, self.options.steps)
            yield {
                "input": str(image.path),
                "status": "ok",
                "method": explained.method,
                "prompt": prompt,
                "answer": result.answer,
                "deletion_auc": round(curves.deletion_auc, 6),
                "insertion_auc": round(curves.insertion_auc, 6),
                "deletion": [round(v, 6) for v in curves.deletion],
                "insertion": [round(v, 6) for v in curves.insertion],
            }

    def run(
        self,
        images: Sequence[InputImage | str | Path],
        boxes: Sequence[GroundTruthBox] | None = None,
        on_image: Callable[[], Any] | None = None,
        on_result: Callable[[ImageScores], Any] | None = None,
        on_method: Callable[[str], Any] | None = None,
        done: Mapping[str, ImageScores] | None = None,
    ) -> EvalReport:
        """The report of :meth:`rows` for prompted ``images``, as every evaluator's (:meth:`Evaluator.run
        <gradcam_cli.evaluation.evaluate.Evaluator.run>`): per image, the answer (its per-token probability) and
        each method's curves; ``boxes`` and ``done`` do not apply to an answer."""
        if boxes:
            raise UsageError("--boxes does not apply to a --prompt's answer (docs/vlm.md: deletion and insertion)")
        prompted = [image for image in images if isinstance(image, InputImage) and image.prompt is not None]
        if len(prompted) != len(images):
            raise UsageError("an answer's evaluation takes prompted images (InputImage with a prompt)")
        results: dict[str, ImageScores] = {}
        for row in self.rows(prompted):
            scores = results.setdefault(row["input"], ImageScores(row["input"]))
            if row["status"] == "error":
                scores.error = row["error"]
            elif "method" in row:
                first = row["deletion"][0]
                scores.target = scores.target or Prediction(-1, "answer", first, details={"answer": row["answer"]})
                method = MethodScores(row["deletion"], row["insertion"], math.nan)
                scores.methods[row["method"]] = method
                if on_result is not None:
                    on_result(ImageScores(row["input"], scores.target, {row["method"]: method}))
        if on_image is not None:
            for _ in prompted:
                on_image()
        return report_of(self.explainer, self.options, list(results.values()), 0)
