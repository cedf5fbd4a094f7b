"""``--target`` specs (:mod:`gradcam_cli.targets`) as scores: each target becomes a function of the model's output
that gives every sample's (N,) score, the value the methods differentiate (docs/targets.md).

- ``class:C``: class C's logit (``--score``: softmax, sigmoid), as ``--target-class`` scores it;
- ``similar:REF``: the cosine between the sample's embedding and the reference's (a folder: its mean, renormalised;
  :func:`gradcam_cli.cam.embeddings.reference_embedding`);
- ``text:PROMPT``: the image-text cosine of a CLIP-style model (``--score logit``: ``scale * cos + bias``;
  ``softmax``: over the run's prompts; ``sigmoid``: of the logit);
- ``contrast:A,B``: A's score minus B's;
- ``output:I[:neg]``: the I-th output (of the (N, K) output or ``--embedding``), negated for negative evidence.

Reference and text embeddings are computed once, when the :class:`TargetScore` is built (once per run), on the
model's device; every score stays in torch there. Finer-CAM (:mod:`gradcam_cli.cam.finer`) differentiates a class's or
a prompt's logit minus its nearest rivals', and a contrast's A minus B.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UsageError
from ..models.labels import resolve_target
from ..models.loading import LoadedModel
from ..models.modes import model_state_preserved
from ..options import CLASS_SCORE_NAMES
from ..targets import TargetSpec
from .embeddings import PromptHead, reference_embedding, select_output, unit
from .finer import finer_scores
from .layers import blank_input
from .logits import as_logits
from .methods import METHODS
from .methods.needs import FINER_GRADIENT
from .results import TOP_PREDICTIONS, ImageExplanation, Prediction
from .scores import (
    Cams,
    ClassName,
    ClassScore,
    MaskedProbability,
    Score,
    class_probabilities,
    class_scores,
    explanations_of,
)
from .untargeted import NoTargetScore

ScoreFunction = Callable[[object], torch.Tensor]
"""A model's output -> (N,) float32 scores, differentiable."""
FINER_KINDS = ("class", "text", "contrast")
"""The targets Finer-CAM takes: those with rivals to compare with."""


@dataclass(frozen=True)
class Resolved:
    """One target, resolved against a model: its ``name`` (as results and file names show it), ``index`` (the class
    of a ``class:`` target, else the target's position), ``score`` and Finer-CAM score (``None``: none)."""

    spec: TargetSpec
    name: str
    index: int
    score: ScoreFunction
    finer: ScoreFunction | None
    shown: str | None = None
    """What the score is when it is not a probability (``cosine``, ``logit``, ``difference``, ``output``): the
    results' :attr:`~gradcam_cli.cam.results.Prediction.score`; ``None``: a probability."""
    display: ScoreFunction | None = None
    """What results show, where not the score: a class's probability, as ``--target-class`` shows it."""


def model_kind(model: LoadedModel, output: object = None) -> str:
    """``clip`` (a text tower), ``embed`` (an embedding model) or ``classify``. ``output``: the model's output on
    an input, where known: a dict or tuple of tensors (no ``logits``) makes it an embedding model (docs/targets.md)."""
    if model.text is not None:
        return "clip"
    several = isinstance(output, Mapping | tuple | list) and not hasattr(output, "logits")
    return "embed" if model.embeds or several else "classify"


