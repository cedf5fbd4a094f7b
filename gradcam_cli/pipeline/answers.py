"""Prompted images (docs/vlm.md): the :class:`~gradcam_cli.pipeline.session.Session`'s runner of the input kind
:attr:`~gradcam_cli.io.discovery.InputKind.PROMPTED`.

Each image's answer is generated (or taken from ``--answer``) and explained; its maps are written as the batch
writes an image's (the overlay, ``--save-raw``'s ``.npy``, ``--save-heatmap``'s heatmap, ``--report``'s thumbnail,
``--panel``'s panel) and its rows are :class:`~gradcam_cli.cam.records.Record` s with a fingerprint per map
and the run's provenance. With ``--skip-existing`` an image whose rows the manifest holds and whose outputs all
exist keeps them: its answer is not generated again. An image that fails gives an error row and the run goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..cam.answers import AnswerExplanation
from ..cam.explainer import Explainer
from ..cam.prompted import explain_prompt
from ..cam.records import Answer, Record, answer_prediction
from ..cam.results import Explanation
from ..cam.tasks.answer import ANSWER, EMPTY_ANSWER, answer_score
from ..drift.fingerprint import map_fingerprint
from ..drift.provenance import determinism, versions
from ..errors import GradcamError, describe
from ..io.discovery import InputImage
from ..io.images import load_image, to_pixel_tensor
from ..io.lock import ensure_folder
from ..io.naming import answer_path, panel_path, thumbnail_path
from ..options import ExplainOptions, ModelOptions, OutputOptions, RunOptions
from ..render.colour import blend, colormap_table, heatmap_image
from ..render.encode import save_array, save_image
from .resume import EarlierRows, run_record

RAY_ANSWERS = (
    "--engine ray explains images with an image model on a Ray cluster's workers; a --prompt's answer is generated "
    "and explained in this process: run without --engine ray"
)
"""Why a run of prompted images refuses ``--engine ray``."""


def answer_explainer(model: ModelOptions, explain: ExplainOptions) -> Explainer:
    """The explainer of ``explain``'s question, as the command line builds it: the model refused in one line before
    it loads where it answers no question, loaded by the family registry for the answer task
    (:meth:`Explainer.from_options <gradcam_cli.cam.explainer.Explainer.from_options>`), then the prompt and a
    ``--layer`` given checked once (:meth:`~gradcam_cli.cam.tasks.answer.AnswerTask.check_built`)."""
    from dataclasses import replace

    ANSWER.check_model(model, explain)
    explainer = Explainer.from_options(replace(model, task=ANSWER.name), explain)
    ANSWER.check_built(explainer, explain)
    return explainer


class AnswerRunner:
    """Asks each prompted image its question with ``explainer`` (a vision-language model's) and writes what
    ``output`` asks for."""

    def __init__(
        self,
        explainer: Explainer,
        output: OutputOptions,
        run: RunOptions | None = None,
        earlier: EarlierRows | None = None,
    ) -> None:
        self.explainer, self.output, self.run = explainer, output, run or RunOptions()
        self.question = answer_score(explainer).question
        self.earlier = earlier or EarlierRows()
        self.table = colormap_table(output.colormap)

    def run_record(self) -> dict[str, Any]:
        """The run record the session checks and writes (:func:`answer_run_record`)."""
        return answer_run_record(self.explainer, self.output, self.run)

    def provenance(self) -> dict[str, Any]:
        """What every row of the run carries (:func:`answer_provenance`)."""
        return answer_provenance(self.explainer, self.run)

    def run_images(
        self,
        images: Sequence[InputImage],
        on_image: Callable[[], Any] | None = None,
        on_skipped: Callable[[], Any] | None = None,
    ) -> Iterator[Record]:
        """Each image's rows, in order (an image kept by ``--skip-existing``: its earlier rows, status
        ``skipped``)."""
        for image in images:
            kept = self.kept(image)
            if kept is not None:
                if on_skipped is not None:
                    on_skipped()
                yield from kept
                continue
            started = time.perf_counter()
            try:
                records = self._explain(image)
            except GradcamError as error:  # each failure line starts with its input's path (docs/cli.md)
                records = [self._record(image, "error", error=named(image, str(error)))]
            except (RuntimeError, ValueError, OSError) as error:
                records = [self._record(image, "error", error=f"{image.path}: {describe(error, str(image.path))}")]
            seconds = round((time.perf_counter() - started) / len(records), 4)
            for record in records:
                record.seconds = seconds
            if on_image is not None:
                on_image()
            yield from records

    def kept(self, image: InputImage) -> list[Record] | None:
        """With ``--skip-existing``, the earlier rows of ``image`` as ``skipped`` ones, when the manifest holds them
        for this question (and this ``--answer``) and every output this run would list exists; else ``None``."""
        if not self.output.skip_existing:
            return None
        wanted = lambda method, label: [path for _, path in self._paths(image, method, label)]  # noqa: E731
        return kept_answer(self.earlier, image, (self.explainer.chosen.methods, self.question.answer), wanted)

    def _paths(self, image: InputImage, method: str, label: str) -> list[tuple[str, Path]]:
        """(kind, path) of each file one map's row lists: its overlay, ``.npy``, heatmap, and the image's panel."""
        suffix = self.output.chosen_format.suffix_for(image.path)
        output_dir = self.output.output_dir
        overlay = answer_path(output_dir, image, method, label, suffix)
        paths = [("overlay", overlay)]
        paths += [("raw", overlay.with_suffix(".npy"))] if self.output.save_raw else []
        if self.output.save_heatmap:
            paths.append(("heatmap", answer_path(output_dir, image, f"heatmap-{method}", label, suffix)))
        paths += [("panel", panel_path(output_dir, image, suffix))] if self.output.panel else []
        return paths

    def _explain(self, image: InputImage) -> list[Record]:
        photo = load_image(image.path, self.run.max_side)
        result = explain_prompt(self.explainer, photo, image.prompt or "", self.question.answer)
        answer = Answer(result.prompt, result.answer, result.generated)
        if not result.tokens:  # nothing to map: the row says so (``note``)
            answer.tokens, answer.note = [], EMPTY_ANSWER
            return [self._record(image, "ok", answer=answer)]
        pixels = to_pixel_tensor(photo)
        maps = [
            Explanation(m.method, answer_prediction(m.target.label, m.target.token, m.score), m.saliency)
            for m in result.maps
        ]
        records = []
        for index, explained in enumerate(maps):
            paths = self._write(image, pixels, explained)
            row_answer = Answer(answer.prompt, answer.text, answer.generated, token_rows(result) if not index else None)
            records.append(
                self._record(
                    image,
                    "ok",
                    method=explained.method,
                    target=explained.target,
                    outputs=[str(path) for path in paths],
                    fingerprint=map_fingerprint(explained.saliency),
                    answer=row_answer,
                )
            )
        if self.output.panel:
            from ..render.panels import save_panel

            path = panel_path(self.output.output_dir, image, self.output.chosen_format.suffix_for(image.path))
            o = self.output
            save_panel(path, pixels, maps, o.colormap, o.alpha, image.path.name, o.quality)
        return records

    def _write(self, image: InputImage, pixels: Any, explained: Explanation) -> list[Path]:
        """Write one map's files (the image's panel is written once all its maps are); their paths, as its row
        lists them."""
        paths = self._paths(image, explained.method, explained.target.name)
        overlay_path = paths[0][1]
        ensure_folder(overlay_path.parent, "--output-dir")
        overlay = blend(pixels, explained.saliency.cpu(), self.table, self.output.alpha)
        save_image(overlay, overlay_path, self.output.quality)
        for kind, path in paths:
            if kind == "raw":
                save_array(explained.saliency, path)
            elif kind == "heatmap":
                save_image(heatmap_image(explained.saliency.cpu(), self.table).cpu(), path, self.output.quality)
        if self.output.report:
            from ..render.gallery import save_thumbnail

            save_thumbnail(overlay, thumbnail_path(self.output.output_dir, overlay_path))
        return [path for _, path in paths]

    def _record(self, image: InputImage, status: str, **fields: Any) -> Record:
        model = self.explainer.model.name
        return Record(str(image.path), status, model, self.explainer.layer_label, **fields)


def kept_answer(
    earlier: EarlierRows,
    item: InputImage,
    asked: tuple[Sequence[str], str | None],
    wanted: Callable[[str, str], list[Path]] | None = None,
) -> list[Record] | None:
    """The earlier rows of a prompted ``item`` (an image, a video) as ``skipped`` ones, when the manifest holds them
    for its prompt, ``asked``'s methods and given answer (``None``: generated), and every output they list exists
    (``wanted(method, label)``: the outputs this run would list for one map, where known before the answer); else
    ``None``: it is answered again."""
    methods, given = asked
    rows = [Record.from_dict(row) for row in earlier.get(str(item.path))]
    if not rows or any(row.status not in ("ok", "skipped") or row.answer is None for row in rows):
        return None
    mapped = {row.method for row in rows if row.method is not None}
    if mapped and mapped != set(methods):  # made with other --method: explained again
        return None
    for row in rows:
        assert row.answer is not None
        if row.answer.prompt != item.prompt or row.answer.generated != (given is None):
            return None
        if given is not None and row.answer.text != given.strip():
            return None
        if wanted is not None and row.method is not None and row.target is not None:
            expected = [os.path.abspath(path) for path in wanted(row.method, row.target.name)]
            if [os.path.abspath(path) for path in row.outputs] != expected:
                return None
        if not all(Path(path).is_file() for path in row.outputs):
            return None
    for row in rows:
        row.status, row.error = "skipped", None
    return rows


def named(image: InputImage, message: str) -> str:
    """``message`` starting with ``image``'s path, as every failure line does (docs/cli.md)."""
    return message if message.startswith(f"{image.path}:") else f"{image.path}: {message}"


