"""The ``gradcam`` command: parses options, calls the library, reports. Torch is imported only after parsing."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .errors import EXIT_IMAGE_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, GradcamError, UsageError

if TYPE_CHECKING:
    from .batch import Record
    from .explain import Explainer
    from .layers import LayerInfo

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

EXIT_CODES_HELP = "Exit codes: 0 all images explained; 1 some image failed; 2 usage error; 3 model/weights unavailable."
METHOD_HELP = (
    "CAM method(s), comma-separated; each writes its own output: gradcam, gradcam++, xgradcam, hirescam, layercam "
    "(one backward pass per target, shared), eigencam (no backward pass, class-agnostic), scorecam (no backward "
    "pass but one extra forward pass per channel of the layer, e.g. 2048 for resnet50 layer4, batched 32 at a time)."
)


class Reporter:
    """Human messages on stderr (or stdout for results when not --json), JSON lines on stdout."""

    def __init__(self, quiet: bool, verbose: bool, as_json: bool) -> None:
        self.quiet, self.verbose, self.as_json = quiet, verbose, as_json

    def info(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr)

    def detail(self, message: str) -> None:
        if self.verbose and not self.quiet:
            print(message, file=sys.stderr)

    def result(self, message: str) -> None:
        if not self.quiet and not self.as_json:
            print(message)

    def error(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)

    def record(self, record: Record) -> None:
        from .manifest import record_to_dict

        if self.as_json:
            print(json.dumps(record_to_dict(record)), flush=True)


@app.command(help=f"Explain what a vision classifier looks at with Grad-CAM overlays.\n\n{EXIT_CODES_HELP}")
def explain(
    inputs: Annotated[list[str] | None, typer.Argument(help="Images, directories or glob patterns.")] = None,
    layer: Annotated[
        list[str] | None,
        typer.Option(
            "--layer",
            "-l",
            help="Dotted module name (repeatable; several layers are fused). Default: the last spatial layer.",
        ),
    ] = None,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="torchvision model name, efficientnet_lite0, package.module:factory or file.py:factory.",
        ),
    ] = "resnet50",
    weights: Annotated[
        str,
        typer.Option(
            "--weights", "-w", help="DEFAULT, a torchvision weights name (IMAGENET1K_V1), none, or a state-dict file."
        ),
    ] = "DEFAULT",
    num_classes: Annotated[
        int | None, typer.Option(help="Classes of a replaced head (with --weights PATH).", min=1)
    ] = None,
    labels: Annotated[Path | None, typer.Option(help="Text file with one class name per line.")] = None,
    target_class: Annotated[
        str | None,
        typer.Option("--target-class", "-t", help="Class to explain: index or name. Default: the top prediction."),
    ] = None,
    top_k: Annotated[
        int, typer.Option("--top-k", "-k", help="Explain each of the top K classes (one output each).", min=1)
    ] = 1,
    method: Annotated[str, typer.Option(help=METHOD_HELP)] = "gradcam",
    aug_smooth: Annotated[
        bool,
        typer.Option(
            "--aug-smooth",
            help="Average each map over flipped and rescaled inputs (x0.75, x1, x1.25; 6 passes; flips only for "
            "fixed-size models such as ViT), each mapped back to the image first.",
        ),
    ] = False,
    eigen_smooth: Annotated[
        bool,
        typer.Option(
            "--eigen-smooth",
            help="Use the first principal component of the weighted activations instead of their sum (less noise).",
        ),
    ] = False,
    alpha: Annotated[float, typer.Option(help="Heatmap opacity in the overlay.", min=0.0, max=1.0)] = 0.5,
    colormap: Annotated[str, typer.Option(help="Any matplotlib colormap name.")] = "jet",
    image_format: Annotated[str, typer.Option("--format", help="Overlay file format: png, jpg or webp.")] = "png",
    save_raw: Annotated[
        bool, typer.Option("--save-raw", help="Also save each map as float32 .npy (H x W, [0,1]).")
    ] = False,
    save_heatmap: Annotated[
        bool, typer.Option("--save-heatmap", help="Also save the colour-mapped heatmap alone (in --format).")
    ] = False,
    quality: Annotated[
        int, typer.Option(help="JPEG/WebP quality of overlays, heatmaps and panels (1-100).", min=1, max=100)
    ] = 90,
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
    every: Annotated[int, typer.Option(help="Videos: explain every Nth frame and hold its map in between.", min=1)] = 1,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Where outputs go (input tree mirrored).")
    ] = Path("gradcam_out"),
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    input_size: Annotated[int, typer.Option(help="Shorter side of the network input, in pixels.", min=16)] = 224,
    batch_size: Annotated[
        int | None, typer.Option(help="Images per forward pass (default: 4 on the CPU, 16 on a GPU).", min=1)
    ] = None,
    max_side: Annotated[
        int,
        typer.Option(
            help="Shrink images whose longer side is larger by a whole factor first, so overlays and maps are at "
            "most this big (0: never; see Batch processing in the README).",
            min=0,
        ),
    ] = 4096,
    workers: Annotated[
        int | None, typer.Option(help="Decoding processes (default: spare cores, at most 4).", min=0)
    ] = None,
    manifest: Annotated[Path | None, typer.Option(help="Write one row per output to this .jsonl or .csv file.")] = None,
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
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print errors only.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More detail, and tracebacks for failures.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    reporter = Reporter(quiet, verbose, as_json)
    if version:
        from . import __version__

        print(f"gradcam-cli {__version__}")
        raise typer.Exit(EXIT_OK)
    run_reported(reporter, _run, locals())


def run_reported(reporter: Reporter, run: Callable[[Reporter, dict], int], args: dict) -> None:
    """Run a command's body; a GradcamError or Ctrl-C becomes one error line and its exit code."""
    try:
        code = run(reporter, args)
    except GradcamError as error:
        if reporter.verbose:
            import traceback

            traceback.print_exc()
        reporter.error(str(error))
        code = error.exit_code
    except KeyboardInterrupt:
        reporter.error("interrupted")
        code = EXIT_INTERRUPTED
    raise typer.Exit(code)


