"""Running a question over images: each image's answer, its overlays (and ``--save-raw`` maps) and its rows.

A row has the manifest's columns (``target``: the map's label, the answer token it explains, its log-probability)
and, after them, ``prompt``, ``answer``, ``generated`` and, on the whole answer's row, ``tokens`` (each token's
text, id and log-probability). An image that fails gives an error row and the run goes on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import GradcamError, describe
from ..io.discovery import InputImage
from ..io.images import load_image, to_pixel_tensor
from ..io.lock import ensure_folder
from ..io.naming import answer_path
from ..options import AnswerOptions, OutputOptions
from ..render.colour import blend, colormap_table
from ..render.encode import save_array, save_image
from ..targets import TargetSpec
from .answer import AnswerExplainer, AnswerExplanation

if TYPE_CHECKING:
    from ..cam.records import Record


class AnswerRun:
    """Asks ``answer.prompt`` about each image with ``explainer`` and writes what ``output`` asks for."""

    def __init__(
        self,
        explainer: AnswerExplainer,
        answer: AnswerOptions,
        output: OutputOptions,
        specs: Sequence[TargetSpec] = (),
        max_side: int | None = None,
        empty: str = "",
        prompts: Mapping[str, str] | None = None,
    ) -> None:
        self.explainer, self.answer, self.output, self.specs, self.max_side = explainer, answer, output, specs, max_side
        self.empty, self.prompts = empty, prompts or {}

    def run(self, images: Sequence[InputImage]) -> Iterator[tuple[AnswerExplanation | None, list[dict[str, Any]]]]:
        """For each image, its explanation (``None`` where it failed) and its rows, in order; with ``--report``,
        the gallery of the rows written at the end (also after an error or Ctrl-C)."""
        written: list[dict[str, Any]] = []
        try:
            for result, rows in self._each(images):
                written += rows
                yield result, rows
        finally:
            if self.output.report and written:
                from ..render.gallery import write_gallery

                write_gallery([gallery_record(row) for row in written], self.output.output_dir)

    def _each(self, images: Sequence[InputImage]) -> Iterator[tuple[AnswerExplanation | None, list[dict[str, Any]]]]:
        for image in images:
            started = time.perf_counter()
            try:
                result, rows = self._explain(image)
            except GradcamError as error:
                yield None, [self._row(image, "error", error=str(error), seconds=time.perf_counter() - started)]
                continue
            except (RuntimeError, ValueError, OSError) as error:
                message = f"{image.path}: {describe(error, str(image.path))}"
                yield None, [self._row(image, "error", error=message, seconds=time.perf_counter() - started)]
                continue
            for row in rows:
                row["seconds"] = round((time.perf_counter() - started) / len(rows), 4)
            yield result, rows

    def _explain(self, image: InputImage) -> tuple[AnswerExplanation, list[dict[str, Any]]]:
        photo = load_image(image.path, self.max_side)
        prompt = self.prompts.get(str(image.path), self.answer.prompt)
        assert prompt is not None
        result = self.explainer.explain(photo, prompt, self.answer.answer, self.answer.per_token, self.specs)
        if not result.tokens:  # nothing to map: the row says so (``note``)
            row = self._row(image, "ok", note=self.empty)
            row.update(prompt=result.prompt, answer=result.answer, generated=result.generated, tokens=[])
            return result, [row]
        pixels = to_pixel_tensor(photo)
        table = colormap_table(self.output.colormap)
        suffix = self.output.image_format.suffix_for(image.path)
        rows = []
        for index, explained in enumerate(result.maps):
            label = explained.target.label
            path = answer_path(self.output.output_dir, image, explained.method, label, suffix)
            ensure_folder(path.parent, "--output-dir")
            save_image(blend(pixels, explained.saliency.cpu(), table, self.output.alpha), path, self.output.quality)
            outputs = [str(path)]
            if self.output.save_raw:
                raw = path.with_suffix(".npy")
                save_array(explained.saliency, raw)
                outputs.append(str(raw))
            target = {
                "name": label,
                "token": explained.target.token,
                "logprob": round(explained.score, 6),
                "probability": round(math.exp(explained.score), 6) if explained.score <= 0 else None,
            }
            row = self._row(image, "ok", outputs=outputs, target=target, method=explained.method)
            row.update(prompt=result.prompt, answer=result.answer, generated=result.generated)
            if index == 0:
                row["tokens"] = [
                    {"text": token.text, "id": token.id, "logprob": round(token.logprob, 6)} for token in result.tokens
                ]
            rows.append(row)
        return result, rows

    def _row(self, image: InputImage, status: str, **values: Any) -> dict[str, Any]:
        row: dict[str, Any] = {
            "input": str(image.path),
            "status": status,
            "error": None,
            "outputs": [],
            "predictions": [],
            "target": None,
            "method": None,
            "layer": self.explainer.layer,
            "model": self.explainer.vlm.name,
            "seconds": 0.0,
            "fingerprint": None,
            "provenance": None,
        }
        row.update(values)
        return row


def gallery_record(row: dict[str, Any]) -> Record:
    """A row as the gallery's record: the question and its answer shown as the image's prediction (with the
    answer's probability), each map's target as its label and probability."""
    from ..cam.records import Record
    from ..cam.results import Prediction

    record = Record.from_dict({**row, "target": None})
    target = row.get("target")
    if target is not None:
        probability = math.exp(target["logprob"]) if target["logprob"] <= 0 else float("nan")
        record.target = Prediction(target["token"] if target["token"] is not None else -1, target["name"], probability)
    if "answer" in row:
        logprob = sum(token["logprob"] for token in row.get("tokens") or [])
        question = f"{row['prompt']} \N{RIGHTWARDS ARROW} {row['answer'] or '(empty answer)'}"
        record.predictions = [Prediction(-1, question, math.exp(logprob) if row.get("tokens") else float("nan"))]
    return record
