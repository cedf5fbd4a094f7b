"""``gradcam IMAGE --model hf:DIR --prompt TEXT``: its options, and a vision-language model's answer and its maps,
reported."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_OK, UsageError
from ..options import AnswerOptions, EvalOptions, ExplainOptions, ModelOptions, OutputOptions, RunOptions
from .params import parse_path
from .ranking import RankOptions
from .reporting import ProgressBar, Reporter, run_summary

if TYPE_CHECKING:
    from ..io.discovery import InputImage

PromptOpt = Annotated[
    str | None,
    typer.Option(
        metavar="TEXT",
        help="Ask a vision-language model (hf:DIR) this about each image or video; map its answer (docs/vlm.md).",
    ),
]
AnswerOpt = Annotated[
    str | None, typer.Option(metavar="TEXT", help="--prompt: explain this answer instead of the generated one.")
]
PerTokenOpt = Annotated[bool, typer.Option("--per-token", help="--prompt: also one map per answer token.")]
PromptsOpt = Annotated[
    Path | None,
    typer.Option(
        parser=parse_path,
        metavar="FILE.csv",
        help="Ask each image its own question: image,prompt lines (paths relative to the file; docs/vlm.md).",
    ),
]
MaxNewTokensOpt = Annotated[
    int | None, typer.Option(min=1, metavar="N", help="--prompt: the generated answer's most tokens (default: 32).")
]


class Command(Protocol):
    """The parsed ``gradcam`` command (``cli/explain.py``'s ``ExplainCommand``)."""

    reporter: Reporter
    inputs: list[str]
    model_options: ModelOptions
    explain_options: ExplainOptions
    output: OutputOptions
    run_options: RunOptions


def _questioned(inputs: list[str], question: AnswerOptions, exclude: Path | None) -> list[InputImage]:
    """The prompted images: each image asked ``--prompt``, or with ``--prompts`` its own prompt."""
    from dataclasses import replace

    from ..io.discovery import discover
    from ..io.prompts import read_prompts

    if question.prompts is None:
        if not inputs:
            raise UsageError("no input given; try: gradcam IMAGE_OR_DIR --model hf:DIR --prompt TEXT")
        images = discover(inputs, exclude=exclude)
        if not images:
            raise UsageError("no image found in the inputs")
        return [replace(image, prompt=question.prompt) for image in images]
    if question.prompt is not None:
        raise UsageError("--prompt and --prompts: give one question for all images, or a file of them")
    if inputs:
        raise UsageError(f"--prompts {question.prompts} names the images; give no INPUT ({inputs[0]})")
    pairs = read_prompts(question.prompts)
    images = discover([image for image, _ in pairs], exclude=exclude)
    by_path = {image.resolve(): prompt for image, prompt in pairs}
    return [replace(image, prompt=by_path[image.path.resolve()]) for image in images]


def check_question(question: AnswerOptions, explain: ExplainOptions, output: OutputOptions, run: RunOptions) -> None:
    """Refuse, in one line, what a run of prompted images cannot do, before its model is loaded."""
    from ..cam.tasks.answer import ANSWER
    from ..pipeline.answers import RAY_ANSWERS

    if not question.asked:
        raise UsageError(f"{question.given()[0]} is for a --prompt; add --prompt TEXT")
    if output.manifest is not None and output.manifest.suffix.lower() != ".jsonl":
        raise UsageError(f"--manifest {output.manifest}: with --prompt use a .jsonl file (rows carry the answer)")
    ANSWER.check_question(explain)
    not_here = ANSWER.refused(explain)
    if not_here:
        raise UsageError(f"{not_here[0]} does not apply to a --prompt's answer (docs/vlm.md lists what does)")
    if run.engine == "ray":
        raise UsageError(RAY_ANSWERS)
    given = (run.clip_stride, run.fps, run.every)
    clips = {name: value is not None for name, value in zip(("--clip-stride", "--fps", "--every"), given, strict=True)}
    refused = [name for name, given in clips.items() if given]
    if refused:
        raise UsageError(
            f"{refused[0]} does not apply to a --prompt's answer: a video is asked about whole, as one clip sampled at "
            f"the model's processor's rate (docs/video.md)"
        )
    if output.skip_existing and output.manifest is None and run.shard is None:
        raise UsageError("--skip-existing with --prompt needs --manifest: a kept answer and its maps are its rows")


def ask(command: Command) -> int:
    """Ask the command's ``--prompt`` about every image (or each image its own, ``--prompts FILE.csv``) through the
    session (:mod:`gradcam_cli.pipeline.answers`); print each answer and its maps; the exit code."""
    reporter, inputs, model, explain = command.reporter, command.inputs, command.model_options, command.explain_options
    output, run, question = command.output, command.run_options, explain.question
    check_question(question, explain, output, run)
    if model.input_size is not None:
        raise UsageError("--input-size does not apply to a --prompt's answer: the model's processor sizes the image")
    from ..cam.tasks.answer import ANSWER as adapter
    from ..pipeline.answers import answer_explainer
    from ..pipeline.session import Session
    from ..pipeline.video import check_video_options

    images = _questioned(inputs, question, output.output_dir)
    check_video_options(output, [image for image in images if image.video], clips=True)  # --save-raw: the clip's maps
    with Session(output, run, notify=reporter.info) as session:
        answerer = answer_explainer(model, explain)
        if not explain.layers:
            reporter.info(adapter.layer_note(answerer.model, answerer.layer_label))
        started = time.perf_counter()
        bars = lambda label, total: ProgressBar(reporter, total, label)  # noqa: E731
        shown: set[str] = set()
        for record in session.explain(answerer, images, progress=bars):
            reporter.record(record)
            if record.status == "error":
                reporter.error(record.error or "failed")
                continue
            for line in adapter.lines(record, record.input not in shown):
                reporter.result(line)
            shown.add(record.input)
    if session.gallery is not None:
        reporter.info(f"gallery written to {session.gallery}")
    if len(images) > 1:
        reporter.info(run_summary(session.counts, time.perf_counter() - started, "images"))
    return EXIT_IMAGE_FAILED if session.counts.error else EXIT_OK


class EvalCommand(Protocol):
    """The parsed ``gradcam eval`` command (``cli/eval.py``'s ``EvalCommand``)."""

    reporter: Reporter
    inputs: list[str]
    model_options: ModelOptions
    explain_options: ExplainOptions
    options: EvalOptions
    ranking: RankOptions


def evaluate_answers(command: EvalCommand) -> int:
    """``gradcam eval --prompt`` (or each image its own, ``--prompts FILE.csv``): deletion and insertion of the
    answer's per-token probability along each method's map, per image (and their means), measured by the answer
    task's evaluator (:class:`~gradcam_cli.evaluation.answers.AnswerEvaluator`, which
    :func:`~gradcam_cli.evaluation.choose.evaluator_for` gives the answer task), its rows reported as they come; the
    exit code."""
    reporter, explain, options = command.reporter, command.explain_options, command.options
    question = explain.question
    if not question.asked:
        raise UsageError(f"{question.given()[0]} is for a --prompt; add --prompt TEXT")
    from ..cam.tasks.answer import ANSWER as adapter
    from ..evaluation.answers import AnswerEvaluator
    from ..pipeline.answers import answer_explainer

    measures = {"--rank": command.ranking.rank, "--boxes": options.boxes is not None, "--road": options.road}
    measures |= {"--plot": options.plot is not None, "--stability": options.stability, "--sanity": options.sanity}
    measures |= {"--faithfulness-correlation": options.correlation}
    measures |= {"--arcc": options.arcc, "--random-logit": options.random_logit, "--mprt": options.mprt}
    measures |= {"--target": bool(explain.targets)}  # the whole answer's map is measured
    not_here = adapter.refused(explain) + [name for name, on in measures.items() if on]
    if not_here:
        raise UsageError(f"{not_here[0]} does not apply to a --prompt's answer (docs/vlm.md: deletion and insertion)")
    adapter.check_question(explain)
    images = _questioned(command.inputs, question, None)
    videos = [image for image in images if image.video]
    if videos:
        raise UsageError(f"gradcam eval --prompt measures an answer about an image; {videos[0].path} is a video")
    answerer = answer_explainer(command.model_options, explain)
    if not explain.layers:
        reporter.info(adapter.layer_note(answerer.model, answerer.layer_label))
    evaluator = AnswerEvaluator(answerer, options)
    started, failed = time.perf_counter(), 0
    scores: dict[str, list[tuple[float, float]]] = {}
    for row in evaluator.rows(images):
        if reporter.as_json:
            reporter.emit(json.dumps(row))
        if row["status"] == "error":
            failed += 1
            reporter.error(str(row["error"]))
        elif "method" not in row:
            reporter.result(f"{row['input']}: {row['note']}")
        else:
            scores.setdefault(row["method"], []).append((row["deletion_auc"], row["insertion_auc"]))
            reporter.result(
                f"{row['input']}  {row['method']}: answer {row['answer']!r}  deletion AUC {row['deletion_auc']:.3f}"
                f"  insertion AUC {row['insertion_auc']:.3f}"
            )
    for method, pairs in scores.items():
        deletion, insertion = (sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
        reporter.result(f"{method} (mean of {len(pairs)}): deletion AUC {deletion:.3f}  insertion AUC {insertion:.3f}")
    reporter.info(
        f"evaluated {len(images) - failed} image(s), {failed} failed, in {time.perf_counter() - started:.1f}s"
    )
    return EXIT_IMAGE_FAILED if failed else EXIT_OK
