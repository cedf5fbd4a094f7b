"""What the explainer differentiates: one score per target, read from a forward pass, for every task.

A :class:`Score` reads the output of the hooked forward pass and chooses the targets in it (classes, detections);
the :class:`Targets` it returns give, for target ``k``, the scalar whose gradient the CAM methods use: the sum over
the batch of each sample's ``k``-th target's score (the samples of a batch are independent, so one backward pass
serves them all). Score-CAM's masked inputs need a probability instead: :meth:`Targets.masked` reads it from the
output of a masked batch. :meth:`Targets.results` turns the coarse maps into each image's
:class:`~gradcam_cli.cam.results.ImageExplanation`.

- Classifiers (:class:`ClassScore`): class c's logit (``--score logit``, the default), its softmax probability or
  its sigmoid (multi-label heads); probabilities shown are softmax, or sigmoid with ``--score sigmoid``. A CLIP-style
  model with prompts (``--labels``) is a classifier whose classes are the prompts, through its
  :class:`~gradcam_cli.cam.embeddings.PromptHead` (its scores also take ``cosine``, there the default).
- Explicit ``--target`` specs (similarity, text prompts, contrasts, outputs; :mod:`gradcam_cli.cam.targets`).
- Detectors (:mod:`gradcam_cli.cam.detection`): the score of one detection, and the sum of all of them.
- Segmenters (:mod:`gradcam_cli.cam.segmentation`): the sum of class c's logits over the pixels predicted as c.

What every task's targets share is here too: :func:`chosen_channels` (``--target-class``, range-checked, or each
sample's top ``--top-k``), :func:`explanations_of` (one sample's maps of one target, for every method) and
:class:`ChannelTargets` (targets that are channels of an (N, C) score: a classifier's, a plugin's dense output's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from ..errors import UsageError
from .finer import finer_scores
from .logits import as_logits
from .maps import Region, to_image_maps
from .methods import METHODS
from .results import TOP_PREDICTIONS, Explanation, ImageExplanation, Prediction

if TYPE_CHECKING:
    from .embeddings import PromptHead

MaskedProbability = Callable[[object, torch.Tensor], torch.Tensor]
"""``(output for masked inputs, the sample each came from)`` -> (B,) probability of that sample's target."""
ClassName = Callable[[int], str]
"""A class's name from its index (:meth:`gradcam_cli.models.loading.LoadedModel.class_name`)."""
Cams = dict[str, list[list[torch.Tensor]]]
"""``cams[method][k][l]``: the coarse (N, h, w) map of target ``k`` at layer ``l``."""


class Targets(Protocol):
    """The targets chosen in one forward pass, and their scores."""

    @property
    def count(self) -> int:
        """Targets per sample (the most any sample has)."""

    @property
    def region(self) -> Region:
        """The part of the layer's maps that shows the input (:data:`~gradcam_cli.cam.maps.Region`): all of it,
        except in a detector's padded batch."""

    def value(self, k: int) -> torch.Tensor | None:
        """The differentiable sum of every sample's ``k``-th target's score; ``None``: no sample has one."""

    def masked(self, k: int) -> MaskedProbability:
        """How Score-CAM reads target ``k``'s probability from the output of a masked batch."""

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        """Each sample's predictions and maps, upsampled to its entry of ``sizes``."""


@runtime_checkable
class Rescorable(Protocol):
    """Targets whose score another pass's output can be read for (AblationCAM), and which Finer-CAM contrasts with
    their nearest classes (classifiers' and explicit targets)."""

    def scored(self, k: int) -> MaskedProbability:
        """How target ``k``'s score, the value differentiated, is read per sample from another output."""

    def original(self, k: int) -> torch.Tensor:
        """(N,) target ``k``'s score in this pass, detached."""

    def finer(self, k: int) -> torch.Tensor:
        """The differentiable sum over the batch of target ``k``'s Finer-CAM score (:mod:`gradcam_cli.cam.finer`)."""


@runtime_checkable
class Ablatable(Protocol):
    """Targets whose score AblationCAM reads from its ablated passes (a classifier's, explicit targets, a YOLO
    detection's at its anchor)."""

    def ablated(self, k: int) -> tuple[MaskedProbability, torch.Tensor]:
        """How target ``k``'s score is read per sample from another output, and (N,) its score in this pass."""


