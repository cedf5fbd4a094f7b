"""The ``gradcam eval`` command: parses its options, runs :mod:`gradcam_cli.evaluation`, reports (torch: after parsing).

:func:`gradcam_cli.cli.main` hands ``gradcam eval ...`` to this app (the main command takes positional inputs, so
eval cannot be a typer subcommand beside it).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_OK, UsageError, describe
from ..options import (
    ALL_METHODS,
    DEFAULT_METHOD,
    POINTING_TOLERANCE,
    RANDOM_BASELINE,
    AnswerOptions,
    EvalOptions,
    ExplainOptions,
    ModelOptions,
    PerturbationOptions,
)
from . import answers, measures, params, scan_options
from .eval_output import tell
from .help import PanelledEvalCommand
from .input_size import InputSizeOpt
from .rank_plan import plan_rank
from .ranking import BudgetOpt, MethodSteps, RankOpt, RankOptions, ReportOpt, SkipExistingOpt, rank_report
from .reporting import (
    PassProgress,
    ProgressBar,
    Reporter,
    duration,
    explainer_notes,
    pass_methods,
    run_reported,
)

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..evaluation.evaluate import AnyEvaluator
    from ..evaluation.report import EvalReport, ImageScores
    from ..evaluation.rows import RowsFile
    from ..io.boxes import GroundTruthBox
    from ..io.discovery import InputImage
    from ..options import ExplainOptions, ModelOptions

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

PLOT_FORMATS = (".png", ".pdf", ".svg")
HELP = """Measure how faithful the maps are, and where the evidence lies.

INPUT: image files, folders (searched recursively) or quoted glob patterns; scans (.nii, .nii.gz, .npy, DICOM
folders) for a volume model.

