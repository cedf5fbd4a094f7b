"""The ``gradcam eval`` command: parses options, runs :mod:`gradcam_cli.evaluate`, reports. Torch loads after parsing.

``gradcam.cli.main`` hands ``gradcam eval ...`` to this app (the main command takes positional inputs, so eval
cannot be a typer subcommand beside it).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .cli import Reporter, _build_explainer, _progress, run_app, run_reported
from .errors import EXIT_IMAGE_FAILED, EXIT_OK, UsageError

if TYPE_CHECKING:
    from .eval_report import EvalReport

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

PLOT_FORMATS = (".png", ".pdf", ".svg")
HELP = """Measure how faithful the maps are, and where the evidence lies.

Per method: deletion and insertion AUC (RISE; lower deletion, higher insertion is better), Average Drop and
Increase in Confidence (Grad-CAM++). With --boxes: pointing game (15-pixel tolerance) and the share of the map's
energy inside the boxes, per class, and the images whose evidence lies mostly outside the object. With --sanity:
the model-parameter randomisation test.

Exit codes: 0 all images evaluated; 1 some image failed; 2 usage error; 3 model/weights unavailable."""


@app.command(help=HELP)
def evaluate(
    inputs: Annotated[list[str], typer.Argument(help="Images, directories or glob patterns.")],
    method: Annotated[str, typer.Option(help="CAM method(s) to compare, comma-separated.")] = "gradcam",
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "-m",
            help="torchvision model name, efficientnet_lite0, package.module:factory or file.py:factory",
        ),
    ] = "resnet50",
    weights: Annotated[
        str, typer.Option("--weights", "-w", help="DEFAULT, a torchvision weights name, none, or a state-dict file.")
    ] = "DEFAULT",
    num_classes: Annotated[
        int | None, typer.Option(help="Classes of a replaced head (with --weights PATH).", min=1)
    ] = None,
    labels: Annotated[Path | None, typer.Option(help="Text file with one class name per line.")] = None,
    layer: Annotated[
        list[str] | None,
        typer.Option("--layer", "-l", help="Dotted module name (repeatable). Default: the last spatial layer."),
    ] = None,
    aug_smooth: Annotated[
        bool, typer.Option("--aug-smooth", help="Average each map over flipped and rescaled inputs (as gradcam).")
    ] = False,
    eigen_smooth: Annotated[
        bool, typer.Option("--eigen-smooth", help="First principal component instead of the weighted sum.")
    ] = False,
    target_class: Annotated[
        str | None,
        typer.Option("--target-class", "-t", help="Class to explain: index or name. Default: the top prediction."),
    ] = None,
    steps: Annotated[
        int, typer.Option(help="Points on the deletion/insertion curves: each step perturbs 1/STEPS of the pixels.")
    ] = 50,
    batch_size: Annotated[int, typer.Option(help="Perturbed images per forward pass.", min=1)] = 16,
    boxes: Annotated[
        Path | None,
        typer.Option(help="Ground truth: CSV image,x1,y1,x2,y2[,class], or a folder of Pascal VOC XML files."),
    ] = None,
    tolerance: Annotated[float, typer.Option(help="Pointing-game tolerance in pixels.", min=0.0)] = 15.0,
    sanity: Annotated[
        bool, typer.Option("--sanity", help="Run the model-parameter randomisation test (Adebayo et al. 2018).")
    ] = False,
    sanity_layers: Annotated[
        int, typer.Option(help="With --sanity: re-initialise the top 1..N parameterised modules, cascading.", min=1)
    ] = 3,
    plot: Annotated[
        Path | None, typer.Option(help="Write the mean deletion/insertion curves to this .png, .pdf or .svg.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole report as one JSON object.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    input_size: Annotated[int, typer.Option(help="Shorter side of the network input, in pixels.", min=16)] = 224,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print errors only.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="More detail, and tracebacks for failures.")] = False,
) -> None:
    reporter = Reporter(quiet, verbose, as_json)
    run_reported(reporter, _run, locals())


def _run(reporter: Reporter, args: dict[str, Any]) -> int:
    methods = [m.strip() for m in args["method"].split(",") if m.strip()]
    if not methods:
        raise UsageError("--method needs at least one method name")
    if args["steps"] < 2:
        raise UsageError("--steps must be at least 2")
    plot = args["plot"]
    if plot is not None and plot.suffix.lower() not in PLOT_FORMATS:
        raise UsageError(f"--plot {plot}: use a file ending in {', '.join(PLOT_FORMATS)}")

    from .boxes import read_boxes
    from .discovery import discover
    from .eval_report import EvalOptions, write_plot
    from .evaluate import Evaluator
    from .models import resolve_target

    images = discover(args["inputs"])
    if not images:
        raise UsageError(f"no images found in {' '.join(args['inputs'])}")
    boxes = read_boxes(args["boxes"]) if args["boxes"] is not None else None
    explainer = _build_explainer(reporter, {**args, "list_layers": False}, methods)
    options = EvalOptions(
        steps=args["steps"],
        batch_size=args["batch_size"],
        target=resolve_target(explainer.model, args["target_class"]),
        tolerance=args["tolerance"],
        sanity=args["sanity"],
        sanity_layers=args["sanity_layers"],
    )
    evaluator = Evaluator(explainer, options)
    started = time.perf_counter()
    with _progress(reporter, len(images), "evaluating") as progress:
        report = evaluator.run(images, boxes, on_image=progress)
    elapsed = time.perf_counter() - started
    for failure in report.failed:
        reporter.error(failure.error or f"{failure.image}: failed")
    if report.unmatched_boxes:
        reporter.info(f"{report.unmatched_boxes} box(es) name no input image and were ignored")
    unboxed = [image for image in report.ok if not any(s.boxes for s in image.methods.values())]
    if boxes and unboxed:
        reporter.info(f"{len(unboxed)} image(s) have no boxes: scored for faithfulness only")
    if args["as_json"]:
        print(json.dumps(report.to_dict()), flush=True)
    for line in format_report(report):
        reporter.result(line)
    if plot is not None and report.ok:
        try:
            write_plot(report, plot)
        except OSError as error:
            raise UsageError(f"cannot write --plot {plot}: {error.strerror or error}") from error
        reporter.info(f"curves plotted to {plot}")
    reporter.info(f"evaluated {len(report.ok)} image(s), {len(report.failed)} failed, in {elapsed:.1f}s")
    return EXIT_IMAGE_FAILED if report.failed else EXIT_OK


def _fmt(value: float | None, pattern: str = "{:.3f}") -> str:
    return "-" if value is None or math.isnan(value) else pattern.format(value)


def format_report(report: EvalReport) -> list[str]:
    """The human-readable report: a table of methods, then per-class pointing, outside-evidence and sanity lines."""
    summaries = {method: report.summary(method) for method in report.methods}
    lines = [
        f"model {report.model}, layer {'+'.join(report.layers)}, {len(report.ok)} image(s), "
        f"{report.options.steps} steps",
        "",
    ]
    header = ["method", "deletion AUC", "insertion AUC", "avg drop %", "increase %"]
    if report.has_boxes:
        header += ["pointing %", "energy in box"]
    if report.sanity_modules:
        header += ["sanity rho"]
    rows = []
    for method, s in summaries.items():
        if not s.get("images"):
            continue
        row = [
            method,
            _fmt(s["deletion_auc"]),
            _fmt(s["insertion_auc"]),
            _fmt(s["average_drop"], "{:.1f}"),
            _fmt(s["increase_in_confidence"], "{:.1f}"),
        ]
        if report.has_boxes:
            overall = s["pointing"]["overall"]
            row += [_fmt(overall["accuracy"], "{:.1f}"), _fmt(overall["energy"])]
        if report.sanity_modules:
            row += [_fmt(max(s["sanity"]["spearman"]))]
        rows.append(row)
    lines += _table(header, rows)
    lines.append("(lower is better: deletion AUC, avg drop, sanity rho; higher is better: the others)")
    if report.sanity_modules:
        lines.append("(sanity rho: the highest mean Spearman correlation over the randomisation cascade)")
    for method, s in summaries.items():
        per_class = s.get("pointing", {}).get("per_class", {})
        if per_class:
            lines += ["", f"by class ({method}):"]
            class_rows = [
                [label, str(c["count"]), _fmt(c["accuracy"], "{:.1f}"), _fmt(c["energy"])]
                for label, c in per_class.items()
            ]
            lines += ["  " + line for line in _table(["class", "images", "pointing %", "energy in box"], class_rows)]
    for method, s in summaries.items():
        outside = s.get("outside")
        if outside:
            lines += ["", f"evidence mostly outside the object ({method}; energy in box below 0.5, worst first):"]
            for row in outside:
                label = f" [{row['class']}]" if row["class"] else ""
                hit = "hit" if row["hit"] else "miss"
                lines.append(
                    f"  {_fmt(row['energy'], '{:.2f}')}  {row['image']}{label}  "
                    f"(explained {row['explained']} {row['probability']:.0%}, pointing {hit})"
                )
    for method, s in summaries.items():
        sanity = s.get("sanity")
        if sanity:
            stages = ", ".join(f"top {k}: {_fmt(rho, '{:.2f}')}" for k, rho in enumerate(sanity["spearman"], 1))
            verdict = (
                f"FLAGGED: maps barely change when the model is randomised (rho > {sanity['threshold']})"
                if sanity["flagged"]
                else "ok: maps depend on the trained parameters"
            )
            lines += ["", f"sanity ({method}): Spearman rho with re-initialised {', '.join(sanity['modules'])}"]
            lines.append(f"  {stages} -> {verdict}")
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


def main(argv: list[str] | None = None) -> None:
    """Run ``gradcam eval`` with ``argv`` (default: the process arguments after ``eval``)."""
    run_app(app, "gradcam eval", sys.argv[2:] if argv is None else argv)
