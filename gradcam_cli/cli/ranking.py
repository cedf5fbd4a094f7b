"""``gradcam eval --rank``'s reporting: the ranking table (or one JSON object per row) and the ``--report`` page.
The ranking itself is :mod:`gradcam_cli.evaluation.rank`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import UsageError, describe
from . import params
from .reporting import ProgressBar, Reporter

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..evaluation.evaluate import AnyEvaluator, Evaluator
    from ..evaluation.meta import MetaRow
    from ..evaluation.rank import RankRow
    from ..evaluation.report import EvalReport
    from ..io.discovery import InputImage

RankOpt = Annotated[
    bool,
    typer.Option(
        "--rank",
        help="Measure everything (--sanity, --road, --stability, ...) and rank the methods per metric, with 95% "
        "bootstrap confidence intervals; marks methods that fail the sanity check or do not beat randomcam.",
    ),
]
ReportOpt = Annotated[
    Path | None,
    typer.Option(
        "--report",
        parser=params.parse_path,
        metavar="DIR",
        help="With --rank: write an HTML page (table, curves, box plots, example maps side by side) into DIR.",
    ),
]
SkipExistingOpt = Annotated[
    bool,
    typer.Option(
        "--skip-existing",
        help="With --rank --report DIR: resume, keeping the (image, method) results already in DIR/rows.jsonl "
        "(written as each finishes).",
    ),
]
BudgetOpt = Annotated[
    float | None,
    typer.Option(
        min=0.0,
        metavar="SECONDS",
        help="With --rank: keep randomcam, then the methods in --method order while their estimated time fits "
        "SECONDS for the whole run "
        "(default for --method all on a CPU: 600).",
    ),
]
"""``gradcam eval``'s options of ``--rank`` (parsed by :mod:`gradcam_cli.cli.eval`)."""

EXAMPLES = 3
"""Images shown on the ``--report`` page with every method's map side by side."""


@dataclass(frozen=True)
class RankOptions:
    """``--rank`` and its ``--report`` folder."""

    rank: bool = False
    report: Path | None = None
    skip_existing: bool = False
    """Resume from the rows file in ``report`` (:mod:`gradcam_cli.evaluation.rows`)."""
    budget: float | None = None
    """Seconds the whole run may take, for the plan of ``--method all`` on a CPU (None: :data:`BUDGET`)."""
    seed_images: int | None = None
    """Images the seed spread re-runs, as the plan chose (None: :data:`SEED_SUBSET`)."""


def rank_report(
    reporter: Reporter,
    explainer: Explainer,
    report: EvalReport,
    images: list[InputImage],
    folder: Path | None,
    seed: int,
    evaluator: AnyEvaluator | None = None,
    seed_images: int | None = None,
) -> None:
    """Print the ranking (``--json``: one object per row) and write the ``--report`` page; with the ``evaluator``
    that made ``report``, first re-run ``seed_images`` images (None: :data:`SEED_SUBSET`) with other seeds for each
    method's seed spread (:mod:`gradcam_cli.evaluation.seeds`; its rows kept in the rows file). Ctrl-C during the
    seed spread prints the ranking without it, then stops."""
    from ..evaluation.evaluate import Evaluator
    from ..evaluation.plan import SEED_RERUNS, SEED_SUBSET, rerun_images
    from ..evaluation.rank import rank

    spread = {}
    subset = SEED_SUBSET if seed_images is None else seed_images
    reruns = rerun_images(report.methods, evaluator.options, len(report.ok), subset) if evaluator else 0
    if isinstance(evaluator, Evaluator) and reruns:
        reporter.info(f"seed spread: re-running {reruns // SEED_RERUNS} image(s) with {SEED_RERUNS} other seeds ...")
        try:
            spread = _seed_spread(evaluator, report, subset, folder)
        except KeyboardInterrupt:
            kept = f"; its finished re-runs are in {folder}, add --skip-existing to resume" if folder else ""
            reporter.info(f"interrupted during the seed spread: the ranking without it{kept}")
            _print_ranking(reporter, rank(report, seed), report)
            raise
    rows = rank(report, seed, spread=spread)
    meta = _print_ranking(reporter, rows, report)
    if folder is None:
        return
    from ..evaluation.rank_page import write_rank_report

    failed = {image.image for image in report.failed}
    shown = [image for image in images if str(image.path) not in failed][:EXAMPLES]
    profile = explainer.model.profile
    shown = shown if profile.clips is None and profile.volume is None else []  # clips and scans: no example maps
    examples = [(image.path.name, explainer.explain(image.path)) for image in shown]  # its --target(-class)
    try:
        page = write_rank_report(folder, report, rows, examples, meta)
    except OSError as error:
        raise UsageError(f"cannot write --report {folder}: {describe(error, folder)}") from error
    reporter.info(f"ranking report written to {page}")


def _seed_spread(
    evaluator: Evaluator, report: EvalReport, subset: int, folder: Path | None
) -> dict[str, dict[str, float]]:
    """The seed spread, its re-runs' rows appended to ``folder``'s rows file (those there before kept)."""
    from ..evaluation.rows import ROWS_NAME, RowsFile, read_seed_rows
    from ..evaluation.seeds import seed_spread

    path = folder / ROWS_NAME if folder is not None else None
    if path is None or not path.exists():
        return seed_spread(evaluator, report, subset)
    rows = RowsFile(path, {}, resume=True)
    try:
        done = read_seed_rows(path, evaluator.explainer.chosen.methods)
        return seed_spread(evaluator, report, subset, done, lambda k, scores: rows.append(scores, k))
    finally:
        rows.close()


def _print_ranking(reporter: Reporter, rows: list[RankRow], report: EvalReport) -> list[MetaRow]:
    """Print the ranking and, with ``--meta``, its meta-evaluation (``--json``: one object per row, each ranking row
    then each metric's meta-evaluation; docs/rank.schema.json); the meta-evaluation's rows."""
    from ..evaluation.meta import format_meta, meta_rows
    from ..evaluation.rank import format_ranking

    meta = meta_rows(report, rows)
    if reporter.as_json:
        for row in rows:
            reporter.emit(json.dumps(row.to_dict()))
        for checked in meta:
            reporter.emit(json.dumps(checked.to_dict()))
    for line in [*format_ranking(rows), *format_meta(meta)]:
        reporter.result(line)
    return meta


class MethodSteps:
    """``gradcam eval``'s progress, one step per image and method: ``method(name)`` as a method's work on an image
    begins (the bar reads ``image 2/5 · scorecam``, with the plan's estimate for it where there is one) and counts
    the step of the method before it; ``image()`` once the image is done counts its steps not yet counted (the
    last method's; all of a failed image's or of a task evaluator's, which has no per-method work)."""

    def __init__(
        self, bar: ProgressBar, images: int, methods: int, first: int = 0, seconds: dict[str, float] | None = None
    ) -> None:
        self.bar, self.images, self.methods = bar, images, methods
        self.seconds = seconds or {}
        self.image_number = first + 1
        self.begun = 0  # methods begun on this image

    def method(self, name: str) -> None:
        if 0 < self.begun <= self.methods:
            self.bar()
        self.begun += 1
        estimate = f" (~{self.seconds[name]:.0f}s)" if name in self.seconds else ""
        self.bar.describe(f"image {self.image_number}/{self.images} · {name}{estimate}")

    def image(self) -> None:
        for _ in range(self.methods - max(0, self.begun - 1)):
            self.bar()
        self.image_number += 1
        self.begun = 0
