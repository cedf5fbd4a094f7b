"""``gradcam eval --rank``'s reporting: the ranking table (or one JSON object per row) and the ``--report`` page.
The ranking itself is :mod:`gradcam_cli.evaluation.rank`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError, describe
from .reporting import ProgressBar, Reporter

if TYPE_CHECKING:
    from ..cam.explainer import Explainer
    from ..evaluation.evaluate import Evaluator
    from ..evaluation.report import EvalReport
    from ..evaluation.tasks import TaskEvaluator
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
    evaluator: Evaluator | TaskEvaluator | None = None,
) -> None:
    """Print the ranking (``--json``: one object per row) and write the ``--report`` page; with the ``evaluator``
    that made ``report``, first re-run a few images with other seeds for each method's seed spread
    (:mod:`gradcam_cli.evaluation.seeds`)."""
    from ..evaluation.evaluate import Evaluator
    from ..evaluation.plan import SEED_RERUNS, rerun_images
    from ..evaluation.rank import format_ranking, rank
    from ..evaluation.rank_page import write_rank_report
    from ..evaluation.seeds import seed_spread

    spread = {}
    if isinstance(evaluator, Evaluator) and (reruns := rerun_images(report.methods, evaluator.options, len(report.ok))):
        reporter.info(f"seed spread: re-running {reruns // SEED_RERUNS} image(s) with {SEED_RERUNS} other seeds ...")
        spread = seed_spread(evaluator, report)
    rows = rank(report, seed, spread=spread)
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
