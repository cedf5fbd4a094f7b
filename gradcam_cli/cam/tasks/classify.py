"""Classifiers (and embedding and CLIP models, whose ``--target`` specs and prompts are scored as classes): the
class score of :mod:`gradcam_cli.cam.scores`, an explicit target's of :mod:`gradcam_cli.cam.targets`, or none
(:mod:`gradcam_cli.cam.untargeted`: an embedding model's rollout and attention without a target)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ...options import ExplainOptions
from ..results import NO_TARGET_SCORE
from ..scores import ClassScore, Score
from ..targets import explicit_score
from ..untargeted import NoTargetScore
from .base import ScoreRequest, TaskAdapter, check_class_score, register_task

if TYPE_CHECKING:
    from ...models.loading import LoadedModel
    from ..results import Prediction


class ClassifyTask(TaskAdapter):
    """A classifier's classes, an embedding model's ``similar:`` targets, a CLIP model's prompts."""

    name = "classify"
    noun = "classifier"
    faithfulness = True
    takes_targets = True
    aug_smooth = True
    methods_of = "classify"
    scans = True
    whole_scans = True

    def check_options(self, options: ExplainOptions) -> None:
        check_class_score(options)
        TaskAdapter.check_options(self, replace(options, score=None))

    def score(self, model: LoadedModel, request: ScoreRequest) -> Score:
        options = request.options
        if request.specs or model.text is not None or model.embeds or options.embedding is not None:
            return explicit_score(
                model,
                request.specs,
                request.device,
                request.target,
                options.top_k,
                request.methods,
                options.score,
                options.embedding,
            )
        self.check_options(options)
        return ClassScore(options.score or "logit")

    def settings(
        self, model: LoadedModel, score: Score, request: ScoreRequest, perturbation: dict[str, object]
    ) -> dict[str, object]:
        name = request.options.score or ("cosine" if model.text is not None else "logit")
        name = NO_TARGET_SCORE if isinstance(score, NoTargetScore) else name
        specs = request.specs
        chosen = {"targets": " | ".join(map(str, specs)), "embedding": request.options.embedding} if specs else {}
        return {"task": self.name, "score": name, **chosen, **perturbation}

    def how_much(self, prediction: Prediction) -> str:
        if prediction.score == NO_TARGET_SCORE:
            return "needs none"
        if prediction.score is not None:
            return f"{prediction.score} {prediction.probability:.4g}"
        return f"{prediction.probability:.1%}"


register_task(ClassifyTask())
