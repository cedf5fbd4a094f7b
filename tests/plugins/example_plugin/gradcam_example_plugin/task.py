"""The plugin's ``count`` task, registered when the ``gradcam_cli.tasks`` entry point imports this module.

A counting model (``--model toy:counter``, :mod:`.family`) returns one density map per class, (N, classes, h, w):
a class's count is its map's sum, and that count is the score explained (its gradient says which pixels add to
the count). A counted class's prediction shows its ``count`` (a task-owned ``details`` payload, written as the
row's own key) and, as its probability, its share of everything counted. The task takes the methods of dense
outputs (those serving ``segment``); ``gradcam eval`` scores a colour's map against the boxes labelled with it.

The adapter subclasses :class:`gradcam_cli.cam.tasks.TaskAdapter` and overrides what differs from a classifier
(docs/internals.md, "Adding a task"); :func:`gradcam_cli.cam.tasks.register_task` registers it under its name, which
``--task`` then accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from gradcam_cli.cam.results import ImageExplanation, Prediction
from gradcam_cli.cam.scores import ChannelTargets, ClassName, MaskedProbability, chosen_channels
from gradcam_cli.cam.tasks import Explained, Pair, ScoreRequest, TaskAdapter, label_box_pairs, register_task
from gradcam_cli.errors import UsageError

from .family import COUNT_TASK

if TYPE_CHECKING:
    from gradcam_cli.io.boxes import GroundTruthBox
    from gradcam_cli.models.profile import LoadedModel


def counts_of(output: object) -> torch.Tensor:
    """(N, classes) counts: each density map's sum; anything but (N, classes, h, w) maps is a one-line error."""
    if not isinstance(output, torch.Tensor) or output.dim() != 4:
        raise UsageError("a counting model returns (N, classes, h, w) density maps")
    return output.float().flatten(2).sum(2)


class CountTargets(ChannelTargets):
    """Each sample's chosen classes (N, k) of its (N, classes) counts (``scores``), differentiable."""

    def masked(self, k: int) -> MaskedProbability:
        """Score-CAM's and RISE's measure of a masked input: the class's count in it."""
        return lambda output, samples: self.entry(counts_of(output), k, samples)

    def prediction(self, n: int, c: int, size: tuple[int, int], class_name: ClassName) -> Prediction:
        """Class c's count (the row's ``count``) and, as its probability, its share of everything counted."""
        counts = self.scores[n].detach()
        counted, total = float(counts[c]), float(counts.sum())
        share = counted / total if total > 0 else 0.0
        return Prediction(c, class_name(c), share, details={"count": round(counted, 3)})


class CountScore:
    """A counting model's score for class c: its count, the sum of its density map."""

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> CountTargets:
        counts = counts_of(output)
        if chosen is None:  # the most counted first, at most every class
            chosen = chosen_channels(counts, target, min(top_k, counts.shape[1]))
        return CountTargets(counts, chosen)


class CountTask(TaskAdapter):
    """Counting with density maps: what a plugin's task adapter overrides."""

    name = COUNT_TASK
    noun = "counting model"
    listed = "Counts"
    methods_of = "segment"

    def score(self, model: LoadedModel, request: ScoreRequest) -> CountScore:
        self.check_options(request.options)
        return CountScore()

    def where(self, prediction: Prediction) -> str:
        return f"(class {prediction.index}), {_count(prediction):g} counted"

    def how_much(self, prediction: Prediction) -> str:
        return f"count {_count(prediction):g}"

    def box_pairs(
        self, explainer: Explained, image: Any, result: ImageExplanation, boxes: Sequence[GroundTruthBox]
    ) -> tuple[list[Pair], int]:
        """The boxes of one label against the map of the class of that name (``label_box_pairs``); a class counted
        less than once is undetected."""
        return label_box_pairs(explainer, image, result, boxes, lambda target: _count(target) >= 1)


def _count(prediction: Prediction) -> float:
    return float((prediction.details or {}).get("count", 0.0))


ADAPTER = register_task(CountTask())
"""The task this module registers (under ``count``: ``--task count``)."""
