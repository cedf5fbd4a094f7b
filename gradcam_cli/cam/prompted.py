"""A prompted image through the one :class:`~gradcam_cli.cam.explainer.Explainer` (docs/vlm.md): the input kind of a
vision-language model, whose task's score (:class:`~gradcam_cli.cam.tasks.answer.AnswerScore`) makes the answer
(generated, or ``--answer``) the target. The explainer's layer (chosen as every layer is: looked up with close
matches, the family's by default), its methods (the registry's, checked as every task's) and its options (the
eigen smoothing) make the maps, every method's output is checked as an image's is
(:func:`~gradcam_cli.cam.methods.registry.check_maps`) and each map is normalised as an image's is
(:func:`~gradcam_cli.cam.maps.normalise`) once it is on the photo.

An answer's layer output is flattened to its tokens (L, C) and a method sees them as one (1, C, 1, L) map: a channel
weight is pooled over all image tokens (every tile); the per-token map is placed on the photo by the family's
geometry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch
from PIL import Image
from torch import nn

from ..models.profile import LoadedModel
from ..options import ExplainOptions
from ..targets import TargetSpec
from .answers import AnswerExplanation, AnswerMap, AnswerTarget, AnswerToken, SampledClip
from .explainer_input import Chosen
from .maps import normalise
from .methods import METHODS
from .methods.registry import check_maps
from .scores import Score
from .tasks.answer import answer_score


class PromptedExplainer(Protocol):
    """What the prompted path reads of an :class:`~gradcam_cli.cam.explainer.Explainer`."""

    model: LoadedModel
    score: Score
    options: ExplainOptions
    chosen: Chosen
    network: tuple[nn.Module, Mapping[str, nn.Module]]


def explain_prompt(
    explainer: PromptedExplainer,
    image: Image.Image,
    prompt: str,
    answer: str | None = None,
    per_token: bool | None = None,
    specs: Sequence[TargetSpec] | None = None,
) -> AnswerExplanation:
    """Answer ``prompt`` about ``image`` (or take ``answer``), then map the answer, its tokens with ``per_token``
    and ``specs`` (``None``: the explainer's question's)."""
    score = answer_score(explainer)
    inputs = score.inputs(image, prompt)
    layer = explainer.chosen.layer_label
    return _explained(
        explainer, inputs, lambda values: score.place(values, inputs, image, layer), prompt, answer, (per_token, specs)
    )


def explain_clip_prompt(
    explainer: PromptedExplainer,
    clip: SampledClip,
    prompt: str,
    answer: str | None = None,
    per_token: bool | None = None,
    specs: Sequence[TargetSpec] | None = None,
) -> AnswerExplanation:
    """Answer ``prompt`` about a video ``clip`` (or take ``answer``): its sampled frames through the processor's
    video path; then map the answer as :func:`explain_prompt` does, each map (span, h, w) over the clip's video
    frames at the processor's pixels (docs/video.md)."""
    score = answer_score(explainer)
    inputs = score.video_inputs(clip, prompt)
    layer = explainer.chosen.layer_label
    placer = lambda values: score.place_video(values, inputs, clip.span, layer)  # noqa: E731
    return _explained(explainer, inputs, placer, prompt, answer, (per_token, specs))


Placer = Callable[[torch.Tensor], torch.Tensor]
"""The layer's per-token values (L,), in its order, placed on the input: an image's (H, W), a clip's (T, H, W)."""


def _explained(
    explainer: PromptedExplainer,
    inputs: Mapping[str, torch.Tensor],
    placer: Placer,
    prompt: str,
    answer: str | None,
    asked: tuple[bool | None, Sequence[TargetSpec] | None],
) -> AnswerExplanation:
    """The answer (generated, or ``answer``) to the processor's ``inputs`` and its maps placed by ``placer``;
    ``asked``: ``per_token`` and ``specs`` (``None``: the explainer's question's)."""
    score = answer_score(explainer)
    per_token = score.question.per_token if asked[0] is None else asked[0]
    specs = score.question.specs if asked[1] is None else asked[1]
    ids = score.generate(inputs) if answer is None else score.encode(answer)
    if not ids:  # the model ended at once: an empty answer, nothing to map
        return AnswerExplanation(prompt, "", True, [], explainer.chosen.layer_label)
    targets = score.answer_targets(ids, per_token, specs)
    return _mapped(explainer, inputs, placer, prompt, (ids, answer is None), targets)


