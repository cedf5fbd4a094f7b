"""``gradcam eval --rank --report DIR``'s rows file, ``DIR/rows.jsonl``: every (image, method) result appended as it
finishes, so that an interrupted run leaves its finished results on disk and ``--skip-existing`` resumes from them.

Line 1 is the run's settings (``{"settings": {...}}``: model, layers, methods, seeds, steps ...); each next line one
row (:func:`image_row`, the fields of :class:`~gradcam_cli.evaluation.report.ImageScores`): one method's figures on
one image (``methods`` holds that one method; ``target`` is the image's explained target, the same in each of its
rows), or a failed image (``error`` set, no methods). The unit of a row is everything measured for one method on one
image: its curves, masked probability, ROAD, Gini and entropy (randomcam's averaged over its draws), its stability
copies, its sanity cascade and redraw, its boxes, a detector's detections. Rows of one image are merged when the
file is read (a file written before rows were per method, one line per image with all its methods, reads the same
way). A line is written whole with one ``write`` to a file opened for appending and flushed to disk before the next
method starts; a last line cut short by a crash is ignored when the file is read. The seed spread's re-runs
(:mod:`.seeds`) are rows too, marked ``"seed_run": k`` (the k-th other seed), read apart from the main pass's
(:func:`read_seed_rows`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from ..cam.explainer import Explainer
from ..cam.results import Prediction
from ..errors import UsageError
from ..options import EvalOptions
from .report import BoxScore, DetectionFigures, ImageScores, MethodScores

ROWS_NAME = "rows.jsonl"
SEED_RUN = "seed_run"
"""The key that marks a seed-spread row."""


def run_settings(explainer: Explainer, options: EvalOptions) -> dict[str, Any]:
    """What makes two runs' rows comparable: the model, layers, methods, targets, seeds and measurements."""
    measured = {key: value for key, value in asdict(options).items() if key not in ("batch_size", "plot")}
    return {
        "model": explainer.model.name,
        "layers": list(explainer.chosen.layers),
        "methods": list(explainer.chosen.methods),
        "target": explainer.chosen.target,
        "explainer": explainer.settings,
        "perturbation_seed": explainer.options.perturbation.seed,
        **json.loads(json.dumps(measured, default=str)),
    }


def image_row(image: ImageScores) -> dict[str, Any]:
    """One image's scores as JSON-ready data (NaN stays NaN: the file is read back by :func:`image_from_row`)."""
    return asdict(image)


def image_from_row(row: dict[str, Any]) -> ImageScores:
    """The :class:`ImageScores` that :func:`image_row` wrote."""

    def prediction(data: dict[str, Any] | None) -> Prediction | None:
        if data is None:
            return None
        box = data.get("box")
        return Prediction(**{**data, "box": tuple(box) if box is not None else None})

    methods = {}
    for name, scores in row["methods"].items():
        boxes = [BoxScore(b["label"], prediction(b["target"]), b["hit"], b["energy"]) for b in scores["boxes"]]  # type: ignore[arg-type]
        detections = [
            DetectionFigures(**{**d, "target": prediction(d["target"])}) for d in scores.get("detections", [])
        ]
        methods[name] = MethodScores(**{**scores, "boxes": boxes, "detections": detections})
    return ImageScores(row["image"], prediction(row["target"]), methods, row["error"])


