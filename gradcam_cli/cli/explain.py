"""The ``gradcam`` command: parses its options into :mod:`gradcam_cli.options`, calls the library, reports.

Torch is imported only after the options are parsed, so ``--help`` and option mistakes answer at once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_OK, UsageError
from ..options import (
    DEFAULT_MAX_SIDE,
    DEFAULT_METHOD,
    AnswerOptions,
    ExplainOptions,
    ModelOptions,
    OutputOptions,
    PerturbationOptions,
    RunOptions,
    Shard,
)
from . import answers, params, scan_options
from .help import PanelledCommand
from .input_size import InputSizeOpt
from .lines import report_record
from .params import refuse
from .reporting import (
    PassProgress,
    ProgressBar,
    Reporter,
    explainer_notes,
    pass_methods,
    run_reported,
    run_summary,
)

if TYPE_CHECKING:
    from ..options import ExplainOptions, ModelOptions

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

HELP = """Explain what a vision model looks at with Grad-CAM overlays: a classifier's classes, a detector's
detections, a segmenter's classes.

INPUT: image files, folders (searched recursively), quoted glob patterns, video files, or scans (.nii, .nii.gz,
.npy, DICOM folders) for a volume model.

Exit codes: 0 all images explained; 1 some image failed; 2 usage error; 3 model/weights unavailable; 130
interrupted."""
EPILOG = (
    "Also: gradcam eval INPUT... measures how faithful the maps are (see gradcam eval --help); gradcam diff "
    "BASELINE CURRENT compares two runs' maps and reports drift (see gradcam diff --help); gradcam merge OUTPUT_DIR "
    "merges the manifests of a --shard run (see gradcam merge --help)."
    " gradcam serve [PATH...] explores images or a finished run in the browser (see gradcam serve --help)."
)


@app.command(cls=PanelledCommand, help=HELP, epilog=EPILOG)
def explain(  # noqa: PLR0913  (a typer command: one parameter per option)
    inputs: Annotated[list[str] | None, typer.Argument(metavar="INPUT", hidden=True, show_default=False)] = None,
    layer: params.LayerOpt = None,
    model: params.ModelOpt = "resnet50",
    task: params.TaskOpt = None,
    weights: params.WeightsOpt = "DEFAULT",
    num_classes: params.NumClassesOpt = None,
    labels: params.LabelsOpt = None,
    target_class: params.TargetOpt = None,
    target: params.TargetsOpt = None,
    embedding: params.EmbeddingOpt = None,
    prompt: answers.PromptOpt = None,
    answer: answers.AnswerOpt = None,
    per_token: answers.PerTokenOpt = False,
    max_new_tokens: answers.MaxNewTokensOpt = None,
    prompts: answers.PromptsOpt = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            "-k",
            min=1,
            metavar="K",
            help="Explain each of the top K classes (one output each; default 1).",
            show_default=False,
        ),
    ] = None,
    method: params.MethodOpt = params.MethodList([DEFAULT_METHOD]),
    score: params.ScoreOpt = None,
    score_threshold: params.ScoreThresholdOpt = None,
    max_detections: params.MaxDetectionsOpt = None,
    rise_masks: params.RiseMasksOpt = 4000,
    occlusion_window: params.OcclusionWindowOpt = 32,
    occlusion_stride: params.OcclusionStrideOpt = 16,
    seed: params.SeedOpt = 0,
    aug_smooth: params.AugSmoothOpt = False,
    eigen_smooth: params.EigenSmoothOpt = False,
    attention_heads: params.AttentionHeadsOpt = None,
    alpha: Annotated[
        float, typer.Option(min=0.0, max=1.0, metavar="A", help="Heatmap opacity in the overlay, 0 to 1.")
    ] = 0.5,
    colormap: Annotated[str, typer.Option(metavar="NAME", help="Any matplotlib colormap name.")] = "jet",
    image_format: params.FormatOpt = None,
    quality: Annotated[
        int, typer.Option(min=1, max=100, metavar="Q", help="JPEG/WebP quality of overlays, heatmaps and panels.")
    ] = 90,
    save_raw: Annotated[
        bool, typer.Option("--save-raw", help="Also save each map as float32 .npy (H x W, [0,1]).")
    ] = False,
    save_heatmap: Annotated[
        bool, typer.Option("--save-heatmap", help="Also save the colour-mapped heatmap alone (in --format).")
    ] = False,
    panel: Annotated[
        bool,
        typer.Option(
            "--panel",
            help="Also save a figure per image: image | heatmap with colorbar | overlay "
            "(a grid, rows classes x columns methods, with --top-k or several methods).",
        ),
    ] = False,
    report: Annotated[
        bool, typer.Option("--report", help="Write an HTML gallery of the run, OUTPUT_DIR/index.html.")
    ] = False,
    every: params.EveryOpt = None,
    window_level: params.WindowLevelOpt = None,
    channels: scan_options.ChannelsOpt = None,
    clip_stride: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="Video models: video frames between the starts of clips (default: a clip's span, side by side).",
        ),
    ] = None,
    fps: params.FpsOpt = None,
    output_dir: Annotated[
        Path,
        typer.Option(
            "--output-dir",
            "-o",
            parser=params.parse_folder,
            metavar="DIR",
            help="Where outputs go (input tree mirrored).",
        ),
    ] = Path("gradcam_out"),
    device: params.DeviceOpt = "auto",
    precision: params.PrecisionOpt = "fp32",
    input_size: InputSizeOpt = None,
    batch_size: Annotated[
        int | None,
        typer.Option(min=1, metavar="N", help="Images per forward pass (default: 4 on the CPU, 16 on a GPU)."),
    ] = None,
    max_side: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="N",
            help="Shrink images whose longer side is larger by a whole factor first, so overlays and maps are at "
            "most this big (0: never).",
        ),
    ] = DEFAULT_MAX_SIDE,
    workers: Annotated[
        int | None,
        typer.Option(
            min=0,
            metavar="N",
            help="Decoding processes, 0 for a decoding thread (default: spare cores, at most 4; 0 on 1-2 cores).",
        ),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(
            parser=params.parse_path, metavar="PATH", help="Write one row per output to this .jsonl or .csv file."
        ),
    ] = None,
    shard: Annotated[
        Shard | None,
        typer.Option(
            parser=params.parse_shard,
            metavar="K/N",
            help="Explain only shard K (0 to N-1) of the inputs, split by their paths; each shard writes its own "
            "manifest, and gradcam merge OUTPUT_DIR joins them.",
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            parser=params.parse_engine, metavar="local|ray", help="Run here, or on a Ray cluster (pip extra [ray])."
        ),
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(metavar="ADDR", help="--engine ray: the cluster (default: RAY_ADDRESS, else a local one)."),
    ] = None,
    actors: Annotated[
        int | None,
        typer.Option(
            min=1, metavar="N", help="--engine ray: explaining actors (default: one per GPU, else one per two CPUs)."
        ),
    ] = None,
    gpus_per_worker: Annotated[
        float | None,
        typer.Option(min=0.0, metavar="G", help="--engine ray: GPUs per actor (default: 1 if the cluster has GPUs)."),
    ] = None,
    deterministic: Annotated[
        bool,
        typer.Option(
            "--deterministic", help="Seed every generator and use PyTorch's deterministic algorithms (recorded)."
        ),
    ] = False,
    skip_existing: Annotated[
        bool, typer.Option("--skip-existing", help="Skip images whose outputs all exist (resume).")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per image and target on stdout.")
    ] = False,
    list_layers: Annotated[
        bool, typer.Option("--list-layers", help="List every layer with its output shape and exit.")
    ] = False,
    list_models: Annotated[
        bool, typer.Option("--list-models", help="List the model names --model accepts and exit.")
    ] = False,
    quiet: params.QuietOpt = False,
    verbose: params.VerboseOpt = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    reporter = Reporter(quiet, verbose, as_json)
    ray_options = {"--ray-address": ray_address, "--actors": actors, "--gpus-per-worker": gpus_per_worker}
    ray_only = [name for name, value in ray_options.items() if value is not None]
    if engine != "ray" and ray_only:
        run_reported(reporter, lambda: refuse(f"{ray_only[0]} is for --engine ray; add --engine ray or leave it out"))
    if version:
        run_reported(reporter, lambda: _print_version(reporter))
    specs, mistake = params.target_specs(target)
    specs, region, mistake = scan_options.region_of(specs) if mistake is None else (specs, None, mistake)
    if mistake is not None:
        run_reported(reporter, lambda: params.refuse(mistake))
    explain = ExplainOptions(
        tuple(layer or ()),
        tuple(method),
        target_class,
        top_k,
        aug_smooth,
        eigen_smooth,
        score,
        score_threshold,
        max_detections,
        tuple(specs),
        embedding,
        PerturbationOptions(
            rise_masks, occlusion_window=occlusion_window, occlusion_stride=occlusion_stride, seed=seed
        ),
        AnswerOptions(prompt, answer, per_token, max_new_tokens, prompts),
        attention_heads=attention_heads,
        region=region,
    )
    command = ExplainCommand(
        reporter,
        inputs or [],
        ModelOptions(model, weights, num_classes, labels, input_size, device, explain.task_for(task), precision),
        explain,
        OutputOptions(
            output_dir,
            image_format,
            quality,
            alpha,
            colormap,
            save_raw,
            save_heatmap,
            panel,
            report,
            manifest,
            skip_existing,
            window_level,
        ),
        RunOptions(
            batch_size,
            workers,
            max_side=max_side or None,
            every=every,
            clip_stride=clip_stride,
            fps=fps,
            deterministic=deterministic,
            shard=shard,
            engine=engine,
            ray_address=ray_address,
            actors=actors,
            gpus_per_worker=gpus_per_worker,
        ),
        channels=tuple(channels) if channels is not None else None,
    )
    if list_models:
        run_reported(reporter, command.list_models)
    if list_layers:
        run_reported(reporter, command.list_layers)
    run_reported(reporter, command.run)


def _print_version(reporter: Reporter) -> int:
    from .. import __version__

    reporter.emit(f"gradcam-cli {__version__}")
    return EXIT_OK


class ExplainCommand:
    """The parsed command, run as one of its three actions; every action returns the exit code."""

    def __init__(
        self,
        reporter: Reporter,
        inputs: list[str],
        model: ModelOptions,
        explain: ExplainOptions,
        output: OutputOptions,
        run: RunOptions,
        channels: tuple[Path, ...] | None = None,
    ) -> None:
        self.reporter, self.inputs = reporter, inputs
        self.model_options, self.explain_options, self.output, self.run_options = model, explain, output, run
        self.channels = channels  # --channels: one scan's channel files; None: not given

    def list_models(self) -> int:
        from ..models.loading import available_models

        for name in available_models():
            self.reporter.emit(name)
        return EXIT_OK

    def list_layers(self) -> int:
        from .layer_list import list_layers

        return list_layers(self.reporter, self.model_options, self.inputs)

    def run(self) -> int:
        from ..cam.explainer import Explainer
        from ..io.discovery import discover_inputs
        from ..io.volumes import channel_files
        from ..pipeline.session import Session
        from ..pipeline.video import check_video_model, check_video_options, takes_clips
        from ..pipeline.volumes import check_channels, check_volume_options, model_inputs

        if self.explain_options.question.asked or self.explain_options.question.given():
            return answers.ask(self)
        channels = self.channels or ()
        if not self.inputs and not channels:
            raise UsageError("no input given; try: gradcam IMAGE_OR_DIR [--layer NAME], or gradcam --help")
        counted = channel_files(channels) if channels else 0  # their grids, before the model loads
        reporter = self.reporter
        warn = lambda message: reporter.info(f"warning: {message}")  # noqa: E731
        images, videos, scans = discover_inputs(self.inputs, self.output.output_dir, warn, channels)
        clips = bool(videos) and self.output.save_raw and takes_clips(self.model_options.model)
        check_video_options(self.output, videos, clips)  # before the model loads (a video model's --save-raw applies)
        check_volume_options(self.model_options, self.explain_options, self.output, self.run_options, scans, videos)
        with Session(self.output, self.run_options, notify=reporter.info) as session:
            passes = pass_methods(self.explain_options.methods)
            progress = PassProgress(reporter, f"{'/'.join(passes)} passes") if passes else None
            if self.run_options.engine == "ray":
                from ..pipeline.ray_engine import driver_explainer

                explainer = driver_explainer(self.model_options, self.explain_options, progress)
            else:
                explainer = Explainer.from_options(self.model_options, self.explain_options, progress=progress)
            named = [*self.inputs, *map(str, channels)]
            images, videos, scans = model_inputs(explainer, named, (images, videos, scans), self.output.output_dir)
            check_channels(explainer, channels, counted)
            check_video_model(explainer, self.output, self.run_options, videos, images)  # before any note
            single = len(images) + len(videos) + len(scans) == 1
            session.start(explainer)
            explainer_notes(reporter, explainer, bool(self.explain_options.layers))
            model = explainer.model
            reporter.detail(f"model {model.name} ({model.weights}, {explainer.adapter.label}) on {explainer.device}")
            started = time.perf_counter()  # the summary times the explaining, not the model's loading
            bars = lambda label, total: ProgressBar(reporter, total, label)  # noqa: E731
            shown: set[str] = set()
            adapter = explainer.adapter
            nothing = adapter.nothing_found(model, explainer.score, explainer.chosen.target)
            for record in session.explain(explainer, images, videos, progress=bars, scans=scans):
                reporter.record(record)
                report_record(reporter, record, single, record.input not in shown, adapter, nothing)
                shown.add(record.input)
        if session.gallery is not None:
            reporter.info(f"gallery written to {session.gallery}")
        if not single:
            unit = "inputs" if videos else "scans" if scans else "images"
            reporter.info(run_summary(session.counts, time.perf_counter() - started, unit))
        return EXIT_IMAGE_FAILED if session.counts.error else EXIT_OK