def token_rows(result: AnswerExplanation) -> list[dict[str, Any]]:
    """Each answer token's text, id and log-probability, as the image's first row lists them."""
    return [{"text": token.text, "id": token.id, "logprob": round(token.logprob, 6)} for token in result.tokens]


def answer_run_record(explainer: Explainer, output: OutputOptions, run: RunOptions) -> dict[str, Any]:
    """The run record of a run of prompted images: what makes their outputs (the model, the layer, the methods'
    look, the answer's length, which targets)."""
    name, smoothing = explainer.model.name, (False, explainer.options.eigen_smooth)
    record = run_record(name, name, explainer.layer_label, 0, smoothing, output, run.max_side)
    del record["input_size"]  # the processor's
    record.update(explainer.settings)
    record["precision"] = explainer.chosen.precision  # the weights' type: a VLM is loaded in it
    return record


def answer_provenance(explainer: Explainer, run: RunOptions) -> dict[str, Any]:
    """The provenance every row of a run of prompted images carries (docs/ci.md's fields that apply)."""
    parameter = next(explainer.model.module.parameters(), None)
    return {
        **versions(),
        "model": explainer.model.name,
        "weights": explainer.model.name,
        "weights_sha256": None,
        "layers": list(explainer.chosen.layers),
        "methods": list(explainer.chosen.methods),
        **explainer.settings,
        "device": str(explainer.device),
        "dtype": str(parameter.dtype).removeprefix("torch.") if parameter is not None else None,
        "precision": explainer.chosen.precision,
        "eigen_smooth": explainer.options.eigen_smooth,
        "max_side": run.max_side,
        **determinism(),
    }
