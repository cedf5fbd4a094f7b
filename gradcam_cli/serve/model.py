"""The model behind the explorer: loaded once, every use of it serialised by one lock.

:class:`ModelService` answers the page's questions about an image with the library's own code: predictions and
maps from an :class:`~gradcam_cli.cam.explainer.Explainer` (one per layer and method, built on first use), the
layer list from :func:`~gradcam_cli.cam.layers.inspect_layers` (through ``dry_pass``), class names matched as
``--target-class`` matches them, and faithfulness figures from ``gradcam eval``'s
:class:`~gradcam_cli.evaluation.evaluate.Evaluator`. Each request's passes hook the layers with a
:class:`~gradcam_cli.serve.replay.ReplayFactory` (its call's :class:`~gradcam_cli.cam.explainer_input.CallContext`;
the explainers kept are never changed), so that another class of an image already explained at a layer
costs one backward pass and no forward pass (:class:`~gradcam_cli.serve.replay.RetainedPasses` bounds what is kept).
Every model is served by this one class, a vision-language model too: asked questions about an image instead, with
the same explainers, lock, thread and maps (:class:`~gradcam_cli.serve.answers.Answers` keeps its answers).

One lock (``model_lock``) serialises every pass: hooks, retained graphs and the model's mode flags are never shared
by two requests at once, and a request that fails leaves the model as the engine restores it. The app runs the
passes on one thread of their own (:meth:`ModelService.run`): PyTorch's CPU thread pool belongs to the thread that
calls it, and one thread keeps one warm pool (a pool of threads changing from request to request costs about a
third more per map on a 2-core machine).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from ..cam.attention.discovery import reads_attention
from ..cam.explainer import Explainer
from ..cam.explainer_input import CallContext
from ..cam.layers import DryPasses, LayerInfo
from ..cam.methods import METHODS
from ..cam.methods.needs import ATTENTION_NEEDS
from ..cam.targets import model_kind
from ..errors import UsageError, suggest
from ..models.families import family_of
from ..models.labels import resolve_target
from ..models.loading import LoadedModel, load_for_run
from ..options import EvalOptions, ExplainOptions, ModelOptions
from ..targets import TargetSpec
from .answers import Answers
from .http import HttpError
from .images import DecodedImage, Source
from .maps import MapAnswer, MapStore, StoredMap, map_id, prediction_dict
from .replay import RETAINED_PASSES, ReplayFactory, RetainedPasses

T = TypeVar("T")
FAITHFULNESS_STEPS = 20
"""Points on the deletion and insertion curves the page asks for (``gradcam eval --steps``)."""
MAX_EXPLAINERS = 16
"""Explainers kept (one per layer, method and target; each holds only names, settings and a target's reference)."""


class ModelService:
    """One loaded model, explained on request; ``options`` are the run's (or the command's) explain options: their
    ``targets`` are the page's default targets (the first is explained when a request names none). A
    vision-language model (its family :attr:`~gradcam_cli.models.families.base.Family.answers`) is loaded as
    ``--prompt`` loads it, and asked questions instead (:attr:`answers`)."""

    def __init__(
        self, model: LoadedModel | ModelOptions, options: ExplainOptions | None = None, retained: int = RETAINED_PASSES
    ) -> None:
        options = options or ExplainOptions()
        self.options = options
        self.targets = options.targets
        if isinstance(model, ModelOptions):  # loaded here: an embedding model without a target has no explainer yet
            model = _load(model, options)
        self.kind = model_kind(model)
        embeds = model.embeds and model.text is None  # an embedding model: output:0 of any
        first = self.targets[:1] or ((TargetSpec("output"),) if embeds else ())
        self.dry_passes = DryPasses()
        """The model's one dry pass, which every explainer the service builds reads (:class:`DryPasses`)."""
        base = Explainer.from_options(
            model,
            self._options(options.layers, options.methods, first[0] if first else None),
            dry_passes=self.dry_passes,
        )
        self.model = base.model
        self.adapter = base.adapter
        self.device = base.device
        self.default_layer = base.layer_label
        self.default_method = base.chosen.methods[0]
        self.model_lock = threading.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gradcam-model")
        self.passes = RetainedPasses(retained)
        self.maps = MapStore()
        self._explainers: dict[tuple[str, str, str], Explainer] = {
            (base.layer_label, base.chosen.methods[0], str(first[0]) if first else ""): base
        }
        self.layers = self._layers(self.adapter.dry_pass(self.dry_passes, self.model, self.device))
        attends = reads_attention(self.model)  # the attention methods only for a model they can read
        self.methods = [
            name
            for name, m in METHODS.items()
            if self.adapter.takes(name, m.tasks, self.model.module)
            and (attends or self.adapter.method(name).needs not in ATTENTION_NEEDS)  # a task's own: a DETR's attention
        ]
        self.answers = Answers.of(self, base)
        """A vision-language model's answers (:mod:`gradcam_cli.serve.answers`); ``None``: an image model's."""
        for spec in self.targets[1:]:  # every default target checked now (and its explainer kept), as a run's
            self.explainer(None, None, spec)

    def _layers(self, infos: list[LayerInfo]) -> list[dict[str, Any]]:
        """The layers the page offers: the dry pass's candidates, the model's default marked; without a dry pass (a
        vision-language model's: its family names the layer), the explained layer alone."""
        if not infos:
            return [{"name": self.default_layer, "kind": "", "shape": [], "default": True}]
        try:
            default = self.adapter.default_layer_of(self.model, infos)
        except UsageError:
            default = None
        return [
            {"name": i.name, "kind": i.kind, "shape": list(i.output_shape or ()), "default": i.name == default}
            for i in infos
            if i.is_candidate
        ]

    async def run(self, work: Callable[[], T]) -> T:
        """Await ``work`` (which uses the model) on the service's own thread (the module's docstring says why
        one)."""
        return await asyncio.wrap_future(self._thread.submit(work))

    def close(self) -> None:
        """Let the service's thread end (once its work in hand is done); the command calls it when it stops."""
        self._thread.shutdown(wait=False, cancel_futures=True)

    def info(self) -> dict[str, Any]:
        """What the page needs to build its controls."""
        return {
            "model": self.model.name,
            **self.adapter.serve_facts(),
            "layers": self.layers,
            "default_layer": self.default_layer,
            "methods": self.methods,
            "default_method": self.default_method,
            "kind": self.kind,
            "targets": [str(spec) for spec in self.targets],
            **(self.answers.facts() if self.answers is not None else {}),
        }

    def check_images(self) -> None:
        """A 409 answer for a model asked questions instead of explaining images (``POST /api/ask``)."""
        if self.answers is not None:
            raise HttpError(
                409, "this vision-language model answers questions: ask one about the image (POST /api/ask)"
            )

    def explainer(self, layer: str | None, method: str | None, target: TargetSpec | None = None) -> Explainer:
        """The explainer for ``layer`` (names joined by ``+``), ``method`` and ``target`` (``None``: classes); a bad
        name or a target that does not fit the model is a UsageError."""
        layer = layer or self.default_layer
        method = method or self.default_method
        key = (layer, method, str(target) if target is not None else "")
        if key not in self._explainers:
            if method not in self.methods:
                raise UsageError(f"unknown method {method!r} for a {self.adapter.noun}.{suggest(method, self.methods)}")
            names = [name for name in layer.split("+") if name]
            options = self._options(tuple(names), (method,), target)
            if len(self._explainers) >= MAX_EXPLAINERS:
                self._explainers.pop(next(iter(self._explainers)))
            self._explainers[key] = Explainer(self.model, options, dry_passes=self.dry_passes)
        return self._explainers[key]

    def _options(self, layers: tuple[str, ...], methods: tuple[str, ...], target: TargetSpec | None) -> ExplainOptions:
        """The run's options for one explainer: ``layers``, ``methods``, and ``target`` (``None``: classes, the
        run's ``top_k`` of them)."""
        return replace(
            self.options,
            layers=layers,
            methods=methods,
            top_k=self.options.top_k if target is None else None,
            targets=(target,) if target is not None else (),
        )

    def target_index(self, text: str | None) -> int | None:
        """A class by index or name, matched as ``--target-class`` matches it."""
        return resolve_target(self.model, text) if text else None

    def explain(
        self,
        source: Source,
        image: DecodedImage,
        layer: str | None,
        method: str | None,
        target: str | TargetSpec | None,
        rank: int,
        shown: str | None = None,
        seconds: float | None = None,
    ) -> MapAnswer:
        """The map of ``target`` (a classifier's or segmenter's class, or a ``--target`` spec; ``None``: the first
        default target, else the top class) or of detection ``rank`` (0: every detection's combined map), at
        ``layer`` with ``method``; ``shown``: the target as the page names it (default: the spec itself);
        ``seconds``: how long the passes of a method that runs many (Score-CAM, RISE, ...) may take."""
        self.check_images()
        spec = (
            target if isinstance(target, TargetSpec) else self.targets[0] if target is None and self.targets else None
        )
        shown = shown or (str(spec) if spec is not None else None)
        if spec is None and not self.adapter.serve_target() and isinstance(target, str):
            raise UsageError(
                f"{target}: a {self.adapter.noun}'s maps are its detections'; click a detection (or all detections) "
                "instead of typing a class"
            )
        with self.model_lock:
            explainer = self.explainer(layer, method, spec)
            index = None
            if spec is None and self.adapter.serve_target():
                index = self.target_index(target if isinstance(target, str) else None)
            chosen_target = str(spec) if spec is not None else index

            def key_of(rank: int) -> str:
                return map_id(source.id, explainer.layer_label, explainer.chosen.methods[0], chosen_target, rank)

            key = key_of(rank)
            stored = self.maps.get(key)
            if stored is not None:
                return MapAnswer(stored, False, shown)
            factory, deadline = ReplayFactory(self.passes, source.id), Deadline(seconds)
            batch = image.batch(self.model.input_spec)
            result = explainer.explain_batch(batch, [image.size], index, context=CallContext(factory, deadline))[0]
        result.pixels = image.pixels
        chosen = self.adapter.pick(result.explanations, rank)
        stored = StoredMap(key, source.id, source.stem, explainer.layer_label, chosen, result.predictions, image.pixels)
        for other in self.adapter.kept_maps(result, chosen):  # a detector's: one pass made every detection's map
            kept = key_of(other.rank or 0)
            self.maps.put(
                StoredMap(kept, source.id, source.stem, stored.layer, other, result.predictions, image.pixels)
            )
        self.maps.put(stored)
        return MapAnswer(stored, factory.forward or deadline.passes > 0, shown)

    def curves(
        self, stored: StoredMap, source: Source, image: DecodedImage, road: bool, seconds: float | None = None
    ) -> dict[str, Any]:
        """``gradcam eval``'s figures for the map ``stored`` shows, of the image ``source`` (``image``, decoded):
        a class's by its own evaluator, a whole answer's as ``gradcam eval --prompt`` measures it
        (:meth:`Answers.curves <gradcam_cli.serve.answers.Answers.curves>`); a task measured by its boxes is
        refused, as there."""
        self.adapter.check_curves()
        if self.answers is not None:
            return self.answers.curves(stored, image, road, FAITHFULNESS_STEPS)
        return self._class_curves(stored, source.path, road, seconds)

    def _class_curves(self, stored: StoredMap, path: Path, road: bool, seconds: float | None = None) -> dict[str, Any]:
        """``gradcam eval``'s figures for a class's map ``stored`` by its own evaluator (what ``gradcam eval PATH
        --target-class N --layer L --method M --steps 20 [--road]`` prints): deletion and insertion AUC and curves,
        the masked image's probability, and with ``road`` the combined ROAD score."""
        from ..evaluation.evaluate import Evaluator

        explanation = stored.explanation
        if explanation.target.score is not None:
            raise UsageError(
                f"deletion and insertion of {explanation.target.name} are measured by gradcam eval --target, not here"
            )
        options = ExplainOptions(
            layers=tuple(stored.layer.split("+")),
            methods=(explanation.method,),
            target_class=explanation.target.index,
            score=self.options.score,
        )
        with self.model_lock:
            explainer = Explainer(self.model, options, progress=Deadline(seconds), dry_passes=self.dry_passes)
            scores = Evaluator(explainer, EvalOptions(steps=FAITHFULNESS_STEPS, road=road)).evaluate_image(path)
        if scores.error is not None or scores.target is None:
            raise UsageError(scores.error or "this image could not be evaluated")
        figures = scores.methods[explanation.method]
        out: dict[str, Any] = {
            "target": prediction_dict(scores.target),
            "steps": FAITHFULNESS_STEPS,
            "deletion_auc": figures.deletion_auc,
            "insertion_auc": figures.insertion_auc,
            "masked_probability": figures.masked_probability,
            "deletion": figures.deletion,
            "insertion": figures.insertion,
        }
        if road:
            out["road"] = figures.road
        return out


def _load(model: ModelOptions, options: ExplainOptions) -> LoadedModel:
    """``model`` loaded as the command loads it: a vision-language model as ``--prompt`` does (for the answer task,
    a ``--layer`` given tried by one probe pass: :func:`~gradcam_cli.pipeline.answers.answer_explainer`), any other
    once on its device."""
    if family_of(model.model).answers:
        from ..pipeline.answers import answer_explainer

        return answer_explainer(model, options).model
    return load_for_run(model)


class Deadline:
    """The progress callback of one request's passes: it stops them (a 503 answer) once they have run ``seconds``
    (``None``: never), so that no request holds the model for long."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.end = None if seconds is None else time.monotonic() + seconds
        self.passes = 0
        """How many passes of its own the method announced (Score-CAM's masked inputs, ...): 0, none ran."""

    def __call__(self, done: int, total: int) -> None:
        self.passes = max(self.passes, total)
        if self.end is not None and done < total and time.monotonic() >= self.end:
            raise HttpError(
                503,
                f"stopped after {self.seconds:g} s ({done} of {total} passes run): a request may take at most "
                f"{self.seconds:g} s; choose a later layer or a gradient method, or run gradcam on the command line",
            )