def _run(reporter: Reporter, args: dict) -> int:
    from .models import available_models

    if args["list_models"]:
        for name in available_models():
            print(name)
        return EXIT_OK
    methods = [m.strip() for m in args["method"].split(",") if m.strip()]
    image_format = args["image_format"].lower().lstrip(".").replace("jpeg", "jpg")
    if image_format not in ("png", "jpg", "webp"):
        raise UsageError(f"--format {args['image_format']!r}: use png, jpg or webp")
    if not args["inputs"] and not args["list_layers"]:
        raise UsageError("no input given; try: gradcam IMAGE_OR_DIR [--layer NAME], or gradcam --help")

    from .discovery import VIDEO_SUFFIXES, discover

    # Video files (by suffix) go to the video runner; everything else is discovered as images.
    videos = [raw for raw in args["inputs"] or [] if Path(raw).suffix.lower() in VIDEO_SUFFIXES and Path(raw).is_file()]
    others = [raw for raw in args["inputs"] or [] if raw not in videos]
    warn = lambda message: reporter.info(f"warning: {message}")  # noqa: E731
    images = discover(others, exclude=args["output_dir"], warn=warn) if others else []
    if args["inputs"] and not images and not videos:
        raise UsageError(f"no images found in {' '.join(args['inputs'])}")
    args["videos"] = discover(videos) if videos else []

    explainer = _build_explainer(reporter, args, methods)
    if args["list_layers"]:
        _print_layers(explainer, images[0].path if images else None, args["as_json"])
        return EXIT_OK
    return _explain_all(reporter, explainer, images, args, image_format)


def _build_explainer(reporter: Reporter, args: dict, methods: list[str]) -> Explainer:
    from .devices import resolve_device
    from .explain import Explainer
    from .models import load_model, resolve_target

    device = resolve_device(args["device"])
    loaded = load_model(args["model"], args["weights"], args["num_classes"], args["labels"], args["input_size"])
    resolve_target(loaded, args["target_class"])  # a bad --target-class fails before anything is announced
    explainer = Explainer(
        loaded, args["layer"] or None, methods, device, aug_smooth=args["aug_smooth"], eigen_smooth=args["eigen_smooth"]
    )
    if "scorecam" in methods:
        explainer.progress = _PassProgress(reporter)
    if not args["layer"] and not args["list_layers"]:
        reporter.info(f"using layer {explainer.layer_names[0]} (last spatial layer; choose with --layer)")
    reporter.detail(f"model {loaded.name} ({loaded.weights}) on {device}")
    return explainer


