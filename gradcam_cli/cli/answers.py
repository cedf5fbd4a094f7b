"""``gradcam IMAGE --model hf:DIR --prompt TEXT``: its options, and a vision-language model's answer and its maps,
reported."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from typing import Annotated, Protocol

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_OK, UsageError
from ..options import AnswerOptions, ExplainOptions, ModelOptions, OutputOptions, RunOptions
from .reporting import Reporter, run_summary

PromptOpt = Annotated[
    str | None,
    typer.Option(
        metavar="TEXT", help="Ask a vision-language model (hf:DIR) this about each image; map its answer (docs/vlm.md)."
    ),
]
AnswerOpt = Annotated[
    str | None, typer.Option(metavar="TEXT", help="--prompt: explain this answer instead of the generated one.")
]
PerTokenOpt = Annotated[bool, typer.Option("--per-token", help="--prompt: also one map per answer token.")]
MaxNewTokensOpt = Annotated[
    int | None, typer.Option(min=1, metavar="N", help="--prompt: the generated answer's most tokens (default: 32).")
]


def question(prompt: str | None, answer: str | None, per_token: bool, max_new_tokens: int | None) -> AnswerOptions:
    """A question for a vision-language model, from ``--prompt``, ``--answer``, ``--per-token`` and
    ``--max-new-tokens`` (docs/vlm.md)."""
    return AnswerOptions(prompt, answer, per_token, max_new_tokens)


DEFAULT_MAX_NEW_TOKENS = 32
"""The generated answer's most tokens without ``--max-new-tokens``."""


def _not_for_answers(explain: ExplainOptions, output: OutputOptions, run: RunOptions) -> list[str]:
    """The options given that a vision-language answer does not take (``None`` or off: not given)."""
    values = {
        "--target-class": explain.target_class,
        "--top-k": explain.top_k,
        "--score": explain.score,
        "--score-threshold": explain.score_threshold,
        "--max-detections": explain.max_detections,
        "--embedding": explain.embedding,
        "--shard": run.shard,
    }
    flags = {
        "--aug-smooth": explain.aug_smooth,
        "--save-heatmap": output.save_heatmap,
        "--panel": output.panel,
        "--report": output.report,
        "--skip-existing": output.skip_existing,
        "--engine ray": run.engine != "local",
    }
    return [name for name, value in values.items() if value is not None] + [name for name, on in flags.items() if on]


class Command(Protocol):
    """The parsed ``gradcam`` command (``cli/explain.py``'s ``ExplainCommand``)."""

    reporter: Reporter
    inputs: list[str]
    model_options: ModelOptions
    explain_options: ExplainOptions
    output: OutputOptions
    run_options: RunOptions


def _check_question(explain: ExplainOptions, output: OutputOptions, run: RunOptions) -> None:
    """A one-line UsageError for an answer's option without a ``--prompt``, or an option an answer does not take."""
    question = explain.question
    if question.prompt is None:
        raise UsageError(f"{question.given()[0]} is for a --prompt; add --prompt TEXT")
    if output.manifest is not None and output.manifest.suffix.lower() != ".jsonl":
        raise UsageError(f"--manifest {output.manifest}: with --prompt use a .jsonl file (rows carry the answer)")
    not_here = _not_for_answers(explain, output, run)
    if not_here:
        raise UsageError(f"{not_here[0]} does not apply to a --prompt's answer (docs/vlm.md lists what does)")
    if len(explain.layers) > 1:
        raise UsageError("--prompt explains one --layer at a time")


def ask(command: Command) -> int:
    """Ask the command's ``--prompt`` about every image; print each answer and its maps; the exit code."""
    reporter, inputs, model, explain = command.reporter, command.inputs, command.model_options, command.explain_options
    output, run, question = command.output, command.run_options, explain.question
    _check_question(explain, output, run)
    from ..io.discovery import discover
    from ..io.manifest import ManifestWriter
    from ..models.devices import resolve_device
    from ..models.families import family_of
    from ..pipeline.session import Counts
    from ..vlm.answer import AnswerExplainer
    from ..vlm.outputs import AnswerRun

    images = discover(inputs, exclude=output.output_dir)
    if not images:
        raise UsageError("no image found in the inputs")
    vlm = family_of(model.model).load_answering(model, resolve_device(model.device))
    explainer = AnswerExplainer(
        vlm,
        explain.layers[0] if explain.layers else None,
        explain.methods,
        question.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        explain.perturbation.seed,
        explain.eigen_smooth,
    )
    if not explain.layers:
        reporter.info(f"using layer {explainer.layer} ({vlm.family.layer_description}; choose with --layer)")
    counts = Counts()
    started = time.perf_counter()
    answers = AnswerRun(explainer, question, output, explain.targets, run.max_side)
    with ExitStack() as stack:
        manifest = stack.enter_context(ManifestWriter(output.manifest)) if output.manifest is not None else None
        for result, rows in answers.run(images):
            for row in rows:
                if manifest is not None:
                    manifest.write(row)
                if reporter.as_json:
                    reporter.emit(json.dumps(row))
            if result is None:
                counts.error += 1
                reporter.error(str(rows[0]["error"]))
                continue
            counts.ok += 1
            first = rows[0]
            reporter.result(f"{first['input']}  (model {vlm.name}, layer {explainer.layer})")
            given = "" if result.generated else " (given)"
            reporter.result(f"  answer{given}: {result.answer}  (log p {result.logprob:.3f})")
            for explained, row in zip(result.maps, rows, strict=True):
                label = explained.target.label
                reporter.result(f"  {explained.method} for {label} ({explained.score:.3f}) -> {row['outputs'][0]}")
    if len(images) > 1:
        reporter.info(run_summary(counts, time.perf_counter() - started, "images"))
    return EXIT_IMAGE_FAILED if counts.error else EXIT_OK