@runtime_checkable
class Viewed(Protocol):
    """Targets that another view of the same inputs (``--aug-smooth``'s flipped and rescaled copies) explains."""

    def in_view(self) -> torch.Tensor | None:
        """What fixes the targets in another view, and in the passes that rescore this one's (the masked passes):
        a classifier's (N, K) chosen classes; ``None``: they are chosen again (explicit targets, the same in every
        view)."""


@runtime_checkable
class Classified(Protocol):
    """A classifier's chosen classes (:meth:`~gradcam_cli.cam.explainer.Explainer.compute`'s)."""

    def classes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, classes) probabilities and (N, K) chosen classes."""


@runtime_checkable
class Measured(Protocol):
    """Targets ``gradcam eval``'s deletion and insertion measure (a classifier's classes, explicit targets)."""

    def measured(
        self, score: Score, inputs: torch.Tensor, class_name: ClassName
    ) -> tuple[Prediction, Callable[[object], torch.Tensor]]:
        """The first sample's first target (``score`` chose these targets for ``inputs``), and how its probability
        (or its own score: a similarity's cosine) is read from the model's output for perturbed copies."""


@runtime_checkable
class Refound(Protocol):
    """Targets another pass finds again one by one (a detector's detections, by the matching rule of
    :mod:`gradcam_cli.cam.detection`): ``gradcam eval``'s deletion and insertion per detection."""

    def refound(self, n: int, output: object) -> torch.Tensor:
        """(B, K): in each of the B images of ``output`` (the model's output for perturbed copies of sample ``n``),
        the score of each of sample ``n``'s K explained targets found again, 0 where it is not found."""


class Score(Protocol):
    """Reads a model's output for one task: chooses targets and scores them."""

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> Targets:
        """The targets of ``output`` (the model's output for ``inputs``): ``target`` fixes the class, else each
        sample's own top ``top_k``; ``chosen`` (classifiers, ``--aug-smooth``'s views) fixes the targets."""


def sum_or_none(terms: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The sum of scalar ``terms``, or ``None`` when there are none (no backward pass then)."""
    return torch.stack(list(terms)).sum() if terms else None


def class_probabilities(logits: torch.Tensor, kind: str) -> torch.Tensor:
    """The probabilities shown for classifier logits: sigmoid for ``--score sigmoid``, softmax otherwise."""
    return logits.sigmoid() if kind == "sigmoid" else logits.softmax(dim=1)


def class_scores(logits: torch.Tensor, kind: str, head: PromptHead | None = None) -> torch.Tensor:
    """What is differentiated for each class: the logits, their softmax or sigmoid, ReST (``rest``: the logit plus
    the log softmax probability), or (a prompt head's) the cosines behind them."""
    if kind == "logit":
        return logits
    if kind == "rest":  # ReST (Cai 2025; pytorch-grad-cam's ClassifierOutputReST): y_c - CE(y, c) = y_c + log s_c
        return logits + logits.log_softmax(dim=1)
    if kind == "cosine" and head is not None:
        return head.as_cosines(logits)
    return class_probabilities(logits, kind)


def shown_probabilities(logits: torch.Tensor, kind: str, head: PromptHead | None = None) -> torch.Tensor:
    """The probabilities shown: :func:`class_probabilities`, or a prompt head's own (softmax over the prompts,
    sigmoid for SigLIP) unless ``--score softmax`` or ``sigmoid`` says which."""
    if head is not None and kind not in ("softmax", "sigmoid"):
        return head.probabilities(logits)
    return class_probabilities(logits, kind)


@dataclass(frozen=True)
class ClassScore:
    """A classifier's score for class c: its ``logit`` (default), ``softmax`` probability or ``sigmoid``; with a
    prompt ``head`` (a CLIP-style model), prompt c's, and also its ``cosine``."""

    kind: str = "logit"
    head: PromptHead | None = None

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> ClassTargets:
        logits = self.head(output) if self.head is not None else as_logits(output)
        if chosen is None:
            chosen = chosen_channels(logits, target, top_k)
        return ClassTargets(logits, chosen, self.kind, self.head)


def chosen_channels(
    ranked: torch.Tensor, target: int | None, top_k: int, noun: str = "class", nouns: str = "classes"
) -> torch.Tensor:
    """(N, K) the channels explained in each sample of ``ranked``, (N, channels) values (a classifier's logits, a
    dense output's per-channel scores): ``target`` in every sample, else each sample's ``top_k`` highest, highest
    first. A ``target`` out of range, or a ``top_k`` beyond the channels, is a one-line UsageError naming the
    channels as ``noun`` and ``nouns`` (a class, classes)."""
    channels = ranked.shape[1]
    if target is not None:
        if not 0 <= target < channels:
            raise UsageError(f"target {noun} {target} is out of range: the model has {channels} {nouns}")
        return torch.full((ranked.shape[0], 1), target, dtype=torch.long, device=ranked.device)
    if not 1 <= top_k <= channels:
        raise UsageError(f"--top-k must be between 1 and {channels}")
    return ranked.detach().topk(top_k, dim=1).indices


def explanations_of(
    cams: Cams,
    n: int,
    k: int,
    target: Prediction,
    size: Sequence[int],
    region: Region = (1.0, 1.0),
    *,
    rank: int | None = None,
    mask: torch.Tensor | None = None,
) -> list[Explanation]:
    """Sample ``n``'s explanations of target ``k``, one per method of ``cams`` (in its order): the sample's maps of
    every layer stretched over an image of ``size`` = (H, W) and fused as the method fuses them (:func:`method_maps`;
    ``region``: the part of the maps that shows the image), each explaining ``target`` (a detection's ``rank``, a
    segmenter's ``mask``: the :class:`~gradcam_cli.cam.results.Explanation`'s ``rank`` and ``region``)."""
    return [
        Explanation(method, target, _fused(method, per_k[k], n, size, region), rank=rank, region=mask)
        for method, per_k in cams.items()
    ]


def _fused(method: str, layers: Sequence[torch.Tensor], n: int, size: Sequence[int], region: Region) -> torch.Tensor:
    return method_maps(method, [cam[n : n + 1] for cam in layers], size, region)[0]


def method_maps(
    method: str, layers: Sequence[torch.Tensor], size: Sequence[int], region: Region = (1.0, 1.0)
) -> torch.Tensor:
    """``method``'s coarse maps of each layer (``cams[method][k]``) as one map per sample at ``size``:
    :func:`~gradcam_cli.cam.maps.to_image_maps` with the method's own fusion of several layers (its
    :attr:`~gradcam_cli.cam.methods.registry.CamMethod.fusion`: RefineCAM's product, every other's mean)."""
    return to_image_maps(layers, size, region, METHODS[method].fusion)


class ChannelTargets:
    """Targets that are channels of a differentiable (N, channels) ``scores`` (one score per channel: a class, a
    dense output's counted class or keypoint): each sample's ``chosen`` channels, (N, K) (:func:`chosen_channels`).
    A task's targets subclass it, add :meth:`~Targets.masked` (reading another pass's values with :meth:`entry`)
    and say what a channel's :meth:`prediction` shows."""

    def __init__(self, scores: torch.Tensor, chosen: torch.Tensor) -> None:
        self.scores, self.chosen = scores, chosen

    @property
    def count(self) -> int:
        return int(self.chosen.shape[1])

    @property
    def region(self) -> tuple[float, float]:
        return (1.0, 1.0)

    def value(self, k: int) -> torch.Tensor:
        return self.scores.gather(1, self.chosen[:, k : k + 1]).sum()

    def entry(self, values: torch.Tensor, k: int, samples: torch.Tensor) -> torch.Tensor:
        """(B,) target ``k``'s entry of another pass's (B, channels) ``values``, row j that of sample ``samples[j]``."""
        return values.gather(1, self.chosen[samples, k].unsqueeze(1)).squeeze(1)

    def prediction(self, n: int, c: int, size: tuple[int, ...], class_name: ClassName) -> Prediction:
        """Sample ``n``'s prediction of channel ``c``, its image of ``size`` = (H, W) (default: the score as its
        probability)."""
        return Prediction(c, class_name(c), float(self.scores[n, c].detach()))

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        """Each sample's :meth:`prediction` of every channel, highest score first, and the maps of its chosen
        ones (:func:`explanations_of`)."""
        scores = self.scores.detach()
        results = []
        for n, size in enumerate(sizes):
            explanations = []
            for k in range(self.count):
                explanations += explanations_of(
                    cams, n, k, self.prediction(n, int(self.chosen[n, k]), size, class_name), size
                )
            order = scores[n].argsort(descending=True).tolist()
            results.append(ImageExplanation([self.prediction(n, c, size, class_name) for c in order], explanations))
        return results


class ClassTargets(ChannelTargets):
    """A classifier's (N, K) target classes in its (N, classes) ``logits`` (a prompt ``head``'s, for CLIP)."""

    def __init__(self, logits: torch.Tensor, targets: torch.Tensor, kind: str, head: PromptHead | None = None) -> None:
        super().__init__(logits, targets)
        self.logits, self.targets, self.kind, self.head = logits, targets, kind, head

    @property
    def probabilities(self) -> torch.Tensor:
        """(N, classes) probabilities: softmax, or sigmoid with ``--score sigmoid`` (a prompt head's own)."""
        return shown_probabilities(self.logits.detach().float(), self.kind, self.head)

    def value(self, k: int) -> torch.Tensor:
        return class_scores(self.logits, self.kind, self.head).gather(1, self.targets[:, k : k + 1]).sum()

    def _logits(self, output: object) -> torch.Tensor:
        return (self.head(output) if self.head is not None else as_logits(output)).float()

    def masked(self, k: int) -> MaskedProbability:
        def probability(output: object, samples: torch.Tensor) -> torch.Tensor:
            return self.entry(shown_probabilities(self._logits(output), self.kind, self.head), k, samples)

        return probability

    def scored(self, k: int) -> MaskedProbability:
        """How AblationCAM reads target ``k``'s score, the value differentiated (logit, softmax or sigmoid), per
        sample from another output."""

        def score(output: object, samples: torch.Tensor) -> torch.Tensor:
            return self.entry(class_scores(self._logits(output), self.kind, self.head), k, samples)

        return score

    def original(self, k: int) -> torch.Tensor:
        values = class_scores(self.logits.detach().float(), self.kind, self.head)
        return values.gather(1, self.targets[:, k : k + 1]).squeeze(1)

    def ablated(self, k: int) -> tuple[MaskedProbability, torch.Tensor]:
        return self.scored(k), self.original(k)

    def in_view(self) -> torch.Tensor:
        return self.targets

    def classes(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.probabilities, self.targets

    def measured(
        self, score: Score, inputs: torch.Tensor, class_name: ClassName
    ) -> tuple[Prediction, Callable[[object], torch.Tensor]]:
        """The first sample's first class, its probability read as ``score`` reads it (softmax; sigmoid with
        ``--score sigmoid``)."""
        index = int(self.targets[0, 0])

        def probability(output: object) -> torch.Tensor:
            chosen = score.targets(output, inputs, index, 1)
            assert isinstance(chosen, Classified)
            return chosen.classes()[0][:, index]

        return Prediction(index, class_name(index), float(self.probabilities[0, index])), probability

    def finer(self, k: int) -> torch.Tensor:
        return finer_scores(self.logits, self.targets[:, k]).sum()

    def results(self, cams: Cams, sizes: Sequence[tuple[int, ...]], class_name: ClassName) -> list[ImageExplanation]:
        probabilities, targets = self.probabilities, self.targets
        top_p, top_i = probabilities.topk(min(TOP_PREDICTIONS, probabilities.shape[1]), dim=1)
        results = []
        for i, size in enumerate(sizes):
            predictions = [
                Prediction(int(c), class_name(int(c)), float(p)) for p, c in zip(top_p[i], top_i[i], strict=True)
            ]
            explanations = []
            for k in range(targets.shape[1]):
                index = int(targets[i, k])
                chosen = Prediction(index, class_name(index), float(probabilities[i, index]))
                explanations += explanations_of(cams, i, k, chosen, size)
            results.append(ImageExplanation(predictions, explanations))
        return results