def _print_layers(explainer: Explainer, image_path: Path | None, as_json: bool) -> None:
    from .images import load_image, to_input_tensor
    from .layers import default_layer, inspect_layers

    spec = explainer.model.input_spec
    if image_path is not None:
        example = to_input_tensor(load_image(image_path), spec).unsqueeze(0)
    else:
        height, width = spec.fixed_size or (spec.size, spec.size)
        import torch

        example = torch.zeros(1, 3, height, width)
    module = explainer.model.module
    infos = inspect_layers(module, example.to(explainer.device))
    chosen = default_layer(module, infos)
    for info in infos:
        if not info.name:
            continue
        if as_json:
            print(json.dumps({**_layer_row(info), "default": info.name == chosen}))
            continue
        print(_layer_line(info, chosen))
    if not as_json:
        print(
            "\n* default layer   + candidate (spatial output: N,C,H,W, channel-last N,H,W,C or ViT tokens N,L,C; "
            "more than one position)   xN: runs N times per forward "
            "(its last call is explained)"
        )


def _layer_row(info: LayerInfo) -> dict:
    return {
        "name": info.name,
        "type": info.kind,
        "output_shape": info.output_shape,
        "calls": info.calls,
        "candidate": info.is_candidate,
    }


def _layer_line(info: LayerInfo, chosen: str) -> str:
    mark = "*" if info.name == chosen else "+" if info.is_candidate else " "
    shape = "x".join(map(str, info.output_shape)) if info.output_shape else "-" if info.calls == 0 else "(non-tensor)"
    calls = f"x{info.calls}" if info.calls > 1 else ""
    return f"{mark} {info.name:<40} {info.kind:<28} {shape:<20} {calls}"


def _explain_all(reporter: Reporter, explainer: Explainer, images: list, args: dict, image_format: str) -> int:
    from contextlib import ExitStack

    from .batch import BatchRunner, RunOptions
    from .loading import default_batch_size, default_workers
    from .manifest import ManifestWriter
    from .models import resolve_target
    from .render import remove_stale_temporaries

    options = RunOptions(
        output_dir=args["output_dir"],
        alpha=args["alpha"],
        colormap=args["colormap"],
        save_raw=args["save_raw"],
        image_format=image_format,
        target=resolve_target(explainer.model, args["target_class"]),
        top_k=args["top_k"],
        batch_size=args["batch_size"] or default_batch_size(explainer.device),
        workers=default_workers() if args["workers"] is None else args["workers"],
        skip_existing=args["skip_existing"],
        max_side=args["max_side"] or None,
        quality=args["quality"],
        save_heatmap=args["save_heatmap"],
        panel=args["panel"],
        report=args["report"],
    )
    runner = BatchRunner(explainer, options)
    remove_stale_temporaries(options.output_dir)
    counts = {"ok": 0, "error": 0, "skipped": 0}
    started = time.perf_counter()
    videos = args.get("videos") or []
    single = len(images) + len(videos) == 1
    records: list[Record] = []  # kept for --report's gallery
    with ExitStack() as stack:
        if args["report"]:
            stack.callback(_write_report, reporter, records, options.output_dir)
        writer = stack.enter_context(ManifestWriter(args["manifest"])) if args["manifest"] else None
        seen: set[str] = set()

        def handle(record: Record) -> None:
            if writer:
                writer.write(record)
            reporter.record(record)
            if args["report"]:
                records.append(record)
            first_row = record.input not in seen
            seen.add(record.input)
            if first_row:
                counts[record.status] += 1
            _report_record(reporter, record, single, first_row)

        if images:
            with _progress(reporter, len(images)) as progress:
                for record in runner.run(images, on_image=progress):
                    handle(record)
        if videos:
            _explain_videos(reporter, explainer, options, videos, args["every"], handle)
    elapsed = time.perf_counter() - started
    if not single:
        done = counts["ok"] + counts["error"]
        reporter.info(
            f"done: {counts['ok']} ok, {counts['error']} failed, {counts['skipped']} skipped "
            f"in {elapsed:.1f}s ({done / elapsed if elapsed else 0:.2f} images/s)"
        )
    return EXIT_IMAGE_FAILED if counts["error"] else EXIT_OK


def _explain_videos(
    reporter: Reporter, explainer: Explainer, options: Any, videos: list, every: int, handle: Any
) -> None:
    """Explain each video clip with a per-clip frame progress bar, passing its records to ``handle``."""
    from .video import VideoRunner, probe

    runner = VideoRunner(explainer, options, every)
    for video in videos:
        try:
            frames = probe(video.path).frames
        except GradcamError:
            frames = 0
        with _progress(reporter, frames, f"{video.path.name}: frames") as progress:
            for record in runner.run(video, on_frame=progress):
                handle(record)


