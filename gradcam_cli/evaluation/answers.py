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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torchvision.transforms.functional as TF
from PIL import Image

from ..cam.answers import AnswerExplainer
from ..cam.tasks.answer import EMPTY_ANSWER
from ..errors import GradcamError, describe
from ..io.discovery import InputImage
from ..io.images import load_image, to_pixel_tensor
from .metrics import auc, importance_ranks, step_counts
from .report import BLUR_KERNEL, BLUR_SIGMA


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
    explainer: AnswerExplainer,
    image: Image.Image,
    prompt: str,
    answer: Sequence[int],
    saliency: torch.Tensor,
    steps: int = 10,
) -> AnswerCurves:
    """Deletion and insertion curves of ``answer`` (token ids) about ``image`` along ``saliency`` (H, W)."""
    pixels = to_pixel_tensor(image).permute(2, 0, 1)
    mean = getattr(explainer.model.processor.image_processor, "image_mean", None) or (0.5, 0.5, 0.5)
    grey = (torch.tensor([float(v) for v in mean]) * 255).round().to(torch.uint8).view(3, 1, 1).expand_as(pixels)
    blurred = TF.gaussian_blur(pixels.float(), [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA]).round()
    blurred = blurred.clamp(0, 255).to(torch.uint8)
    ranks = importance_ranks(saliency.cpu())
    counts = step_counts(ranks.numel(), steps)

    def score(chosen: torch.Tensor) -> float:
        photo = Image.fromarray(chosen.permute(1, 2, 0).contiguous().numpy())
        return math.exp(explainer.answer_logprob(photo, prompt, answer) / len(answer))

    deletion = [score(torch.where(ranks < count, grey, pixels)) for count in counts]
    insertion = [score(torch.where(ranks < count, pixels, blurred)) for count in counts]
    return AnswerCurves(deletion, insertion)


def answer_rows(
    answerer: AnswerExplainer, images: Sequence[InputImage], answer: str | None, steps: int
) -> Iterator[dict[str, Any]]:
    """``gradcam eval --prompt``'s rows: per prompted image (its ``prompt``) and method, the deletion and insertion
    curves of the answer's (``answer``, or the generated one) per-token probability along its map
    (:func:`answer_curves`); an image that fails gives an error row."""
    for image in images:
        try:
            yield from _image_rows(answerer, image, image.prompt or "", answer, steps)
        except GradcamError as error:  # each failure line starts with its input's path (docs/cli.md)
            message = str(error) if str(error).startswith(f"{image.path}:") else f"{image.path}: {error}"
            yield {"input": str(image.path), "status": "error", "error": message}
        except (RuntimeError, ValueError, OSError) as error:
            message = f"{image.path}: {describe(error, str(image.path))}"
            yield {"input": str(image.path), "status": "error", "error": message}


def _image_rows(
    answerer: AnswerExplainer, image: InputImage, prompt: str, answer: str | None, steps: int
) -> Iterator[dict[str, Any]]:
    photo = load_image(image.path)
    result = answerer.explain(photo, prompt, answer)
    if not result.tokens:
        yield {"input": str(image.path), "status": "ok", "note": EMPTY_ANSWER, "prompt": prompt, "answer": ""}
        return
    ids = [token.id for token in result.tokens]
    for explained in result.maps:
        curves = answer_curves(answerer, photo, prompt, ids, explained.saliency, steps)
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
