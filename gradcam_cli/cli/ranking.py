"""``gradcam eval --rank``'s reporting: the ranking table (or one JSON object per row) and the ``--report`` page.
The ranking itself is :mod:`gradcam_cli.evaluation.rank`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError, describe
from .reporting import Reporter

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..evaluation.report import EvalReport
    from ..io.discovery import InputImage

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


def rank_report(
    reporter: Reporter,
    explainer: Explainer,
    report: EvalReport,
    images: list[InputImage],
    folder: Path | None,
    seed: int,
) -> None:
    """Print the ranking (``--json``: one object per row) and write the ``--report`` page."""
    from ..evaluation.rank import format_ranking, rank
    from ..evaluation.rank_page import write_rank_report

    rows = rank(report, seed)
    if reporter.as_json:
        for row in rows:
            reporter.emit(json.dumps(row.to_dict()))
    for line in format_ranking(rows):
        reporter.result(line)
    if folder is None:
        return
    failed = {image.image for image in report.failed}
    shown = [image for image in images if str(image.path) not in failed][:EXAMPLES]
    examples = [(image.path.name, explainer.explain(image.path)) for image in shown]  # its --target(-class)
    try:
        page = write_rank_report(folder, report, rows, examples)
    except OSError as error:
        raise UsageError(f"cannot write --report {folder}: {describe(error, folder)}") from error
    reporter.info(f"ranking report written to {page}")
