"""The ``gradcam diff`` command: parses its options, runs :func:`gradcam_cli.drift.compare.diff_runs`, reports.
Torch loads after parsing.

:func:`gradcam_cli.cli.main` hands ``gradcam diff ...`` to this app, as it does ``gradcam eval``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_OK, EXIT_USAGE
from ..options import MAX_PEAK_SHIFT, MIN_SIMILARITY, DiffOptions
from . import params
from .reporting import Reporter, run_reported

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

HELP = """Compare two runs' explanations and report drift.

BASELINE, CURRENT: manifests (.jsonl or .csv, as --manifest or --json wrote them) or output folders holding one.

Rows pair by input, method and target. Per pair: top-1 class change, target probability change, map similarity
(Spearman and Pearson), overlap of the top 10% (IoU) and how far the peak moved (a fraction of the image's
diagonal), from the .npy maps where both runs saved them (--save-raw), else from the rows' fingerprints.

Exit codes: 0 no drift; 1 drift (the images are named); 2 usage error (also a malformed manifest)."""


@app.command(help=HELP)
def diff(  # noqa: PLR0913  (a typer command: one parameter per option)
    baseline: Annotated[
        Path, typer.Argument(parser=params.parse_path, metavar="BASELINE", hidden=True, show_default=False)
    ],
    current: Annotated[
        Path, typer.Argument(parser=params.parse_path, metavar="CURRENT", hidden=True, show_default=False)
    ],
    min_similarity: Annotated[
        float,
        typer.Option(min=-1.0, max=1.0, metavar="S", help="Drift when either correlation of a pair's maps is below S."),
    ] = MIN_SIMILARITY,
    max_peak_shift: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, metavar="F", help="Drift when the peak moves more than F of the image's diagonal."
        ),
    ] = MAX_PEAK_SHIFT,
    allow_class_change: Annotated[
        bool, typer.Option("--allow-class-change", help="A changed target or top-1 class is no drift by itself.")
    ] = False,
    allow_missing: Annotated[
        bool, typer.Option("--allow-missing", help="Rows on one side only are listed but are no drift.")
    ] = False,
    report: Annotated[
        Path | None,
        typer.Option(
            parser=params.parse_folder,
            metavar="DIR",
            help="Write an HTML page, DIR/index.html: baseline | current | difference.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole comparison as one JSON object.")] = False,
    quiet: params.QuietOpt = False,
    verbose: params.VerboseOpt = False,
) -> None:
    reporter = Reporter(quiet, verbose, as_json, stdout_failure_code=EXIT_USAGE)  # 1 means drift

    def run() -> int:
        from ..drift.compare import diff_runs
        from ..drift.table import format_table, verdict

        options = DiffOptions(min_similarity, max_peak_shift, allow_class_change, allow_missing)
        result = diff_runs(baseline, current, options)
        if report is not None:
            from ..drift.page import write_report

            reporter.info(f"report written to {write_report(result, report)}")
        if reporter.as_json:
            reporter.emit(json.dumps(result.to_dict()))
        for line in format_table(result):
            reporter.result(line)
        reporter.info(verdict(result))
        return EXIT_IMAGE_FAILED if result.drift else EXIT_OK

    run_reported(reporter, run)
