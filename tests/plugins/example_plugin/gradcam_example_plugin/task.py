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

from gradcam_cli.cam.maps import to_image_maps
from gradcam_cli.cam.results import Explanation, ImageExplanation, Prediction
from gradcam_cli.cam.scores import Cams, ClassName, MaskedProbability
from gradcam_cli.cam.tasks import Explained, Pair, ScoreRequest, TaskAdapter, label_box_pairs, register_task
from gradcam_cli.errors import UsageError

from .family import COUNT_TASK

if TYPE_CHECKING:
    from gradcam_cli.evaluation.boxes import GroundTruthBox
    from gradcam_cli.models.profile import LoadedModel


def counts_of(output: object) -> torch.Tensor:
    """(N, classes) counts: each density map's sum; anything but (N, classes, h, w) maps is a one-line error."""
    if not isinstance(output, torch.Tensor) or output.dim() != 4:
        raise UsageError("a counting model returns (N, classes, h, w) density maps")
    return output.float().flatten(2).sum(2)


class CountTargets:
    """Each sample's chosen classes (N, k) and their (N, classes) ``counts``, differentiable."""

    def __init__(self, counts: torch.Tensor, chosen: torch.Tensor) -> None:
        self.counts, self.chosen = counts, chosen

    @property
    def count(self) -> int:
        return int(self.chosen.shape[1])

    @property
    def region(self) -> tuple[float, float]:
        return (1.0, 1.0)

    def value(self, k: int) -> torch.Tensor:
        return self.counts.gather(1, self.chosen[:, k : k + 1]).sum()

    def masked(self, k: int) -> MaskedProbability:
        """Score-CAM's and RISE's measure of a masked input: the class's count in it."""

        def counted(output: object, samples: torch.Tensor) -> torch.Tensor:
            return counts_of(output).gather(1, self.chosen[samples, k].unsqueeze(1)).squeeze(1)

        return counted

    def results(self, cams: Cams, sizes: Sequence[tuple[int, int]], class_name: ClassName) -> list[ImageExplanation]:
        counts = self.counts.detach()
        results = []
        for n, size in enumerate(sizes):
            total = float(counts[n].sum())

            def prediction(c: int, n: int = n, total: float = total) -> Prediction:
                counted = float(counts[n, c])
                share = counted / total if total > 0 else 0.0
                return Prediction(c, class_name(c), share, details={"count": round(counted, 3)})

            explanations = [
                Explanation(method, prediction(int(self.chosen[n, k])), to_image_maps(per_k[k], size)[0])
                for k in range(self.count)
                for method, per_k in cams.items()
            ]
            order = counts[n].argsort(descending=True).tolist()
            results.append(ImageExplanation([prediction(c) for c in order], explanations))
        return results


class CountScore:
    """A counting model's score for class c: its count, the sum of its density map."""

    def targets(
        self, output: object, inputs: torch.Tensor, target: int | None, top_k: int, chosen: torch.Tensor | None = None
    ) -> CountTargets:
        counts = counts_of(output)
        classes = counts.shape[1]
        if chosen is None and target is not None:
            if not 0 <= target < classes:
                raise UsageError(f"class {target} is out of range: the model counts {classes} classes")
            chosen = torch.full((counts.shape[0], 1), target, dtype=torch.long, device=counts.device)
        elif chosen is None:
            chosen = counts.detach().topk(min(top_k, classes), dim=1).indices  # the most counted first
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