class TargetScore:
    """The :class:`~gradcam_cli.cam.scores.Score` of explicit targets: the same targets in every image.

    ``score``: ``None`` (a class's logit, a prompt's cosine), ``logit``, ``softmax``, ``sigmoid`` or ``cosine``;
    ``embedding``: which output is the embedding (``--embedding``); ``device``: where the reference and text
    embeddings live. A target that does not fit the model is a one-line UsageError."""

    def __init__(
        self,
        model: LoadedModel,
        specs: Sequence[TargetSpec | str],
        device: torch.device,
        score: str | None = None,
        embedding: str | None = None,
    ) -> None:
        self.model, self.device, self.embedding = model, device, embedding
        with model_state_preserved(model.module), torch.no_grad():
            blank = model.module(blank_input(model.input_spec, device))
        self.kind = model_kind(model, blank)
        self.columns = int(blank.shape[1]) if isinstance(blank, torch.Tensor) and blank.dim() == 2 else None
        """The classes of a model whose output is (N, C) logits (``None``: another output)."""
        self.specs = [TargetSpec.parse(spec) for spec in specs]
        self.class_kind = score if score in CLASS_SCORE_NAMES else "logit"
        self.text_kind = score or "cosine"
        if score == "cosine" and any(spec.kinds() & {"class", ""} and self.kind == "classify" for spec in self.specs):
            raise UsageError(
                "--score cosine is for text: and similar: targets; a class takes logit, softmax or sigmoid"
            )
        prompts = [part.value for spec in self.specs for part in (spec.parts or (spec,)) if self._is_text(part)]
        prompts += [name for name in model.categories or [] if self.kind == "clip" and name not in prompts]
        self.head: PromptHead | None = None
        if prompts and model.text is not None:
            self.head = PromptHead.encode(model.text, list(dict.fromkeys(prompts)), device, embedding)
        self.prompts = list(dict.fromkeys(prompts))
        self.resolved = [self._resolve(spec, k) for k, spec in enumerate(self.specs)]
        with torch.no_grad():  # a target the output cannot give (an output index, a class past the last, an
            for resolved in self.resolved:  # embedding of another size) stops the run here, before any image
                resolved.score(blank)

    def _is_text(self, spec: TargetSpec) -> bool:
        return spec.kind == "text" or (spec.kind == "" and self.kind == "clip")

    def _resolve(self, spec: TargetSpec, k: int) -> Resolved:
        if spec.kind == "contrast":
            first, second = (self._resolve(part, k) for part in spec.parts)
            a, b = first.score, second.score

            def contrast(output: object) -> torch.Tensor:
                return a(output) - b(output)

            return Resolved(spec, f"{first.name} - {second.name}", k, contrast, contrast, "difference")
        if self._is_text(spec):
            return self._text(spec, k)
        if spec.kind == "similar" or (spec.kind == "" and self.kind == "embed"):
            return self._similar(spec, k)
        if spec.kind == "output":
            return self._output(spec, k)
        if spec.kind == "answer":
            raise UsageError(f"{spec}: answer: targets are for a vision-language model asked a --prompt (docs/vlm.md)")
        if spec.kind == "region":
            raise UsageError(f"{spec}: region: targets are for a volume segmenter's scans (docs/volumes.md)")
        return self._class(spec)

    def _class(self, spec: TargetSpec) -> Resolved:
        if self.kind != "classify":
            what = "text: or similar:" if self.kind == "clip" else "similar:"
            raise UsageError(f"{spec}: {self.model.name} has no class head (it embeds images); use {what} targets")
        index = resolve_target(self.model, spec.value)
        assert index is not None
        classes = len(self.model.categories) if self.model.categories else None
        if index < 0 or (classes is not None and index >= classes):
            raise UsageError(f"{spec}: class index {index} is out of range (the model has {classes} classes)")
        kind = self.class_kind

        def score(output: object) -> torch.Tensor:
            logits = _columns(as_logits(output), index, spec)
            return class_scores(logits, kind)[:, index]

        def finer(output: object) -> torch.Tensor:
            return finer_scores(as_logits(output).float(), torch.full((_rows(output),), index))

        def shown(output: object) -> torch.Tensor:
            return class_probabilities(as_logits(output).float(), kind)[:, index]

        rivals = finer if self.columns is None or self.columns > 1 else None  # a single class has none
        return Resolved(spec, self.model.class_name(index), index, score, rivals, None, shown)

    def _text(self, spec: TargetSpec, k: int) -> Resolved:
        head = self.head
        if head is None:
            raise UsageError(
                f"{spec}: {self.model.name} has no text tower; text: targets are for CLIP-style models "
                "(open_clip:ARCH, or an hf: CLIP or SigLIP folder)"
            )
        column, kind = self.prompts.index(spec.value), self.text_kind

        def score(output: object) -> torch.Tensor:
            if kind == "cosine":
                return head.cosines(output)[:, column]
            logits = head(output)
            return (logits if kind == "logit" else class_probabilities(logits, kind))[:, column]

        def finer(output: object) -> torch.Tensor:
            return finer_scores(head(output), torch.full((_rows(output),), column))

        shown = kind if kind in ("cosine", "logit") else None
        rivals = finer if len(self.prompts) > 1 else None  # a single prompt has none
        return Resolved(spec, f"text:{spec.value}", k, score, rivals, shown)

    def _similar(self, spec: TargetSpec, k: int) -> Resolved:
        reference = reference_embedding(self.model, spec.value, self.embedding, self.device, str(spec))
        which = self.embedding

        def score(output: object) -> torch.Tensor:
            embedding = unit(select_output(output, which))
            if embedding.shape[1] != reference.shape[0]:
                raise UsageError(f"{spec}: embeddings of {embedding.shape[1]} and {reference.shape[0]} values differ")
            return embedding @ reference.to(embedding.device)

        name = Path(spec.value).name or spec.value  # the file or folder (the whole path is in the run record)
        return Resolved(spec, f"similar:{name}", k, score, None, "cosine")

    def _output(self, spec: TargetSpec, k: int) -> Resolved:
        which, index, sign = self.embedding, spec.index, spec.sign

        def score(output: object) -> torch.Tensor:
            values = select_output(output, which) if which is not None else as_logits(output).flatten(1)
            return sign * _columns(values.float(), index, spec)[:, index]

        return Resolved(spec, str(spec), k, score, None, "output")

    def check_method(self, method: str) -> None:
        """Finer-CAM needs rivals: a class's other classes, a prompt's other prompts, or a contrast's B (a UsageError
        for a target without any: a similarity, an output, a single prompt, the class of a single-class head)."""
        hints = {
            "text": "give other prompts to compare it with: more text: targets, or --labels PROMPTS",
            "class": "the model has a single class",
        }
        for resolved in self.resolved:
            if resolved.finer is None:
                hint = hints.get(resolved.spec.kind, "use it with class:, text: or contrast: targets")
                raise UsageError(
                    f"--method {method} compares a target with its rivals; {resolved.spec} has none ({hint})"
                )

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> SpecTargets:
        """The same targets for every sample of ``output`` (``target``, ``top_k`` and ``chosen`` do not apply)."""
        return SpecTargets(output, self)

    def ranking(self, output: object) -> tuple[torch.Tensor, list[str]] | None:
        """(N, P) probabilities the predictions show, with their names: a classifier's classes, a CLIP model's
        prompts (softmax, SigLIP sigmoid); ``None`` for an embedding model."""
        if self.head is not None:
            return self.head.probabilities(self.head(output).detach().float()), self.prompts
        if self.kind != "classify" or any(spec.kind in ("output", "similar") for spec in self.specs):
            return None
        logits = as_logits(output).detach().float()
        return class_probabilities(logits, self.class_kind), [self.model.class_name(i) for i in range(logits.shape[1])]


