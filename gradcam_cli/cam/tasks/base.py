"""The task adapter protocol: everything that differs between what models do (classify, detect, segment, ...).

An adapter is registered by name in :data:`TASKS` (group ``gradcam_cli.tasks``: a plugin's entry point may name an
adapter object, registered under the entry point's name). The explainer asks each adapter in turn whether it
:meth:`~TaskAdapter.claims` a model (the first that does explains it); from then on every task-specific decision
(the options it takes, its score, its methods, its rows, what the console and the gallery show, what an image
without a target says, how ``gradcam eval`` measures it, which map ``gradcam serve`` shows) is the adapter's.
Nothing outside the adapters compares a task. How to add one: docs/internals.md ("Adding a task").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import UsageError
from ...options import CLASS_SCORE_NAMES, TASK_NAMES, ExplainOptions
from ...registry import TASKS_GROUP, Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ...evaluation.boxes import GroundTruthBox
    from ...models.loading import LoadedModel
    from ...targets import TargetSpec
    from ..results import Explanation, ImageExplanation, Prediction
    from ..scores import Score

Pair = tuple[str | None, list[tuple[float, float, float, float]], list["Explanation"]]
"""``gradcam eval``'s box pairing: (label, the label's boxes, the explanations they are scored against)."""


@dataclass(frozen=True)
class ScoreRequest:
    """What a task's score is built from: the options as given (``None``: not given) and the explainer's context."""

    device: torch.device
    options: ExplainOptions
    target: int | None
    specs: tuple[TargetSpec, ...]
    methods: tuple[str, ...]


class Explained(Protocol):
    """What an adapter reads of an explainer (the :class:`~gradcam_cli.cam.explainer.Explainer`)."""

    model: LoadedModel
    score: Score
    target: int | None
    methods: list[str]

    def explain(self, image: Any, target: int | None = None, top_k: int | None = None) -> ImageExplanation: ...


class TaskAdapter:
    """One task's behaviour; subclass it and override what differs (the defaults are a classifier-like task's).

    ``name``: the registry key (``--task NAME``); ``noun``: what its model is called in messages; ``ranked``: its
    explanations are per detection (``rank`` 1, 2, ...) with a combined map (``rank`` 0), named ``_box<rank>`` and
    ``_boxes`` (a detector's layout: its resumed rows, its video, its serve maps); ``videos``: it explains video
    frames; ``faithfulness``: ``gradcam eval`` runs the whole perturbation protocol (else the boxes only, through
    :meth:`box_pairs`); ``takes_targets``: ``--target`` specs apply; ``aug_smooth``: ``--aug-smooth`` applies."""

    name = ""
    shown = ""
    """The task as records and messages name it (default: :attr:`name`; YOLO's detectors are ``detect``)."""
    noun = "model"
    by_name = True
    """``--task NAME`` names it (YOLO's adapter claims the models whose family names it, whatever ``--task`` says)."""
    listed = "Predictions"
    """What ``gradcam serve``'s page titles the list of an image's predictions."""
    ranked = False
    videos = True
    faithfulness = False
    takes_targets = False
    aug_smooth = False
    answers = False
    """It answers ``--prompt`` questions (:class:`Answering`; found by :func:`answering`)."""
    methods_of = "segment"
    default_layer = "last stage of the backbone"
    """Which layer is explained when none is chosen, as the 'using layer' message says it."""
    """The built-in task whose method list this one takes (:attr:`CamMethod.tasks`), unless :meth:`takes` says."""

    @property
    def label(self) -> str:
        """:attr:`shown`, or the name."""
        return self.shown or self.name

    def claims(self, model: LoadedModel, requested: str | None) -> bool:
        """Whether this adapter explains ``model`` (``requested``: the adapter its profile or ``--task`` names,
        ``None``: none): the one named, else the built-in task's adapter of the model's :class:`Task`."""
        return requested == self.name or (requested is None and model.task.value == self.name)

    def check_options(self, options: ExplainOptions) -> None:
        """A one-line UsageError for an option this task does not take, given at all (``None``: not given)."""
        self.check_own_score(options)
        given = [
            f"{option} {value:g}"
            for option, value in (
                ("--score-threshold", options.score_threshold),
                ("--max-detections", options.max_detections),
            )
            if value is not None
        ]
        if given:
            raise UsageError(f"{given[0]} is for detectors; a {self.noun} has no detections to choose from")

    def check_own_score(self, options: ExplainOptions) -> None:
        """A one-line UsageError for a ``--score`` other than ``logit`` (the default), for a task with its own."""
        if options.score not in (None, "logit"):
            raise UsageError(f"--score {options.score} is for classifiers; a {self.noun} has its own score")

    def score(self, model: LoadedModel, request: ScoreRequest) -> Score:
        """The :class:`~gradcam_cli.cam.scores.Score` this task differentiates."""
        raise NotImplementedError

    def takes(self, method: str, tasks: Sequence[str], module: nn.Module) -> bool:
        """Whether ``method`` (serving the built-in ``tasks``) explains this task's ``module``."""
        return self.methods_of in tasks

    def settings(
        self, model: LoadedModel, score: Score, request: ScoreRequest, perturbation: dict[str, object]
    ) -> dict[str, object]:
        """What this task adds to the run record (its ``task`` first), with the black-box methods' ``perturbation``
        settings."""
        return {"task": self.label, **perturbation}

    def nothing_found(self, model: LoadedModel, score: Score, target: int | None) -> str | None:
        """What a row without a target says (``None``: nothing special, a video's row)."""
        return None

    def located(self, prediction: Prediction) -> str | None:
        """Where a prediction lies, as :meth:`where` and :meth:`how_much` add it: a detection's box (``at [x1, y1,
        x2, y2]``), a segmenter's share of the pixels; ``None``: nothing to add (the default, a combined map's)."""
        return None

    def where(self, prediction: Prediction) -> str:
        """A prediction's line on the console after its name and probability: ``(class 3)``, then :meth:`located`."""
        return _then(f"(class {prediction.index})", self.located(prediction))

    def how_much(self, prediction: Prediction) -> str:
        """How much of a target an output line shows: ``73.1%``, then :meth:`located`."""
        return _then(f"{prediction.probability:.1%}", self.located(prediction))

    def eval_checks(self, sanity: bool, plot: bool, road: bool) -> None:
        """Refuse ``gradcam eval`` options the box measures do not take (tasks without :attr:`faithfulness`)."""
        if sanity:
            raise UsageError(f"--sanity is for classifiers; a {self.noun}'s maps are evaluated against --boxes")
        if plot:
            raise UsageError(f"--plot draws deletion and insertion curves, which a {self.noun} is not measured by")
        if road:
            raise UsageError(f"--road is for classifiers; a {self.noun}'s maps are evaluated against --boxes")

    def box_pairs(
        self, explainer: Explained, image: Any, result: ImageExplanation, boxes: Sequence[GroundTruthBox]
    ) -> tuple[list[Pair], int]:
        """``gradcam eval``'s pairs of ground-truth boxes and explanations for one image, and how many boxes no
        explanation pairs with (default: every box of the image against its first target's maps)."""
        if not result.explanations:
            return [], len(boxes)
        first = result.explanations[0].target.index
        chosen = [e for e in result.explanations if e.target.index == first]
        return [(None, [box.box for box in boxes], chosen)], 0

    def pick(self, explanations: list[Explanation], rank: int) -> Explanation:
        """The explanation ``gradcam serve`` shows for a request of ``rank`` (a ranked task's detection)."""
        if not self.ranked:
            return explanations[0]
        for explanation in explanations:
            if explanation.rank == rank:
                return explanation
        raise UsageError(f"no detection {rank} in this image ({len(explanations) - 1} found)")

    def pass_settings(self, score: Score) -> AbstractContextManager[None]:
        """What the explained pass and its extra passes run under (default: nothing)."""
        return nullcontext()

    def serve_target(self) -> bool:
        """Whether ``gradcam serve`` resolves a class to explain for a request (a ranked task explains them all)."""
        return not self.ranked


def _then(text: str, more: str | None) -> str:
    return f"{text} {more}" if more else text


def label_box_pairs(
    explainer: Explained,
    image: Any,
    result: ImageExplanation,
    boxes: Sequence[GroundTruthBox],
    found: Callable[[Prediction], bool],
) -> tuple[list[Pair], int]:
    """:meth:`TaskAdapter.box_pairs` by label, for tasks whose targets are classes: the boxes of one label scored
    together with the map of the class of that name (any case; a box without a label: the image's first explained
    class); a label that names no class, or a class whose explained target is not ``found`` in the image (predicted
    nowhere, counted none), is undetected."""
    names = [name.lower() for name in explainer.model.categories or []]
    pairs: list[Pair] = []
    undetected = 0
    for label in dict.fromkeys(box.label for box in boxes):
        group = [box.box for box in boxes if box.label == label]
        explained = result
        if label is not None:
            if names.count(label.lower()) != 1:
                undetected += len(group)
                continue
            explained = explainer.explain(image, target=names.index(label.lower()))
        if not explained.explanations or not found(explained.explanations[0].target):
            undetected += len(group)
            continue
        first = explained.explanations[0].target.index
        pairs.append((label, group, [e for e in explained.explanations if e.target.index == first]))
    return pairs, undetected


class Answering(Protocol):
    """What the command line asks of the adapter that answers ``--prompt`` questions (a vision-language model's
    answer: :mod:`.answer`), beside :class:`TaskAdapter`'s members."""

    def refused(self, explain: ExplainOptions) -> list[str]: ...
    def answerer(self, model: Any, explain: ExplainOptions) -> Any: ...
    def layer_note(self, answerer: Any) -> str: ...
    def nothing_found(self, model: Any, score: Any, target: int | None) -> str | None: ...
    def lines(self, record: Any, first: bool) -> list[str]: ...
    def evaluate(
        self, answerer: Any, images: Sequence[Any], question: Any, steps: int, prompts: dict[str, str] | None = None
    ) -> Iterator[dict[str, Any]]: ...


def answering() -> Answering:
    """The registered adapter that answers ``--prompt`` questions (its :attr:`~TaskAdapter.answers`)."""
    for adapter in TASKS.values():
        if adapter.answers:
            chosen: Any = adapter
            return chosen  # type: ignore[no-any-return]
    raise UsageError("no registered task answers a --prompt")


def check_class_score(options: ExplainOptions) -> None:
    """A one-line UsageError for ``--score`` naming no class score (``box`` is YOLO's; ``None``: not given)."""
    if options.score == "box":
        raise UsageError("--score box is for YOLO detectors (--model yolo:...)")
    if options.score is not None and options.score not in CLASS_SCORE_NAMES:
        raise UsageError(f"unknown score {options.score!r} for a class; use {', '.join(CLASS_SCORE_NAMES)}")


def _register_plugin(name: str, loaded: object) -> None:
    if isinstance(loaded, TaskAdapter):
        TASKS.register(name, loaded)


TASKS: Registry[TaskAdapter] = Registry("task", TASKS_GROUP, register_plugin=_register_plugin)
"""Every task adapter by name, the package's first, then plugins'."""


def register_task(adapter: TaskAdapter, *, replace: bool = False) -> TaskAdapter:
    """Register ``adapter`` under its own :attr:`~TaskAdapter.name`."""
    return TASKS.register(adapter.name, adapter, replace=replace)


def task_names() -> list[str]:
    """What ``--task`` takes: the built-in tasks and every registered adapter that may be named
    (:attr:`TaskAdapter.by_name`), plugins' included."""
    return list(dict.fromkeys([*TASK_NAMES, *(name for name, adapter in TASKS.items() if adapter.by_name)]))


def adapter_for(model: LoadedModel, requested: str | None = None) -> TaskAdapter:
    """The first registered adapter that claims ``model``; ``requested`` (``--task``) naming none is a UsageError
    with close matches."""
    for adapter in TASKS.values():
        if adapter.claims(model, requested):
            return adapter
    if requested is not None:
        TASKS[requested]  # an unknown name: the registry's message, with close matches
    raise UsageError(f"no task explains {model.name} ({requested or model.task.value})")
