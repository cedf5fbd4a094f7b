"""What ``gradcam eval`` says once the images are evaluated: failures and notes, then the ranking, the JSON or
the table, and the curve plot."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..errors import UsageError, describe
from .ranking import RankOptions, rank_report
from .reporting import Reporter

if TYPE_CHECKING:
    from ..evaluation.evaluate import AnyEvaluator
    from ..evaluation.report import EvalReport
    from ..io.discovery import InputImage
    from ..options import EvalOptions


def tell(
    reporter: Reporter,
    report: EvalReport,
    evaluator: AnyEvaluator,
    images: list[InputImage],
    options: EvalOptions,
    boxes: bool,
    ranking: RankOptions,
) -> None:
    """The failures and notes (``boxes``: boxes were given), then the ranking (with the seed spread: ``evaluator``
    re-runs a few images with other seeds), the JSON or the table, and the plot."""
    from ..evaluation.plot import write_plot
    from ..evaluation.table import format_report

    for failure in report.failed:
        reporter.error(failure.error or f"{failure.image}: failed")
    if report.unmatched_boxes:
        reporter.info(f"{report.unmatched_boxes} box(es) name no input image and were ignored")
    if report.undetected_boxes:
        reporter.info(f"{report.undetected_boxes} box(es) match no explained detection or class: not scored")
    unboxed = [image for image in report.ok if not any(s.boxes for s in image.methods.values())]
    if boxes and unboxed:
        kind = "label mask" if options.masks is not None else "boxes"
        reporter.info(f"{len(unboxed)} image(s) have no {kind}: scored for faithfulness only")
    if ranking.rank:
        rank_report(
            reporter, evaluator.explainer, report, images, ranking.report, options.seed, evaluator, ranking.seed_images
        )
    elif reporter.as_json:
        reporter.emit(json.dumps(report.to_dict()))
    for line in [] if ranking.rank else format_report(report):
        reporter.result(line)
    if options.plot is not None and report.ok:
        try:
            write_plot(report, options.plot)
        except OSError as error:
            raise UsageError(f"cannot write --plot {options.plot}: {describe(error, options.plot)}") from error
        reporter.info(f"curves plotted to {options.plot}")
