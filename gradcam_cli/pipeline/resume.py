"""Resuming (``--skip-existing``): which images a previous run already finished, found from the files on disk; their
rows, taken back from the manifest of that run (an image whose files exist but whose rows the manifest being resumed
lacks, as a killed run leaves it, is explained again) or, without such a manifest, rebuilt from the file names; and
the run record that keeps a resumed run from mixing its outputs with those of another model, layer or look."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cam.records import Record
from ..cam.results import NO_TARGET_NAME, Explanation, Prediction, no_target
from ..errors import UsageError, describe
from ..io.atomic import write_atomic
from ..io.discovery import InputImage
from ..io.manifest import latest_row_sets, row_key
from ..io.naming import RUN_RECORD_NAME, TARGET_TAIL, slug
from ..options import ImageFormat, OutputOptions
from ..registry import plugin_versions
from .outputs import OutputKind

_PROBE_TARGET = Prediction(0, "x", 0.0)
_PROBE_MARK = "_0-x"
NO_TARGET_TAIL = f"0-{slug(NO_TARGET_NAME)}"
"""The class part of a map's file name made without a target (its row rebuilt says so again)."""


class OutputIndex:
    """The names in each output folder, listed once: ``--skip-existing`` over N images costs one listing per
    folder, not a directory scan per image.

    Per-explanation outputs are named ``<prefix>_<class index>-<class slug><ending>``; :meth:`matches` finds every
    name with a given prefix and ending, whatever the class.
    """

    def __init__(self) -> None:
        self._names: dict[Path, set[str]] = {}
        self._by_prefix: dict[tuple[Path, str], dict[str, list[str]]] = {}

    def names(self, folder: Path) -> set[str]:
        if folder not in self._names:
            try:
                self._names[folder] = {entry.name for entry in os.scandir(folder) if entry.is_file()}
            except OSError:
                self._names[folder] = set()
        return self._names[folder]

    def matches(self, folder: Path, prefix: str, ending: str) -> list[str]:
        key = (folder, ending)
        if key not in self._by_prefix:
            index: dict[str, list[str]] = {}
            for name in self.names(folder):
                if not name.endswith(ending):
                    continue
                head, _, tail = name[: len(name) - len(ending)].rpartition("_")
                if head and TARGET_TAIL.fullmatch(tail):
                    index.setdefault(head, []).append(name)
            self._by_prefix[key] = index
        return sorted(self._by_prefix[key].get(prefix, []))


@dataclass
class FoundExplanation:
    """The existing outputs of one method and class of an image: ``tail`` is ``<class index>-<class slug>``."""

    method: str
    tail: str
    outputs: list[str]

    @property
    def class_index(self) -> int:
        return int(self.tail.split("-", 1)[0])


class ExistingOutputs:
    """Finds the outputs a previous run wrote for an image, if all of them exist.

    Without a fixed ``target``, each method's listed per-explanation kinds must exist for ``top_k`` classes
    (whichever they were); with one, exactly that class's files; per-image kinds must exist as named.
    """

    def __init__(
        self,
        options: OutputOptions,
        kinds: Sequence[OutputKind],
        methods: Sequence[str],
        target: Prediction | None,
        top_k: int,
    ) -> None:
        self.options, self.kinds, self.methods, self.target, self.top_k = options, kinds, methods, target, top_k
        self.index = OutputIndex()

    def find(self, image: InputImage) -> list[FoundExplanation] | None:
        """The existing outputs of ``image``, one entry per method and class in record order (each with the
        image's per-image outputs too), or ``None`` if any is missing."""
        found: list[FoundExplanation] = []
        for method in self.methods:
            by_tail: dict[str, FoundExplanation] = {}
            for kind in self.kinds:
                if not kind.listed or not kind.per_explanation:
                    continue
                named = self._named(image, method, kind)
                if named is None:
                    return None
                first = not by_tail
                for tail, output in named:
                    if first:
                        by_tail[tail] = FoundExplanation(method, tail, [])
                    if tail in by_tail:
                        by_tail[tail].outputs.append(output)
            found.extend(sorted(by_tail.values(), key=lambda entry: entry.class_index))
        for kind in self.kinds:
            if kind.listed and not kind.per_explanation:
                path = kind.path(self.options, image, None)
                if path.name not in self.index.names(path.parent):
                    return None
                for entry in found:
                    entry.outputs.append(str(path))
        return found

    def _named(self, image: InputImage, method: str, kind: OutputKind) -> list[tuple[str, str]] | None:
        """(class tail, path) of each existing file of this kind and method, or ``None`` if too few exist."""
        if self.target is not None:
            path = kind.path(self.options, image, Explanation(method, self.target, torch.empty(0)))
            if path.name not in self.index.names(path.parent):
                return None
            stem = path.name[: len(path.name) - len(path.suffix)] if path.suffix else path.name
            return [(stem.rpartition("_")[2], str(path))]
        probe = kind.path(self.options, image, Explanation(method, _PROBE_TARGET, torch.empty(0)))
        cut = probe.name.rfind(_PROBE_MARK)
        if cut < 0:
            return []  # a kind not named by class: cannot be matched without knowing the class
        folder, prefix, ending = probe.parent, probe.name[:cut], probe.name[cut + len(_PROBE_MARK) :]
        names = self.index.matches(folder, prefix, ending)
        if len(names) < self.top_k:
            return None
        return [(name[len(prefix) + 1 : len(name) - len(ending)], str(folder / name)) for name in names]


