"""The ``gradcam serve`` command: parses its options, builds :func:`gradcam_cli.serve.create_app` and runs it on
uvicorn (:mod:`gradcam_cli.serve.server`). Torch loads after parsing.

:func:`gradcam_cli.cli.main` hands ``gradcam serve ...`` to this app, as it does ``gradcam eval``.
"""

from __future__ import annotations

import tempfile
import webbrowser
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..errors import EXIT_OK, UsageError, describe
from ..options import DEFAULT_METHOD, AnswerOptions, ExplainOptions, ModelOptions, ServeOptions
from . import answers, params
from .input_size import InputSizeOpt
from .layer_notes import default_layer_reason
from .reporting import Reporter, run_reported

if TYPE_CHECKING:
    from ..io.discovery import InputImage
    from ..serve.model import ModelService
    from ..serve.runs import ServedPaths

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

HELP = """Explore explanations in the browser: one image at a time, or a whole run.

PATH: a finished run's output folder (or its manifest), and/or image files, folders or quoted glob patterns.

A run is browsed without a model (paged, filtered and sorted on the server); with --model (or with images and no
run: the default model), any image can be explained live: click a class or type a target (--target's grammar), switch
layer or method, compare, download. A vision-language model (hf:DIR) is asked a question about the image instead:
its answer's map, then a clicked word's.
Listens on 127.0.0.1 unless --host says otherwise; stops with Ctrl-C (or SIGTERM, SIGHUP), its uploads removed.

Exit codes: 0 stopped; 2 usage error; 3 model/weights unavailable; 130 interrupted (Ctrl-C)."""


