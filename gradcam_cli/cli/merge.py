"""The ``gradcam merge`` command: parses its options, runs :func:`gradcam_cli.pipeline.merge.merge_shards`, reports.
Torch loads after parsing.

:func:`gradcam_cli.cli.main` hands ``gradcam merge ...`` to this app, as it does ``gradcam eval``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import EXIT_IMAGE_FAILED, EXIT_OK
from . import params
from .reporting import Reporter, run_reported

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

HELP = """Merge the shards of a gradcam --shard K/N run into one manifest (and gallery).

OUTPUT_DIR: the --output-dir every shard wrote into. Its manifest gets every shard's rows, in the order of one
run over all the inputs; with --report (the default when the shards ran with it) index.html covers them all.

Exit codes: 0 every input explained or skipped; 1 some input failed; 2 usage error (a shard missing or unfinished,
shards made with other settings or over other inputs, a shard still running)."""


@app.command(help=HELP)
def merge(
    output_dir: Annotated[
        Path, typer.Argument(parser=params.parse_folder, metavar="OUTPUT_DIR", hidden=True, show_default=False)
    ],
    partial: Annotated[
        bool, typer.Option("--partial", help="Merge the shards there are, though some never ran or did not finish.")
    ] = False,
    report: Annotated[
        bool | None,
        typer.Option(
            "--report/--no-report", help="Write the gallery, OUTPUT_DIR/index.html (default: if the shards did)."
        ),
    ] = None,
    quiet: params.QuietOpt = False,
    verbose: params.VerboseOpt = False,
) -> None:
    reporter = Reporter(quiet, verbose, as_json=False)

    def run() -> int:
        from ..pipeline.merge import merge_shards

        merged = merge_shards(output_dir, partial, report)
        if merged.left_out:
            reporter.info(f"warning: left out shards {', '.join(map(str, merged.left_out))} (missing or unfinished)")
        if merged.gallery is not None:
            reporter.info(f"gallery written to {merged.gallery}")
        counts = merged.counts
        reporter.info(
            f"merged {len(merged.merged)} of {merged.count} shards into {merged.manifest}: {counts.ok} ok, "
            f"{counts.error} failed, {counts.skipped} skipped"
        )
        return EXIT_IMAGE_FAILED if counts.error else EXIT_OK

    run_reported(reporter, run)
