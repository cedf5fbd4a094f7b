"""The task adapter protocol: everything that differs between what models do (classify, detect, segment, ...).

An adapter is registered by name in :data:`TASKS` (group ``gradcam_cli.tasks``: a plugin's entry point may name an
adapter object, registered under the entry point's name). The explainer asks each adapter in turn whether it
:meth:`~TaskAdapter.claims` a model (the first that does explains it); from then on every task-specific decision
(the options it takes, its score, its methods, its rows, what the console and the gallery show, what an image
without a target says, how ``gradcam eval`` measures it, which map ``gradcam serve`` shows) is the adapter's.
Nothing outside the adapters compares a task. How to add one: docs/internals.md ("Adding a task").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...errors import UsageError
from ...io.naming import video_label
from ...options import CLASS_SCORE_NAMES, TASK_NAMES, EvalOptions, ExplainOptions, OutputOptions
from ...registry import TASKS_GROUP, Registry
from ..layers import DryPasses, LayerInfo, chosen_layers, model_default_layer

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ...io.boxes import GroundTruthBox
    from ...models.loading import LoadedModel
    from ...targets import TargetSpec
    from ..methods.registry import CamMethod
    from ..results import Explanation, ImageExplanation, Prediction
    from ..scores import Score

T = TypeVar("T")

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

    def explain(self, image: Any, target: int | None = None, top_k: int | None = None) -> ImageExplanation: ...


class TaskAdapter:
    """One task's behaviour; subclass it and override what differs (the defaults are a classifier-like task's).

    ``name``: the registry key (``--task NAME``, a model profile's
    :attr:`~gradcam_cli.models.profile.ModelProfile.task`); ``noun``: what its model is called in messages;
    ``ranked``: its explanations are per detection (``rank`` 1, 2, ...) with a combined map (``rank`` 0), named
    ``_box<rank>`` and ``_boxes`` (:class:`~gradcam_cli.cam.tasks.detect.DetectTask` overrides the methods that
    lay such explanations out: videos, serve's maps, and sets :attr:`combined_tail` for ``--skip-existing``; read
    only by this class's methods); ``videos``: it explains video frames;
    ``faithfulness``: ``gradcam eval`` runs the whole perturbation protocol (else the boxes only, through
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
    box_faithfulness = False
    """``gradcam eval`` measures each explained detection's own faithfulness, ``--boxes`` optional (a detector's:
    :mod:`gradcam_cli.evaluation.detections`); read by :meth:`boxed_only`."""
    takes_targets = False
    aug_smooth = False
    methods_of = "segment"
    """The built-in task whose method list this one takes (:attr:`CamMethod.tasks`), unless :meth:`takes` says."""
    default_layer = "last spatial layer"
    """Which layer is explained when none is chosen, as the 'using layer' message says it."""
    declared_layer = "the feature maps entering the head"
    """What the layers a model declares its default (``ModelProfile.default_layers``: a YOLO detector's head inputs)
    are, as the 'using layer' message says it."""
    layer_scopes: tuple[str, ...] = ()
    """Where its model's default layer is looked for first, in turn (a detector's or segmenter's backbone:
    :data:`gradcam_cli.models.tasks.LAYER_SCOPES`); empty: the whole model
    (:func:`~gradcam_cli.cam.layers.default_layer`)."""
    tokens = True
    """Its model's 3-D (N, L, C) layer outputs may be token sequences on a patch grid, as a classifier's may
    (:func:`~gradcam_cli.cam.layers.reads_tokens`); a detector head's (N, anchors, classes) have no grid."""
    nothing = "no target"
    """What ``gradcam diff`` says of a map that became empty (``no detection``, ``only the background``)."""
    scans = False
    """It explains scans (:mod:`gradcam_cli.pipeline.volumes`, docs/volumes.md); a volume model of another task is
    refused in one line."""
    whole_scans = False
    """Its scans are explained as whole volumes, resized as the model's profile says
    (:func:`~gradcam_cli.cam.whole_volume.explain_classified`: a classifier's), not window by window with a class's
    region (``--target region:``) allowed (a segmenter's)."""
    combined_tail: str | None = None
    """Where its explanations of an image are one per detection with a map combining them (``rank`` 0), written
    after them: that map's name tail (``boxes``: ``<stem>_<method>_boxes``), by which ``--skip-existing`` finds an
    image done (:mod:`gradcam_cli.pipeline.detection_resume`); ``None``: each target's own files."""
    """What ``gradcam diff`` says of a map that became empty (``no detection``, ``only the background``)."""

    @property
    def label(self) -> str:
        """:attr:`shown`, or the name."""
        return self.shown or self.name

    def claims(self, model: LoadedModel) -> bool:
        """Whether this adapter explains ``model``: the one its profile names
        (:attr:`~gradcam_cli.models.profile.ModelProfile.task`, which ``--task`` sets)."""
        return model.task == self.name

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

    def eval_checks(self, sanity: bool, plot: bool, road: bool, correlation: bool = False, *more: str) -> None:
        """Refuse ``gradcam eval`` options the box measures do not take (tasks without :attr:`faithfulness`);
        ``more``: further classifier-only options given (``--arcc``, ...)."""
        how = "per detection, in its own box" if self.box_faithfulness else "against --boxes"
        if sanity:
            raise UsageError(f"--sanity is for classifiers; a {self.noun}'s maps are evaluated {how}")
        if plot:
            raise UsageError(f"--plot draws a classifier's deletion and insertion curves, not a {self.noun}'s")
        if road:
            raise UsageError(f"--road is for classifiers; a {self.noun}'s maps are evaluated {how}")
        if correlation:
            raise UsageError(f"--faithfulness-correlation is for classifiers; a {self.noun}'s maps are evaluated {how}")
        for flag in more:
            raise UsageError(f"{flag} is for classifiers; a {self.noun}'s maps are evaluated {how}")

    def boxed_only(self, given: bool) -> bool:
        """Whether ``gradcam eval``'s box measures (tasks without :attr:`faithfulness`) score only the images that
        have boxes (``given``: ``--boxes`` was given): a detector measures every image's detections, boxes or not;
        another task without ``--boxes`` is refused in one line."""
        if self.box_faithfulness:
            return False
        if not given:
            raise UsageError(f"gradcam eval of a {self.noun} needs --boxes: it measures where its maps point")
        return True

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

    def dry_pass(self, passes: DryPasses, model: LoadedModel, device: torch.device) -> list[LayerInfo]:
        """The layers of ``model`` the explainer chooses from, with their output shapes: its dry pass on ``device``
        (:class:`~gradcam_cli.cam.layers.DryPasses`, made once and kept)."""
        return passes.get(model, device, self.tokens)

    def chosen_layers(self, model: LoadedModel, infos: list[LayerInfo], names: list[str], tokens: bool) -> list[str]:
        """The layers explained: ``names`` once :func:`~gradcam_cli.cam.layers.check_layers` accepts them, else
        the default layer (:meth:`default_layer_of`)."""
        return chosen_layers(model, infos, names, tokens, self.layer_scopes)

    def default_layer_of(self, model: LoadedModel, infos: list[LayerInfo]) -> str:
        """The layer explained when none is chosen (:func:`~gradcam_cli.cam.layers.model_default_layer`, looking in
        :attr:`layer_scopes` first)."""
        return model_default_layer(model, infos, self.layer_scopes)

    def check_outputs(self, output: OutputOptions) -> None:
        """A one-line UsageError for an output option this task's maps do not make (default: none)."""

    def video_labels(self, target: int | None, top_k: int, class_name: Callable[[int], str]) -> list[str]:
        """The label of each video a clip makes per method, in order: one per explained class (``target``, else
        the top ``top_k``)."""
        name = class_name(target) if target is not None else ""
        return [video_label(rank + 1, target, name) for rank in range(1 if target is not None else top_k)]

    def frame_maps(self, result: ImageExplanation) -> list[tuple[Explanation, bool]]:
        """The maps of a video frame's ``result``, one per video (:meth:`video_labels`, in each method's order), each
        with whether what it explains is drawn on the frame (:func:`gradcam_cli.render.overlay.mark`; default: no)."""
        return [(explanation, False) for explanation in result.explanations]

    def kept_maps(self, result: ImageExplanation, shown: Explanation) -> list[Explanation]:
        """The maps of ``result`` ``gradcam serve`` keeps beside the one ``shown`` (a detector's other detections:
        one pass made them all)."""
        return []

    def serve_facts(self) -> dict[str, Any]:
        """What ``gradcam serve``'s page is told of the task: its name, its maps' layout (``ranked``: per detection,
        with the combined map: ``per_detection``), the title of its predictions and whether deletion and insertion
        measure it (``curves``)."""
        return {"task": self.label, "per_detection": self.ranked, "listed": self.listed, "curves": self.faithfulness}

    def check_curves(self) -> None:
        """A one-line UsageError where deletion, insertion and ROAD do not measure this task's maps (as in
        ``gradcam eval``: a task measured by its boxes)."""
        if not self.faithfulness:
            raise UsageError(
                f"deletion, insertion and ROAD are for classifiers (as in gradcam eval), not a {self.noun}"
            )

    def evaluation(
        self, protocol: Callable[[], T], boxes: Callable[[], T], answers: Callable[[], T] | None = None
    ) -> T:
        """``gradcam eval``'s evaluator of this task, made by ``protocol`` (deletion, insertion, sanity, ROAD,
        stability: a classifier's) or by ``boxes`` (its maps against ground-truth boxes, paired by
        :meth:`box_pairs`); ``answers``: a prompted image's (deletion and insertion of an answer, the answer task's
        own)."""
        return protocol() if self.faithfulness else boxes()

    def rank_options(self, options: EvalOptions, targeted: bool = False) -> EvalOptions:
        """The options ``gradcam eval --rank`` measures this task with: those given, and for a task with
        :attr:`faithfulness` the sanity checks, ROAD, faithfulness correlation and, unless ``targeted`` (a
        ``--target``: stability measures a class's map), stability; a task measured by its boxes adds none (what
        was given stays, for :meth:`eval_checks` to refuse)."""
        if not self.faithfulness:
            return options
        stability = options.stability or not targeted
        return replace(options, sanity=True, road=True, correlation=True, stability=stability)

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

    def method(self, name: str) -> CamMethod[Any]:
        """The method ``--method name`` runs on this task's models: the registry's (default), or the task's own of
        that name (a DETR's ``attention``: its queries' cross-attention)."""
        from ..methods import METHODS

        return METHODS[name]

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


def adapter_for(model: LoadedModel) -> TaskAdapter:
    """The first registered adapter that claims ``model``; a task naming none is a UsageError with close
    matches."""
    for adapter in TASKS.values():
        if adapter.claims(model):
            return adapter
    TASKS[model.task]  # an unknown name: the registry's message, with close matches
    raise UsageError(f"no task explains {model.name} ({model.task})")


def nothing_of(task: object) -> str:
    """What ``gradcam diff`` says of a map that became empty in a run of ``task`` (as its rows' provenance names
    it: :attr:`TaskAdapter.label`): the adapter's :attr:`~TaskAdapter.nothing`, else ``no target``."""
    for adapter in TASKS.values():
        if adapter.label == task:
            return adapter.nothing
    return TaskAdapter.nothing