def _write_report(reporter: Reporter, records: list[Record], output_dir: Path) -> None:
    """--report: the gallery of this run's records, written at the end (also after an interrupt or error)."""
    from .gallery import write_gallery

    if records:
        reporter.info(f"gallery written to {write_gallery(records, output_dir)}")


def _report_record(reporter: Reporter, record: Record, single: bool, first_row: bool) -> None:
    if record.status == "error":
        reporter.error(record.error or f"{record.input}: failed")
        return
    if record.status == "skipped":
        reporter.detail(f"skipped {record.input} (outputs exist)")
        return
    if single and first_row:
        reporter.result(f"{record.input}  (model {record.model}, layer {record.layer})")
        for rank, p in enumerate(record.predictions, 1):
            reporter.result(f"  {rank}. {p.name:<30} {p.probability:7.2%}  (class {p.index})")
    target = record.target
    label = f"{target.name} ({target.probability:.1%})" if target else "each frame's own top class"
    line = f"{record.method} for {label} -> {record.outputs[0]}"
    reporter.result(f"  {line}" if single else f"{record.input}: {line}")


def _rate_column(unit: str = "img") -> Any:  # built lazily: rich loads only when a bar is shown
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"{task.speed:.1f} {unit}/s" if task.speed else "")

    return RateColumn()


class _progress:
    """A rich progress bar on stderr when it is a terminal and not --quiet; otherwise a no-op callback."""

    def __init__(self, reporter: Reporter, total: int, label: str = "explaining") -> None:
        self.enabled = total > 1 and not reporter.quiet and sys.stderr.isatty()
        self.total = total
        self.label = label

    def __enter__(self) -> _progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                _rate_column("frames" if self.label.endswith("frames") else "img"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
                redirect_stdout=sys.stdout.isatty(),  # piped results (--json) must stay on stdout, not the bar's stderr
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total)
            _progress.active = self
        return self

    def __call__(self) -> None:
        if self.enabled:
            self.bar.advance(self.task)

    def __exit__(self, *exc_info: object) -> None:
        if self.enabled:
            _progress.active = None
            self.bar.__exit__(*exc_info)

    active: _progress | None = None
    """The bar on screen, if any: scorecam's forward passes show as a second row in it."""


class _PassProgress:
    """scorecam's masked forward passes as a transient bar on stderr (terminal and not --quiet only): a row of
    its own under the image bar when that shows, else a bar of its own."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.own: _progress | None = None
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            if done >= total or self.reporter.quiet or not sys.stderr.isatty():
                return
            host = _progress.active
            if host is None:
                self.own = _progress(self.reporter, total, "scorecam passes").__enter__()
                if not self.own.enabled:
                    self.own = None
                    return
                self.bar, self.task = self.own.bar, self.own.task
            else:
                self.bar, self.task = host.bar, host.bar.add_task("scorecam passes", total=total)
        self.bar.update(self.task, completed=done)
        if done >= total:
            if self.own is not None:
                self.own.__exit__(None, None, None)
                self.own = None
            else:
                self.bar.remove_task(self.task)
            self.task = None


def main() -> None:
    """Console-script entry point; ``gradcam eval ...`` goes to :mod:`gradcam_cli.cli_eval`."""
    # Before torch loads OpenMP: threads that wait sleep instead of spinning. Spinning threads fight the decoding
    # processes, the writer threads and any other program for the cores (several times slower on a busy machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if sys.argv[1:2] == ["eval"]:
        from .cli_eval import main as eval_main

        eval_main()
        return
    run_app(app, "gradcam", sys.argv[1:])


def run_app(typer_app: typer.Typer, prog_name: str, args: list[str]) -> None:
    """Run a typer app; option-parsing mistakes end in one line on stderr and exit 2, not click's usage block."""
    try:
        code = typer_app(args=args, prog_name=prog_name, standalone_mode=False)
    except Exception as error:
        # click's ClickException (typer >= 0.2x vendors click): duck-typed so that every typer version works.
        if type(error).__name__ == "Abort":
            print("error: interrupted", file=sys.stderr)
            code = EXIT_INTERRUPTED
        elif hasattr(error, "format_message"):
            print(f"error: {error.format_message()} (see {prog_name} --help)", file=sys.stderr)
            code = getattr(error, "exit_code", EXIT_USAGE)
        else:
            raise
    sys.exit(code or EXIT_OK)