class EarlierRows:
    """The rows earlier runs wrote to the manifest: each input's latest set, by input.

    ``required``: the rows of a manifest this run resumes (the file existed), which must hold every finished
    image's rows: an image whose outputs exist but whose rows it lacks (a run killed after writing the files, before
    the rows) is explained again. Without such a manifest (none given, or a new one), rows are rebuilt from the
    files.
    """

    def __init__(self, rows: Iterable[dict[str, Any]] = (), required: bool = False) -> None:
        self.by_input = latest_row_sets(rows)
        self.required = required

    def get(self, input_path: str) -> list[dict[str, Any]]:
        return self.by_input.get(row_key({"input": input_path}), [])


def resumed_rows(
    found: Sequence[FoundExplanation],
    earlier: Sequence[dict[str, Any]],
    skipped: Callable[..., Record],
    class_name: Callable[[int], str],
    required: bool = False,
) -> list[Record] | None:
    """The rows of an image whose outputs all exist: one per method and class found, status ``skipped``; ``None``
    when ``required`` (:attr:`EarlierRows.required`) and the earlier rows lack any of them (the image is explained
    again).

    Each takes predictions, target, outputs, seconds, fingerprint and provenance from the earlier run's row with
    the same main output, where the manifest has one; the others are rebuilt from the file names (the class index
    and the model's name for it, or no target for ``0-no-target``, probability unknown, the image's predictions
    from any earlier row, no fingerprint or provenance). ``skipped(**fields)`` makes a row of this image.
    """
    usable = [Record.from_dict(row) for row in earlier if row["status"] in ("ok", "skipped") and row["outputs"]]
    by_output = {os.path.abspath(record.outputs[0]): (place, record) for place, record in enumerate(usable)}
    predictions = next((record.predictions for record in usable if record.predictions), [])
    matched: list[tuple[int, Record]] = []
    rebuilt: list[Record] = []
    for entry in found:
        place, before = by_output.get(os.path.abspath(entry.outputs[0]), (0, None))
        if before is not None and before.method == entry.method:
            fields = {
                "outputs": before.outputs,
                "seconds": before.seconds,
                "predictions": before.predictions,
                "fingerprint": before.fingerprint,
                "provenance": before.provenance,
                "volume": before.volume,
            }
            matched.append((place, skipped(method=before.method, target=before.target, **fields)))
            continue
        if required:
            return None
        target = Prediction(entry.class_index, class_name(entry.class_index), math.nan)
        target = no_target() if entry.tail == NO_TARGET_TAIL else target
        rebuilt.append(skipped(method=entry.method, target=target, predictions=predictions, outputs=entry.outputs))
    if required and not matched:
        return None
    return [row for _, row in sorted(matched, key=lambda pair: pair[0])] + rebuilt


# ------------------------------------------------------------------------------------------------------ run record

RECORD_LABELS = {
    "model": "model",
    "weights": "weights",
    "layers": "layer",
    "input_size": "input size",
    "aug_smooth": "--aug-smooth",
    "eigen_smooth": "--eigen-smooth",
    "colormap": "colormap",
    "alpha": "alpha",
    "format": "format",
    "quality": "quality",
    "max_side": "max side",
    "task": "task",
    "score": "--score",
    "score_threshold": "--score-threshold",
    "max_detections": "--max-detections",
    "precision": "--precision",
    "targets": "--target",
    "embedding": "--embedding",
    "attention_heads": "--attention-heads",
    "per_token": "--per-token",
    "max_new_tokens": "--max-new-tokens",
    "clip_stride": "--clip-stride",
    "fps": "--fps",
}
"""The run record's keys (what changes the content of an output without changing its name), as messages say them."""
RESUMING_OPTIONS = {"format": "--format", "quality": "--quality", "colormap": "--colormap", "alpha": "--alpha"}
"""The run record's keys that one option of the command sets back, as the refusal suggests them."""