Per method: deletion and insertion AUC (RISE), Average Drop and Increase in Confidence (Grad-CAM++), sparseness (Gini)
and complexity (entropy). With --road: ROAD; --faithfulness-correlation: faithfulness correlation (Bhatt et al. 2020);
--boxes: pointing game and energy in the boxes, per class, and the images whose evidence lies outside the object;
--sanity: the randomisation test; --stability: the maps' change under input noise; --arcc, --random-logit, --mprt:
ARCC, the random-logit test, sMPRT and eMPRT (costly: off unless asked, also with --rank). A detector: each detection's
score's deletion and insertion (re-found by IoU and class, 0 once gone), pointing and energy in its box. --rank: all
of them, every method ranked per metric, 95% bootstrap intervals (--method all ranks every method; randomcam added);
--meta: which metrics to trust (MetaQuantus' noise and randomised-model tests).

Exit codes: 0 all images evaluated; 1 some image failed; 2 usage error; 3 model/weights unavailable; 130
interrupted."""


@app.command(cls=PanelledEvalCommand, help=HELP)
def evaluate(  # noqa: PLR0913  (a typer command: one parameter per option)
    inputs: Annotated[list[str] | None, typer.Argument(metavar="INPUT", hidden=True, show_default=False)] = None,
    method: params.MethodOpt = params.MethodList([DEFAULT_METHOD]),
    model: params.ModelOpt = "resnet50",
    task: params.TaskOpt = None,
    weights: params.WeightsOpt = "DEFAULT",
    num_classes: params.NumClassesOpt = None,
    labels: params.LabelsOpt = None,
    layer: params.LayerOpt = None,
    aug_smooth: params.AugSmoothOpt = False,
    eigen_smooth: params.EigenSmoothOpt = False,
    target_class: params.TargetOpt = None,
    target: params.TargetsOpt = None,
    embedding: params.EmbeddingOpt = None,
    score: params.ScoreOpt = None,
    score_threshold: params.ScoreThresholdOpt = None,
    max_detections: params.MaxDetectionsOpt = None,
    steps: measures.StepsOpt = 50,
    batch_size: measures.BatchSizeOpt = 16,
    boxes: measures.BoxesOpt = None,
    masks: measures.MasksOpt = None,
    tolerance: measures.ToleranceOpt = POINTING_TOLERANCE,
    sanity: measures.SanityOpt = False,
    sanity_layers: measures.SanityLayersOpt = 3,
    road: measures.RoadOpt = False,
    correlation: measures.CorrelationOpt = False,
    arcc: measures.ArccOpt = False,
    random_logit: measures.RandomLogitOpt = False,
    mprt: measures.MprtOpt = False,
    mprt_samples: measures.MprtSamplesOpt = 50,
    meta: measures.MetaOpt = False,
    plot: measures.PlotOpt = None,
    stability: measures.StabilityOpt = False,
    rank: RankOpt = False,
    report_dir: ReportOpt = None,
    skip_existing: SkipExistingOpt = False,
    budget: BudgetOpt = None,
    rise_masks: params.RiseMasksOpt = 4000,
    occlusion_window: params.OcclusionWindowOpt = 32,
    occlusion_stride: params.OcclusionStrideOpt = 16,
    seed: params.SeedOpt = 0,
    fps: params.FpsOpt = None,
    channels: scan_options.ChannelsOpt = None,
    prompt: answers.PromptOpt = None,
    answer: answers.AnswerOpt = None,
    max_new_tokens: answers.MaxNewTokensOpt = None,
    prompts: answers.PromptsOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the whole report as one JSON object (--rank: one per row).")
    ] = False,
    device: params.DeviceOpt = "auto",
    input_size: InputSizeOpt = None,
    quiet: params.QuietOpt = False,
    verbose: params.VerboseOpt = False,
) -> None:
    reporter = Reporter(quiet, verbose, as_json)
    specs, mistake = params.target_specs(target)
    specs, region, mistake = scan_options.region_of(specs) if mistake is None else (specs, None, mistake)
    if mistake is not None:
        run_reported(reporter, lambda: params.refuse(mistake))
    methods = params.MethodList([*method, RANDOM_BASELINE]) if rank and RANDOM_BASELINE not in method else method
    perturbation = PerturbationOptions(
        rise_masks, occlusion_window=occlusion_window, occlusion_stride=occlusion_stride, seed=seed
    )
    explain = ExplainOptions(
        tuple(layer or ()),
        tuple(methods),
        target_class,
        aug_smooth=aug_smooth,
        eigen_smooth=eigen_smooth,
        score=score,
        score_threshold=score_threshold,
        max_detections=max_detections,
        targets=tuple(specs),
        embedding=embedding,
        perturbation=perturbation,
        question=AnswerOptions(prompt, answer, max_new_tokens=max_new_tokens, prompts=prompts),
        region=region,
    )
    command = EvalCommand(
        reporter,
        inputs or [],
        ModelOptions(model, weights, num_classes, labels, input_size, device, explain.task_for(task)),
        explain,
        EvalOptions(
            steps,
            batch_size,
            tolerance,
            sanity,
            sanity_layers,
            seed,
            boxes=boxes,
            plot=plot,
            road=road,
            stability=stability,
            correlation=correlation,
            arcc=arcc,
            random_logit=random_logit,
            mprt=mprt,
            mprt_samples=mprt_samples,
            fps=fps,
            masks=masks,
            meta=meta,
        ),
        RankOptions(rank, report_dir, skip_existing, budget),
        tuple(channels) if channels is not None else None,
    )
    run_reported(reporter, command.run)


class EvalCommand:
    """The parsed ``gradcam eval`` command; :meth:`run` returns the exit code."""

    def __init__(
        self,
        reporter: Reporter,
        inputs: list[str],
        model: ModelOptions,
        explain: ExplainOptions,
        options: EvalOptions,
        ranking: RankOptions | None = None,
        channels: tuple[Path, ...] | None = None,
    ) -> None:
        self.reporter, self.inputs = reporter, inputs
        self.model_options, self.explain_options, self.options = model, explain, options
        self.ranking = ranking or RankOptions()
        self.channels = channels  # --channels: one scan's channel files; None: not given
        self.plan_seconds: dict[str, float] = {}  # --rank's estimate per method and image
        self.plan_total = 0.0  # --rank's estimate of the whole run, timing and seed spread included
        self.sampled: list[ImageScores] = []  # the plan's real evaluation of the first image, kept

    def run(self) -> int:
        from ..evaluation.boxes import read_boxes
        from ..evaluation.choose import evaluator_for
        from ..evaluation.clips import evaluated_inputs, rank_options
        from ..io.discovery import discover, discover_volumes
        from ..io.volumes import channel_files
        from ..pipeline.volumes import check_channels

        options = self.options
        self._check_rank_options()
        if self.explain_options.question.asked or self.explain_options.question.given():
            return answers.evaluate_answers(self)
        if options.plot is not None and options.plot.suffix.lower() not in PLOT_FORMATS:
            raise UsageError(f"--plot {options.plot}: use a file ending in {', '.join(PLOT_FORMATS)}")
        channels = self.channels or ()
        if not self.inputs and not channels:  # optional for --prompts, which names the images
            raise UsageError("no input given; try: gradcam eval IMAGE_OR_DIR")
        counted = channel_files(channels) if channels else 0  # their grids, before the model loads
        images = discover(self.inputs) if self.inputs else []
        scans = discover_volumes([raw for raw in self.inputs if Path(raw).exists()], channels=channels)
        if not images and not scans:
            raise UsageError(f"no images found in {' '.join(self.inputs)}")
        boxes = read_boxes(options.boxes) if options.boxes is not None else None
        explainer = self._explainer()
        if explainer.model.profile.volume is not None:  # a volume model's: its scans (docs/volumes.md)
            images = self._scans(explainer, scans)
            check_channels(explainer, channels, counted)
        elif self.explain_options.region is not None or channels or options.masks is not None:
            option = "--channels" if channels else "--masks" if options.masks is not None else "--target region:"
            raise UsageError(f"{option} is for a volume model's scans; {explainer.model.name} takes images")
        else:
            images = evaluated_inputs(explainer, self.inputs, images, options)  # a video model's: its videos
        started = time.perf_counter()
        options = rank_options(explainer, options) if self.ranking.rank else options
        evaluator = evaluator_for(explainer, options)  # its checks refuse what it does not measure, before a plan
        if self.ranking.rank:
            named = ALL_METHODS not in self.explain_options.methods
            planned = (  # a volume model's scans: every method named is run, no plan
                plan_rank(self.reporter, self.ranking, named, explainer, images, options, boxes is None)
                if explainer.model.profile.volume is None
                else None
            )
            if planned is not None:
                explainer, self.plan_seconds, self.plan_total = planned.explainer, planned.seconds, planned.total
                self.sampled, self.ranking = planned.sampled, replace(self.ranking, seed_images=planned.seed_images)
                evaluator = evaluator_for(explainer, options)
        report = self._evaluate(evaluator, options, images, boxes)
        tell(self.reporter, report, evaluator, images, options, bool(boxes) or options.masks is not None, self.ranking)
        elapsed = time.perf_counter() - started  # the plan's timing and the seed spread included
        said = (
            f" (the plan said about {duration(self.plan_total)}: {elapsed / self.plan_total:.2f}x)"
            if self.plan_total
            else ""
        )
        self.reporter.info(
            f"evaluated {len(report.ok)} image(s), {len(report.failed)} failed, in {duration(elapsed)}{said}"
        )
        return EXIT_IMAGE_FAILED if report.failed else EXIT_OK

    def _check_rank_options(self) -> None:
        """Refuse ``--rank``'s options without it."""
        if self.ranking.report is not None and not self.ranking.rank:
            raise UsageError("--report is for --rank: add --rank (gradcam eval writes no page otherwise)")
        if self.ranking.budget is not None and not self.ranking.rank:
            raise UsageError("--budget is for --rank: add --rank (gradcam eval plans nothing otherwise)")
        if self.options.meta and not self.ranking.rank:
            raise UsageError("--meta is for --rank: add --rank (it tests the ranking's metrics)")

    def _scans(self, explainer: Explainer, scans: list[InputImage]) -> list[InputImage]:
        """A volume model's scans; ``--budget`` refused on them, a ``--masks`` that is not a folder, and a run
        without any."""
        if self.ranking.budget is not None:
            raise UsageError("--budget plans --rank on images; on scans every method named is run")
        masks = self.options.masks
        if masks is not None and not masks.is_dir():
            raise UsageError(f"--masks {masks}: no such folder (give the folder of label masks, as nnU-Net's labelsTr)")
        if not scans:
            raise UsageError(f"{explainer.model.name} takes scans; none found in {' '.join(self.inputs)}")
        return scans

    def _explainer(self) -> Explainer:
        """The explainer, with its masked passes' progress shown, and the notes on its layer and its passes."""
        from ..cam.explainer import Explainer

        reporter = self.reporter
        passes = pass_methods(self.explain_options.methods)
        shown = PassProgress(reporter, f"{'/'.join(passes)} passes") if passes else None
        explainer = Explainer.from_options(self.model_options, self.explain_options, progress=shown)
        explainer_notes(reporter, explainer, bool(self.explain_options.layers))
        return explainer

    def _evaluate(
        self,
        evaluator: AnyEvaluator,
        options: EvalOptions,
        images: list[InputImage],
        boxes: list[GroundTruthBox] | None,
    ) -> EvalReport:
        """Evaluate the (image, method) results not yet done, with a progress bar (rows appended to ``--rank
        --report``'s rows file as they finish); on Ctrl-C, rank the results finished first."""
        from ..evaluation.rows import Finished

        reporter, explainer = self.reporter, evaluator.explainer
        methods = len(explainer.chosen.methods)
        rows, done = self._rows(explainer, options)
        finished = Finished(explainer.chosen.methods, done)
        for row in self.sampled:  # the plan's sample: kept, not computed again
            if all(m in explainer.chosen.methods for m in row.methods) and not finished.complete(row.image):
                finished.add(row)
                if rows is not None:
                    rows.append(row)
        todo = [image for image in images if not finished.complete(str(image.path))]

        def record(scores: ImageScores) -> None:
            finished.add(scores)
            if rows is not None:
                rows.append(scores)

        label = f"evaluating {methods} methods" if methods > 1 else "evaluating"
        try:
            with ProgressBar(reporter, len(images) * methods, label) as progress:
                for _ in range((len(images) - len(todo)) * methods):
                    progress(skipped=True)
                steps = MethodSteps(progress, len(images), methods, len(images) - len(todo), self.plan_seconds)
                pending = finished.pending()
                ran = evaluator.run(todo, boxes, steps.image, record, steps.method, pending) if todo else None
        except KeyboardInterrupt:
            if self.ranking.rank and not finished.results():
                reporter.info("interrupted before the first method finished on an image: nothing to rank")
            if self.ranking.rank and finished.results():
                partial = self._report(evaluator, options, images, finished.images())
                reporter.info(
                    f"interrupted: the ranking of the {finished.results()} (image, method) result(s) finished, on "
                    f"{len(partial.ok)} image(s)"
                )
                rank_report(reporter, explainer, partial, images, None, options.seed)
                if rows is not None:
                    reporter.info(f"their rows are in {rows.path}; add --skip-existing to resume")
            raise
        finally:
            if rows is not None:
                rows.close()
        return self._report(evaluator, options, images, finished.images(), ran)

    def _rows(self, explainer: Explainer, options: EvalOptions) -> tuple[RowsFile | None, list[ImageScores]]:
        """With ``--rank --report DIR``: the rows file that each finished (image, method) is appended to, and the
        results ``--skip-existing`` keeps from it (merged per image)."""
        from ..evaluation.rows import ROWS_NAME, RowsFile, read_rows, run_settings

        folder = self.ranking.report
        if not self.ranking.rank or folder is None:
            if self.ranking.skip_existing:
                raise UsageError("--skip-existing resumes --rank --report DIR: add them")
            return None, []
        settings = run_settings(explainer, options)
        path = folder / ROWS_NAME
        done = read_rows(path, settings) if self.ranking.skip_existing else []
        try:
            folder.mkdir(parents=True, exist_ok=True)
            return RowsFile(path, settings, resume=self.ranking.skip_existing), done
        except OSError as error:
            raise UsageError(f"cannot write --report {folder}: {describe(error, folder)}") from error

    def _report(
        self,
        evaluator: AnyEvaluator,
        options: EvalOptions,
        images: list[InputImage],
        finished: list[ImageScores],
        run: EvalReport | None = None,
    ) -> EvalReport:
        """The report of the ``finished`` images (those of ``run`` and those resumed), in the inputs' order."""
        from ..evaluation.images import in_order, report_of

        ordered = in_order(images, finished)
        if run is not None:
            return replace(run, images=ordered)
        return report_of(evaluator.explainer, options, ordered, 0, getattr(evaluator, "sanity_modules", []))