class RowsFile:
    """Appends each finished (image, method)'s row (and each failed image's) to ``path``, after the settings line
    (a new file)."""

    def __init__(self, path: Path, settings: dict[str, Any], resume: bool) -> None:
        self.path = path
        fresh = not (resume and path.exists())
        cut = not fresh and not path.read_bytes().endswith(b"\n")  # a last line cut short: end it first
        self._file: IO[str] = path.open("w" if fresh else "a", encoding="utf-8")
        if cut:
            self._file.write("\n")
        if fresh:
            self._write({"settings": settings})

    def append(self, image: ImageScores, seed_run: int = 0) -> None:
        """One row; ``seed_run`` k > 0: a row of the seed spread's k-th re-run."""
        self._write({SEED_RUN: seed_run, **image_row(image)} if seed_run else image_row(image))

    def _write(self, data: dict[str, Any]) -> None:
        self._file.write(json.dumps(data) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def read_rows(path: Path, settings: dict[str, Any]) -> list[ImageScores]:
    """The (image, method) results ``path`` holds, merged per image, when it was written with the same ``settings``
    (otherwise a usage error: its figures would not be comparable); none when it does not exist. Failure rows are
    left out (the image's missing methods are tried again)."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        written = json.loads(lines[0])["settings"] if lines else None
    except (ValueError, KeyError, TypeError):
        written = None
    if written != json.loads(json.dumps(settings)):
        raise UsageError(
            f"--skip-existing: {path} was written by a run with other settings; remove it or run without "
            "--skip-existing"
        )
    return _merged(lines[1:], written["methods"], 0)[0].images()


def read_seed_rows(path: Path, methods: Sequence[str]) -> dict[int, Finished]:
    """The seed spread's rows ``path`` holds (its settings checked by :func:`read_rows`): re-run k -> its results
    merged per image."""
    if not path.exists():
        return {}
    return _merged(path.read_text(encoding="utf-8").splitlines()[1:], methods, None)


def read_finished(path: Path, methods: Sequence[str]) -> Finished:
    """The main pass's results ``path`` holds, whatever its settings (the plan's count of what is left; the
    settings are checked by :func:`read_rows` before anything is kept)."""
    if not path.exists():
        return Finished(methods)
    return _merged(path.read_text(encoding="utf-8").splitlines()[1:], methods, 0).get(0, Finished(methods))


def _merged(lines: Iterable[str], methods: Sequence[str], run: int | None) -> dict[int, Finished]:
    """Rows merged per seed run (0: the main pass) and image; ``run``: that run's alone, else every seed run's."""
    runs: dict[int, Finished] = {} if run is None else {run: Finished(methods)}
    for line in lines:
        try:
            data = json.loads(line)
            k = int(data.pop(SEED_RUN, 0))
            row = image_from_row(data)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # a line cut short by an interrupted write
        if row.error is None and (k == run or (run is None and k > 0)):
            runs.setdefault(k, Finished(methods)).add(row)
    return runs


class Finished:
    """The results finished so far, merged per image from their rows (a failed image's row replaces it), each
    image's methods in ``methods``' order."""

    def __init__(self, methods: Sequence[str], rows: Iterable[ImageScores] = ()) -> None:
        self.methods = list(methods)
        self._images: dict[str, ImageScores] = {}
        for row in rows:
            self.add(row)

    def add(self, row: ImageScores) -> None:
        known = self._images.get(row.image)
        if row.error is not None or known is None or known.error is not None:
            self._images[row.image] = ImageScores(row.image, row.target, dict(row.methods), row.error)
        else:
            known.methods.update(row.methods)

    def complete(self, image: str) -> bool:
        """Whether every method has finished on ``image``."""
        known = self._images.get(image)
        return known is not None and known.error is None and all(m in known.methods for m in self.methods)

    def pending(self) -> dict[str, ImageScores]:
        """Image -> its finished methods, for the images some method is still to run on (a copy)."""
        return {
            name: ImageScores(name, image.target, dict(image.methods))
            for name, image in self._images.items()
            if image.error is None and not self.complete(name)
        }

    def results(self) -> int:
        """How many (image, method) results have finished."""
        return sum(len(image.methods) for image in self._images.values() if image.error is None)

    def images(self) -> list[ImageScores]:
        """Every image with a row, its methods in order (those finished)."""
        order = {method: i for i, method in enumerate(self.methods)}
        return [
            ImageScores(
                image.image,
                image.target,
                dict(sorted(image.methods.items(), key=lambda item: order.get(item[0], len(order)))),
                image.error,
            )
            for image in self._images.values()
        ]
