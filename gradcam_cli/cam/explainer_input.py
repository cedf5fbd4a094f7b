"""What an :class:`~gradcam_cli.cam.explainer.Explainer` is built from: its :class:`ExplainOptions`, given whole or
as keywords (:class:`ExplainKeywords`, :func:`explain_options`: one path either way), and the model it explains, a
:class:`LoadedModel` or a bare module (:func:`explained_model`); what its options came to for that model
(:class:`Chosen`), and what one call passes with (:class:`CallContext`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from torch import nn

from ..models.loading import LoadedModel
from ..models.tasks import parse_task, task_facts
from ..options import DEFAULT_METHOD, TASK_NAMES, ExplainOptions, PerturbationOptions
from ..targets import TargetSpec
from .engine import LayerCapture
from .layers import LayerInfo, stage_layers
from .masked_scores import ProgressCallback
from .methods.registry import CamMethod, stages_of

CaptureFactory = Callable[[nn.Module, Mapping[str, nn.Module]], LayerCapture]
"""What hooks the layers for one pass: :class:`LayerCapture` itself, or another kind of capture."""


@dataclass(frozen=True)
class Chosen:
    """What an explainer's options came to for its model, found once when it is built (the options themselves stay
    as given: ``explainer.options``): the methods (``all`` expanded; ``left_out``: those ``all`` dropped for a model
    they cannot read, ``need_target``: for lack of a target, :mod:`gradcam_cli.cam.untargeted`), the layers explained
    (the default layer where none was given; none where no method reads a layer), the class explained in every image
    (a name found as an index; ``None``: each image's top ``top_k``) and the forward pass's precision."""

    methods: tuple[str, ...]
    left_out: tuple[str, ...]
    need_target: tuple[str, ...]
    layers: tuple[str, ...]
    target: int | None
    top_k: int
    precision: str

    @property
    def layer_label(self) -> str:
        """The layers' names joined with ``+``, as records and reports show them."""
        return "+".join(self.layers)


@dataclass(frozen=True)
class CallContext:
    """What one call of an explainer passes with, given to the call (an explainer is never changed): ``capture``,
    what hooks the layers for each pass (``gradcam serve``'s replays a kept pass:
    :class:`~gradcam_cli.serve.replay.ReplayFactory`), and ``progress``, called as ``progress(done, total)`` during
    the masked and ablated forward passes (``gradcam serve``'s stops a request past its deadline)."""

    capture: CaptureFactory = LayerCapture
    progress: ProgressCallback | None = None


class ExplainKeywords(TypedDict, total=False):
    """:class:`ExplainOptions` as :class:`Explainer`'s keywords (a notebook's ``Explainer(model, "layer4",
    target=281)``): ``layers`` and ``target`` are its ``layers`` and ``target_class``; ``targets`` may be strings."""

    layers: str | Sequence[str] | None
    target: int | str | None
    top_k: int | None
    aug_smooth: bool
    eigen_smooth: bool
    score_batch_size: int
    score: str | None
    score_threshold: float | None
    max_detections: int | None
    targets: Sequence[TargetSpec | str]
    embedding: str | None
    perturbation: PerturbationOptions | None
    attention_heads: str | None
    region: Path | str | None


def explain_options(
    first: ExplainOptions | str | Sequence[str] | None, methods: str | Sequence[str] | None, keywords: ExplainKeywords
) -> ExplainOptions:
    """The :class:`ExplainOptions` an :class:`Explainer` is built with: ``first`` itself, or built from the layers
    ``first`` (or ``keywords["layers"]``), ``methods`` and the other ``keywords``."""
    if isinstance(first, ExplainOptions):
        if methods is not None or keywords:
            raise TypeError("Explainer takes ExplainOptions or their keywords, not both")
        return first
    given: dict[str, Any] = dict(keywords)
    layers = given.pop("layers", None) if first is None else first
    methods = methods if methods is not None else DEFAULT_METHOD
    if "target" in given:
        given["target_class"] = given.pop("target")
    if "targets" in given:
        given["targets"] = tuple(TargetSpec.parse(spec) for spec in given["targets"])
    if given.get("region") is not None:
        given["region"] = Path(given["region"])
    if given.get("perturbation", 0) is None:
        given.pop("perturbation")
    return ExplainOptions(
        layers=(layers,) if isinstance(layers, str) else tuple(layers or ()),
        methods=(methods,) if isinstance(methods, str) else tuple(methods),
        **given,
    )


def explained_model(
    model: LoadedModel | nn.Module, task: str | None, options: ExplainOptions
) -> tuple[LoadedModel, bool]:
    """The model explained, its profile naming the task asked for (a plugin task's name too; a built-in task
    replaces a built-in task only, not the adapter a profile names, a YOLO detector's or a plugin's), and whether
    its task is still to be found from its output in the dry pass
    (:meth:`~gradcam_cli.models.profile.LoadedModel.with_task_shown`): a bare module given no ``task`` and taken
    for a classifier until then (one with a detection transform is a detector)."""
    bare = isinstance(model, nn.Module)
    unshown = bare and task is None
    if isinstance(model, nn.Module):
        model = LoadedModel.of_module(model)
        task = options.task_for(task)
    if task is not None and task not in TASK_NAMES:  # the caller's LoadedModel is left as it is: this copy says it
        model = model.with_profile(task=task)
    elif task is not None and model.task in TASK_NAMES:
        model = model.with_profile(**task_facts(parse_task(task)))
    if bare:
        model = model.with_detector_input()
    return model, unshown and not model.profile.detector


def layer_names(
    choose: Callable[[], list[str]],
    module: nn.Module,
    infos: list[LayerInfo],
    names: list[str],
    methods: Sequence[str],
    method_of: Callable[[str], CamMethod[Any]],
) -> tuple[str, ...]:
    """The layers an explainer explains: ``names``, else the default layer (both as ``choose`` gives them: its task
    adapter's ``chosen_layers``); from one, the model's last stages ending at it where the methods reading layers
    read those (RefineCAM alone: :func:`~gradcam_cli.cam.methods.registry.stages_of`,
    :func:`~gradcam_cli.cam.layers.stage_layers`); none where no method reads a layer (``method_of``: the task
    adapter's registration of each method name)."""
    if not names and not any(method_of(method).uses_layer for method in methods):
        return ()
    return stage_layers(module, infos, choose(), stages_of(methods))
