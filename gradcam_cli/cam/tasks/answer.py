"""A vision-language model's answer (docs/vlm.md): the task of ``--prompt``. Its model is loaded by the family
registry (the ``vision-language`` family, for this task: ``ModelOptions(task="answer")``) and explained by
:class:`~gradcam_cli.cam.answers.AnswerExplainer`; this adapter decides everything the command line asks of a
task: the options it refuses, which methods apply, the console's lines of its rows (the run is the session's:
:mod:`gradcam_cli.pipeline.answers`) and what an empty answer says (``gradcam eval``'s deletion and insertion of the
answer's probability: :mod:`gradcam_cli.evaluation.answers`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from .base import TaskAdapter, register_task

if TYPE_CHECKING:
    from torch import nn

    from ...models.loading import LoadedModel
    from ...options import ExplainOptions, ModelOptions
    from ..answers import AnswerExplainer
    from ..records import Record

DEFAULT_MAX_NEW_TOKENS = 32
"""The generated answer's most tokens without ``--max-new-tokens``."""
EMPTY_ANSWER = "the model's answer is empty (it ended at once): nothing to map; give one with --answer TEXT"
"""What an image whose generated answer is empty says (its row's ``note``, the console)."""


class AnswerTask(TaskAdapter):
    """A generated (or given) answer's log-probability, its tokens', ``answer:`` and ``contrast:answer:`` targets."""

    name = "answer"
    noun = "vision-language model"
    by_name = False  # asked with --prompt, never named by --task
    default_layer = "last stage of the backbone"
    videos = False
    faithfulness = True
    takes_targets = True

    def claims(self, model: LoadedModel) -> bool:
        return False  # the model of a question is loaded for it (--prompt), never as a LoadedModel

    def takes(self, method: str, tasks: Sequence[str], module: nn.Module) -> bool:
        from ..answers import answer_methods

        return method in answer_methods()

    def nothing_found(self, model: Any, score: Any, target: int | None) -> str | None:
        return EMPTY_ANSWER

    def refused(self, explain: ExplainOptions) -> list[str]:
        """The options given that an answer does not take (``None`` or off: not given)."""
        values = {
            "--target-class": explain.target_class,
            "--top-k": explain.top_k,
            "--score": explain.score,
            "--score-threshold": explain.score_threshold,
            "--max-detections": explain.max_detections,
            "--embedding": explain.embedding,
            "--attention-heads": explain.attention_heads,
        }
        given = [name for name, value in values.items() if value is not None]
        return given + (["--aug-smooth"] if explain.aug_smooth else [])

    def check_question(self, explain: ExplainOptions) -> None:
        """Refuse, in one line and before the model loads, a question no image can be asked: a blank ``--prompt``
        or ``--answer``, a ``--target`` that is not the answer's (``answer:WORD``, ``contrast:answer:A,answer:B``)."""
        question = explain.question
        for name, value in (("--prompt", question.prompt), ("--answer", question.answer)):
            if value is not None and not value.strip():
                raise UsageError(f"{name} is blank; give the text to {'ask' if name == '--prompt' else 'explain'}")
        for spec in explain.targets:
            if spec.kinds() != {"answer"}:
                raise UsageError(
                    f"--target {spec}: a vision-language answer takes answer:WORD or contrast:answer:A,answer:B"
                )

    def answerer(self, model: ModelOptions, explain: ExplainOptions) -> AnswerExplainer:
        """The explainer of ``explain``'s question, its model loaded by the family registry."""
        from dataclasses import replace

        from ...models.devices import resolve_device
        from ...models.families import family_of
        from ...models.families.vision_language import not_answering
        from ...models.loading import load_model
        from ...models.modes import settle_loaded
        from ..answer_layers import check_layer
        from ..answers import AnswerExplainer, Question

        if len(explain.layers) > 1:
            raise UsageError("--prompt explains one --layer at a time")
        family = family_of(model.model)
        asked = "--prompt" if explain.question.prompts is None else "--prompts"
        if not family.answers:
            raise not_answering(model.model, family.name, asked)
        vlm = load_model(replace(model, task=self.name))
        settle_loaded(vlm.module, resolve_device(model.device))
        question = Question(explain.question.answer, explain.question.per_token, tuple(explain.targets))
        answerer = AnswerExplainer(
            vlm,
            explain.layers[0] if explain.layers else None,
            explain.methods,
            explain.question.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            explain.perturbation.seed,
            explain.eigen_smooth,
            question,
            model.precision,
        )
        if explain.question.prompt is not None:  # --prompts: each image's, when it is asked
            answerer.check_text("--prompt", explain.question.prompt)
        if explain.layers:  # the default layer is the family's own
            check_layer(answerer)
        return answerer

    def layer_note(self, answerer: AnswerExplainer) -> str:
        """The console's note on the default layer."""
        return f"using layer {answerer.layer} ({answerer.layout.layer_description}; choose with --layer)"

    def lines(self, record: Record, first: bool) -> list[str]:
        """The console's lines of one row of a prompted image: before its first, the image, its model and layer and
        its answer; then the map's target, score and file."""
        answer = record.answer
        lines = []
        if first and answer is not None:
            lines.append(f"{record.input}  (model {record.model}, layer {record.layer})")
            given = "" if answer.generated else " (given)"
            given += " (kept: --skip-existing)" if record.status == "skipped" else ""
            if answer.note is not None:
                return [*lines, f"  answer{given}: (empty)  {answer.note}"]
            logprob = answer.logprob
            shown = f"  (log p {logprob:.3f})" if logprob is not None else ""
            lines.append(f"  answer{given}: {answer.text}{shown}")
        if record.target is not None and record.outputs:
            score = (record.target.details or {}).get("logprob")
            shown = f" ({score:.3f})" if isinstance(score, int | float) else ""
            lines.append(f"  {record.method} for {record.target.name}{shown} -> {record.outputs[0]}")
        return lines


ANSWER = AnswerTask()
"""The task of ``--prompt``: the command line, serve and ``gradcam eval`` import it from here."""
register_task(ANSWER)