class SpecTargets:
    """The explicit targets of one forward pass: target ``k`` is ``score.resolved[k]`` in every sample."""

    def __init__(self, output: object, score: TargetScore) -> None:
        self.output, self.spec_score = output, score
        self.resolved = score.resolved

    @property
    def count(self) -> int:
        return len(self.resolved)

    @property
    def region(self) -> tuple[float, float]:
        return (1.0, 1.0)

    def value(self, k: int) -> torch.Tensor:
        return self.resolved[k].score(self.output).sum()

    def masked(self, k: int) -> MaskedProbability:
        """Score-CAM's weights: the target's score in each masked input's output (a class's shown probability)."""
        resolved = self.resolved[k]
        read = resolved.display or resolved.score
        return lambda output, samples: read(output).float()

    def scored(self, k: int) -> MaskedProbability:
        score = self.resolved[k].score
        return lambda output, samples: score(output).float()

    def original(self, k: int) -> torch.Tensor:
        return self.resolved[k].score(self.output).detach().float()

    def ablated(self, k: int) -> tuple[MaskedProbability, torch.Tensor]:
        return self.scored(k), self.original(k)

    def in_view(self) -> None:
        return None

    def measured(
        self, score: Score, inputs: torch.Tensor, class_name: ClassName
    ) -> tuple[Prediction, Callable[[object], torch.Tensor]]:
        """The first target, its own score (a similarity's cosine; a class's shown probability: docs/targets.md)."""
        resolved = self.resolved[0]
        read = resolved.display or resolved.score
        value = float(read(self.output).detach()[0])
        return Prediction(resolved.index, resolved.name, value, score=resolved.shown), read

    def finer(self, k: int) -> torch.Tensor:
        finer = self.resolved[k].finer
        if finer is None:
            raise UsageError(f"Finer-CAM does not apply to {self.resolved[k].spec}")
        return finer(self.output).sum()

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        ranking = self.spec_score.ranking(self.output)
        values = [(r.display or r.score)(self.output).detach().float().cpu() for r in self.resolved]
        results = []
        for i, size in enumerate(sizes):
            predictions = []
            if ranking is not None:
                probabilities, names = ranking
                top_p, top_i = probabilities[i].topk(min(TOP_PREDICTIONS, probabilities.shape[1]))
                predictions = [Prediction(int(c), names[int(c)], float(p)) for p, c in zip(top_p, top_i, strict=True)]
            explanations = []
            for k, resolved in enumerate(self.resolved):
                chosen = Prediction(resolved.index, resolved.name, float(values[k][i]), score=resolved.shown)
                explanations += explanations_of(cams, i, k, chosen, size)
            results.append(ImageExplanation(predictions, explanations))
        return results