def run_record(
    model: str,
    weights: str,
    layers: str,
    input_size: int | tuple[int, int],
    smoothing: tuple[bool, bool],
    output: OutputOptions,
    max_side: int | None,
) -> dict[str, Any]:
    """What made a run's outputs, as the run record stores it (quality only for the lossy formats; the installed
    plugins' distributions and versions, which ``--skip-existing`` does not hold a resumed run to)."""
    lossy = output.chosen_format is not ImageFormat.PNG
    return {
        "model": model,
        "weights": weights,
        "layers": layers,
        "input_size": list(input_size) if isinstance(input_size, tuple) else input_size,
        "aug_smooth": smoothing[0],
        "eigen_smooth": smoothing[1],
        "colormap": output.colormap,
        "alpha": output.alpha,
        "format": output.chosen_format.value,
        "quality": output.quality if lossy else None,
        "max_side": max_side,
        "plugins": plugin_versions(),
    }


def check_run_record(output_dir: Path, record: dict[str, Any]) -> None:
    """With ``--skip-existing``: a :class:`UsageError` naming what differs when the outputs in ``output_dir`` were
    made with other settings. No record (or an unreadable one: outputs of an older version): nothing to check."""
    earlier = read_run_record(output_dir)
    differences = [
        (key, earlier[key], record[key])
        for key in RECORD_LABELS
        if key in earlier and key in record and earlier[key] != record[key]
    ]
    if earlier.get("format") != record["format"]:  # the quality of another format is beside the point
        differences = [difference for difference in differences if difference[0] != "quality"]
    _check_methods(output_dir, earlier.get("methods"), record.get("methods"))
    if differences:
        made = ", ".join(f"{RECORD_LABELS[k]} {_shown(old)} (this run: {_shown(new)})" for k, old, new in differences)
        if all(key in RESUMING_OPTIONS for key, _, _ in differences):  # e.g. a folder made before a default changed
            resume = " ".join(f"{RESUMING_OPTIONS[key]} {_shown(old)}" for key, old, _ in differences)
            advice = f"add {resume} to resume them, choose another --output-dir, or run without --skip-existing"
        else:
            advice = "choose another --output-dir or run without --skip-existing"
        raise UsageError(f"--skip-existing: the outputs in {output_dir} were made with {made}; {advice}")


def _check_methods(output_dir: Path, earlier: Any, methods: Any) -> None:
    """A :class:`UsageError` when an earlier run in ``output_dir`` made maps with a method this run leaves out:
    resuming it would replace each re-explained image's rows, theirs included, in the manifest and the gallery."""
    if not isinstance(earlier, list) or not isinstance(methods, list):
        return  # an older run record, or a run of prompted images (answered again with this run's methods)
    left_out = [str(method) for method in earlier if method not in methods]
    if left_out:
        both = ",".join([*map(str, methods), *left_out])
        raise UsageError(
            f"--skip-existing: the outputs in {output_dir} were made with --method {','.join(map(str, earlier))}; "
            f"resuming with --method {','.join(map(str, methods))} would drop the rows of {', '.join(left_out)} "
            f"from the manifest and the gallery: add --method {both}, choose another --output-dir, or run without "
            "--skip-existing"
        )


def read_run_record(output_dir: Path) -> dict[str, Any]:
    """``<output_dir>/.gradcam-run.json``; empty where there is none or it is unreadable (an older version's)."""
    try:
        record = json.loads((output_dir / RUN_RECORD_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_run_record(output_dir: Path, record: dict[str, Any]) -> None:
    """Write ``<output_dir>/.gradcam-run.json`` atomically."""
    try:
        write_atomic(output_dir / RUN_RECORD_NAME, (json.dumps(record, indent=1) + "\n").encode())
    except OSError as error:
        raise UsageError(f"--output-dir {output_dir}: cannot write there: {describe(error, output_dir)}") from None


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, list):
        return "x".join(map(str, value))
    return str(value)