def explain_answer(
    explainer: PromptedExplainer,
    image: Image.Image,
    prompt: str,
    ids: Sequence[int],
    generated: bool,
    targets: Sequence[AnswerTarget],
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> AnswerExplanation:
    """Map ``targets`` of the answer ``ids`` (generated or given before: nothing is generated here)."""
    score = answer_score(explainer)
    inputs = score.inputs(image, prompt) if inputs is None else inputs
    layer = explainer.chosen.layer_label
    placer = lambda values: score.place(values, inputs, image, layer)  # noqa: E731
    return _mapped(explainer, inputs, placer, prompt, (ids, generated), targets)


def _mapped(
    explainer: PromptedExplainer,
    inputs: Mapping[str, torch.Tensor],
    placer: Placer,
    prompt: str,
    answer: tuple[Sequence[int], bool],
    targets: Sequence[AnswerTarget],
) -> AnswerExplanation:
    """Map ``targets`` of the ``answer`` (its ids, whether generated) with the explainer's methods, each placed by
    ``placer`` and normalised."""
    score = answer_score(explainer)
    ids = [int(token) for token in answer[0]]
    activations, gradients, logprobs = answer_gradients(explainer, inputs, ids, targets)
    decode = score.tokenizer.decode
    tokens = [AnswerToken(decode([t]), t, float(lp)) for t, lp in zip(ids, logprobs, strict=True)]
    text = decode(ids, skip_special_tokens=True).strip() or decode(ids).strip()  # special alone: shown
    layer = explainer.chosen.layer_label
    result = AnswerExplanation(prompt, text, answer[1], tokens, layer)
    methods, flat = explainer.chosen.methods, _as_map(activations)
    cams = {m: [[_coarse(explainer, m, flat, _as_map(gradient))] for _, gradient in gradients] for m in methods}
    check_maps(cams, {layer: flat}, [layer], flat)  # a plugin's NaN or misshapen map: the image fails
    for k, (target, (value, _)) in enumerate(zip(targets, gradients, strict=True)):
        for method in methods:
            values = cams[method][k][0].reshape(-1)
            placed = placer(values)
            result.maps.append(AnswerMap(target, method, value, values, normalise(placed[None])[0]))
    return result


def answer_gradients(
    explainer: PromptedExplainer,
    inputs: Mapping[str, torch.Tensor],
    ids: Sequence[int],
    targets: Sequence[AnswerTarget],
) -> tuple[torch.Tensor, list[tuple[float, torch.Tensor]], list[float]]:
    """The explainer's layer's tokens (L, C), each target's (score, gradient (L, C)) and the answer tokens'
    log-probabilities (:meth:`~gradcam_cli.cam.tasks.answer.AnswerScore.gradients`)."""
    _, layers = explainer.network
    return answer_score(explainer).gradients(layers, inputs, ids, targets)


def token_map(
    explainer: PromptedExplainer, method: str, activations: torch.Tensor, gradient: torch.Tensor
) -> torch.Tensor:
    """``method``'s map of the layer's tokens, (L,): the (L, C) tokens seen as one (1, C, 1, L) map."""
    return _coarse(explainer, method, _as_map(activations), _as_map(gradient)).reshape(-1)


def _coarse(explainer: PromptedExplainer, method: str, tokens: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """``method``'s (1, 1, L) map of the (1, C, 1, L) ``tokens``, with the explainer's eigen smoothing."""
    coarse: torch.Tensor = METHODS[method].compute(tokens, gradient, eigen_smooth=explainer.options.eigen_smooth)
    return coarse


def _as_map(tokens: torch.Tensor) -> torch.Tensor:
    """(L, C) tokens as one (1, C, 1, L) map."""
    return tokens.T.reshape(1, -1, 1, tokens.shape[0])
