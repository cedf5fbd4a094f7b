"""The ``gradcam serve`` command: parses its options, builds :func:`gradcam_cli.serve.create_app` and runs it on
uvicorn (:mod:`gradcam_cli.serve.server`). Torch loads after parsing.

:func:`gradcam_cli.cli.main` hands ``gradcam serve ...`` to this app, as it does ``gradcam eval``.
"""

from __future__ import annotations

import tempfile
import webbrowser
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import EXIT_OK, UsageError, describe
from ..options import ServeOptions
from . import params
from .reporting import Reporter, default_layer_reason, run_reported

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

HELP = """Explore explanations in the browser: one image at a time, or a whole run.

PATH: a finished run's output folder (or its manifest), and/or image files, folders or quoted glob patterns.

A run is browsed without a model (paged, filtered and sorted on the server); with --model (or with images and no
run: the default model), any image can be explained live: click a class or type a target (--target's grammar), switch
layer or method, compare, download.
Listens on 127.0.0.1 unless --host says otherwise; stops with Ctrl-C.

Exit codes: 0 stopped; 2 usage error; 3 model/weights unavailable; 130 interrupted (Ctrl-C)."""


@app.command(help=HELP)
def serve(
    paths: Annotated[list[str] | None, typer.Argument(metavar="PATH", hidden=True, show_default=False)] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            metavar="NAME",
            help="The model to explain with (as gradcam --model). Default: none for a run, resnet50 for images.",
        ),
    ] = None,
    task: params.TaskOpt = None,
    weights: params.WeightsOpt = "DEFAULT",
    num_classes: params.NumClassesOpt = None,
    labels: params.LabelsOpt = None,
    layer: params.LayerOpt = None,
    method: params.MethodOpt = params.MethodList(["gradcam"]),
    score: params.ScoreOpt = "logit",
    score_threshold: params.ScoreThresholdOpt = 0.5,
    max_detections: params.MaxDetectionsOpt = 10,
    device: params.DeviceOpt = "auto",
    input_size: params.InputSizeOpt = None,
    target: params.TargetsOpt = None,
    embedding: params.EmbeddingOpt = None,
    host: Annotated[
        str, typer.Option(metavar="HOST", help="Address to listen on (other than 127.0.0.1: a warning).")
    ] = ("127.0.0.1"),
    port: Annotated[int, typer.Option(min=0, max=65535, metavar="N", help="Port; 0 picks a free one.")] = 8765,
    drift: Annotated[
        Path | None,
        typer.Option(parser=params.parse_path, metavar="PATH", help="A gradcam diff --json result: drift per row."),
    ] = None,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the page in the default browser.")] = False,
    quiet: params.QuietOpt = False,
    verbose: params.VerboseOpt = False,
) -> None:
    reporter = Reporter(quiet, verbose, False)
    options = ServeOptions(host=host, port=port)
    specs, mistake = params.target_specs(target)
    if mistake is not None:
        run_reported(reporter, lambda: params.refuse(mistake))

    given = {
        "task": task,
        "weights": weights,
        "num_classes": num_classes,
        "labels": labels,
        "layer": layer,
        "method": method,
        "score": score,
        "score_threshold": score_threshold,
        "max_detections": max_detections,
        "device": device,
        "input_size": input_size,
        "targets": specs,
        "embedding": embedding,
    }
    run_reported(reporter, lambda: start(reporter, paths or [], model, options, drift, open_browser, given))


def split_paths(paths: list[str]) -> tuple[Path | None, Path | None, list[str]]:
    """``(run folder, manifest, image inputs)``: a folder holding a manifest (or a manifest file) is the run."""
    from ..drift.manifests import MANIFEST_SUFFIXES, find_manifest

    run_dir = manifest = None
    images: list[str] = []
    for text in paths:
        path = Path(text)
        is_manifest = path.is_file() and path.suffix.lower() in MANIFEST_SUFFIXES
        is_run = path.is_dir() and (any(path.glob("*.jsonl")) or any(path.glob("*.csv")))
        if (is_manifest or is_run) and manifest is None:
            manifest = find_manifest(path, "PATH")
            run_dir = path if path.is_dir() else path.parent
        else:
            images.append(text)
    return run_dir, manifest, images


def record_targets(record: dict[str, Any]) -> list[Any]:
    """A run record's ``--target`` specs (its ``targets``, joined by `` | ``); none where it has none or they do not
    parse."""
    from ..targets import parse_targets

    text = record.get("targets")
    try:
        return list(parse_targets(text.split(" | "))) if isinstance(text, str) and text else []
    except ValueError:
        return []


def start(
    reporter: Reporter,
    paths: list[str],
    model: str | None,
    options: ServeOptions,
    drift: Path | None,
    open_browser: bool,
    given: dict[str, Any],
) -> int:
    """Load what is asked, bind, print the URL and serve until Ctrl-C."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UsageError("gradcam serve needs the optional extra: pip install 'gradcam-cli[serve]'") from None
    from ..io.discovery import discover
    from ..pipeline.resume import read_run_record
    from ..serve import create_app
    from ..serve.model import ModelService
    from ..serve.server import bind, is_loopback, serve, url_of

    run_dir, manifest, image_paths = split_paths(paths)
    inputs = discover(image_paths) if image_paths else []
    if image_paths and not inputs:
        raise UsageError(f"no images found in {' '.join(image_paths)}")
    record = read_run_record(run_dir) if run_dir is not None else {}
    if model is None and manifest is None:
        model = "resnet50"
    service = None
    if model is not None:
        kept = record.get("layers")  # the run's layer label, "a+b" for several
        layers = given["layer"] or (kept.split("+") if isinstance(kept, str) and kept else None)
        specs, embedding = given["targets"] or record_targets(record), given["embedding"] or record.get("embedding")
        task = given["task"] or ("classify" if specs or embedding else None)  # as gradcam's own --target
        service = ModelService(
            params.model_options(
                model,
                given["weights"],
                given["num_classes"],
                given["labels"],
                given["input_size"],
                given["device"],
                task,
            ),
            params.explain_options(
                layers,
                given["method"],
                None,
                1,
                False,
                False,
                given["score"],
                score_threshold=given["score_threshold"],
                max_detections=given["max_detections"],
                targets=specs,
                embedding=embedding if isinstance(embedding, str) else None,
            ),
        )
        if not layers:
            reporter.info(f"using layer {service.default_layer} ({default_layer_reason(service.model.task)})")
    if not is_loopback(options.host):
        reporter.info(
            f"warning: listening on {options.host}: anyone who can reach this machine can use the explorer "
            "(and its model); use --host 127.0.0.1 to keep it local"
        )
    with tempfile.TemporaryDirectory(prefix="gradcam-serve-") as work:  # uploads; removed when the server stops
        app = create_app(service, inputs, run_dir, manifest, options, drift, Path(work))
        try:
            sock = bind(options.host, options.port)
        except OSError as error:
            raise UsageError(f"cannot listen on {options.host}:{options.port}: {describe(error)}") from None
        url = url_of(sock)
        reporter.emit(f"serving on {url} (Ctrl-C to stop)")  # also with --quiet: the one way to learn a free port

        def started() -> None:
            if open_browser:
                webbrowser.open(url)

        try:
            serve(app, sock, started)
        finally:
            if service is not None:
                service.close()
    return EXIT_OK