def _rows(output: object) -> int:
    tensor = output if isinstance(output, torch.Tensor) else as_logits(output)
    return int(tensor.shape[0])


def _columns(values: torch.Tensor, index: int, spec: TargetSpec) -> torch.Tensor:
    """``values`` as (N, K), checked to hold column ``index``."""
    if values.dim() != 2 or index >= values.shape[1]:
        shape = "x".join(map(str, values.shape))
        raise UsageError(f"{spec}: the model's output is {shape}; it has no output {index}")
    return values


def explicit_score(
    model: LoadedModel,
    specs: Sequence[TargetSpec],
    device: torch.device,
    target: int | None,
    top_k: int | None,
    methods: Sequence[str],
    score: str | None,
    embedding: str | None,
) -> TargetScore | ClassScore | NoTargetScore:
    """The score of a run with ``--target`` specs, or of a model without a class head: a :class:`TargetScore`, a
    CLIP-style model's prompts (``--labels``) ranked as classes (a :class:`ClassScore` with a prompt head), or, given
    neither, a :class:`~gradcam_cli.cam.untargeted.NoTargetScore` (methods that need no target only). What does not
    fit is a one-line UsageError."""
    if specs and target is not None:
        raise UsageError("--target-class is --target class:NAME; give one of them")
    if specs and top_k is not None:
        raise UsageError("--top-k ranks classes; with --target each target is explained once (repeat --target)")
    if not specs:
        if model.text is not None and model.categories:
            head = PromptHead.encode(model.text, model.categories, device, embedding)
            return ClassScore(score or "cosine", head)
        return NoTargetScore(model, methods, target, top_k)  # rollout and attention need no target; others ask one
    chosen = TargetScore(model, specs, device, score, embedding)
    for method in methods:
        if METHODS[method].needs is FINER_GRADIENT:
            chosen.check_method(method)
    return chosen