@app.command(help=HELP)
def serve(  # noqa: PLR0913  (a typer command: one parameter per option)
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
    method: params.MethodOpt = params.MethodList([DEFAULT_METHOD]),
    score: params.ScoreOpt = "logit",
    score_threshold: params.ScoreThresholdOpt = None,
    max_detections: params.MaxDetectionsOpt = None,
    device: params.DeviceOpt = "auto",
    input_size: InputSizeOpt = None,
    target: params.TargetsOpt = None,
    embedding: params.EmbeddingOpt = None,
    max_new_tokens: answers.MaxNewTokensOpt = None,
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

    wanted = ModelOptions(model or "resnet50", weights, num_classes, labels, input_size, device, task)
    explain = ExplainOptions(
        tuple(layer or ()),
        tuple(method),
        score=score,
        score_threshold=score_threshold,
        max_detections=max_detections,
        targets=tuple(specs),
        embedding=embedding,
        question=AnswerOptions(max_new_tokens=max_new_tokens),
    )
    run_reported(reporter, lambda: start(reporter, paths or [], model, (wanted, explain), options, drift, open_browser))


def record_targets(record: dict[str, Any]) -> list[Any]:
    """A run record's ``--target`` specs (its ``targets``, joined by `` | ``); none where it has none or they do not
    parse."""
    from ..targets import parse_targets

    text = record.get("targets")
    try:
        return list(parse_targets(text.split(" | "))) if isinstance(text, str) and text else []
    except ValueError:
        return []


def load_service(
    reporter: Reporter, model: ModelOptions, explain: ExplainOptions, record: dict[str, Any]
) -> ModelService:
    """The model, with the command's options, else the run record's (its layers and targets), else the defaults; a
    vision-language model, asked questions (:func:`load_answers`)."""
    from ..models.families import family_of
    from ..serve.model import ModelService

    if family_of(model.model).answers:
        return load_answers(reporter, model, explain)
    if explain.question.max_new_tokens is not None:
        raise UsageError("--max-new-tokens is for a vision-language model's answers (--model hf:DIR)")
    kept, embedding = record.get("layers"), record.get("embedding")  # the run's layer label, "a+b" for several
    explain = replace(
        explain,
        layers=explain.layers or (tuple(kept.split("+")) if isinstance(kept, str) and kept else ()),
        targets=explain.targets or tuple(record_targets(record)),
        embedding=explain.embedding or (embedding if isinstance(embedding, str) else None),
    )
    service = ModelService(replace(model, task=explain.task_for(model.task)), explain)
    if not explain.layers:
        reason = default_layer_reason(service.adapter, bool(service.model.default_layers))
        reporter.info(f"using layer {service.default_layer} ({reason})")
    return service


def load_answers(reporter: Reporter, model: ModelOptions, explain: ExplainOptions) -> ModelService:
    """A vision-language model, asked questions on the page (docs/serve.md); the options of classes, detections and
    targets are refused."""
    from ..cam.tasks.answer import ANSWER
    from ..serve.model import ModelService

    options = {
        "--task": model.task,
        "--num-classes": model.num_classes,
        "--labels": model.labels,
        "--input-size": model.input_size,
        "--score-threshold": explain.score_threshold,
        "--max-detections": explain.max_detections,
        "--target": explain.targets or None,
        "--embedding": explain.embedding,
    }
    refused = [name for name, value in options.items() if value is not None]
    if refused:
        raise UsageError(f"{refused[0]} does not apply to a vision-language model, which is asked questions")
    service = ModelService(ModelOptions(model.model, device=model.device), explain)
    if not explain.layers:
        reporter.info(ANSWER.layer_note(service.model, service.default_layer))
    return service


def _served(paths: list[str], drift: Path | None) -> tuple[ServedPaths, list[InputImage]]:
    """The paths sorted out (a run, images) and the images found, with ``--drift`` checked: refused before the
    port is bound and the model loads."""
    from ..io.discovery import discover
    from ..serve.runindex import read_drift
    from ..serve.runs import sort_paths

    served = sort_paths(paths)
    if drift is not None:
        if served.run is None:
            raise UsageError("--drift marks a run's rows; give a finished run's output folder or its manifest")
        read_drift(drift)  # a file that is no gradcam diff --json result: refused before the model loads
    inputs = discover(served.images) if served.images else []
    if served.images and not inputs:
        raise UsageError(f"no images found in {' '.join(served.images)}")
    return served, inputs


def start(
    reporter: Reporter,
    paths: list[str],
    model: str | None,
    wanted: tuple[ModelOptions, ExplainOptions],
    options: ServeOptions,
    drift: Path | None,
    open_browser: bool,
) -> int:
    """Sort the paths out, bind, load the model (``model``, with ``wanted``'s options: what to load and how to
    explain), print the URL and serve until Ctrl-C (or SIGTERM, SIGHUP)."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UsageError("gradcam serve needs the optional extra: pip install 'gradcam-cli[serve]'") from None
    from ..serve import create_app
    from ..serve.server import bind, is_loopback, serve, url_of

    served, inputs = _served(paths, drift)
    run = served.run
    try:  # bound before the model loads: a port in use is said at once
        sock = bind(options.host, options.port)
    except OSError as error:
        raise UsageError(f"cannot listen on {options.host}:{options.port}: {describe(error)}") from None
    service = None
    try:
        if not is_loopback(options.host):
            reporter.info(
                f"warning: listening on {options.host}: anyone who can reach this machine can use the explorer "
                "(and its model); use --host 127.0.0.1 to keep it local"
            )
        for note in served.notes:
            reporter.info(note)
        if model is None and run is None:
            model = "resnet50"
        if model is not None:
            loaded, explain = replace(wanted[0], model=model), wanted[1]
            service = load_service(reporter, loaded, explain, run.record if run is not None else {})
        with tempfile.TemporaryDirectory(prefix="gradcam-serve-") as work:  # uploads; removed when the server stops
            manifest = run.manifest if run is not None else None
            folder = run.folder if run is not None else None
            app = create_app(service, inputs, folder, manifest, options, drift, Path(work))
            url = url_of(sock)
            reporter.emit(f"serving on {url} (Ctrl-C to stop)")  # also with --quiet: the one way to learn a free port

            def started() -> None:
                if open_browser:
                    webbrowser.open(url)

            serve(app, sock, started)
    finally:
        sock.close()
        if service is not None:
            service.close()
    return EXIT_OK
