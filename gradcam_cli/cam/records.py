"""Records: one row per image, target and method (or per failed or skipped image), as the manifest and --json give."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..io.manifest import MANIFEST_FIELDS
from .results import Prediction, rescaled


@dataclass
class Record:
    """One manifest row: an image with one target and method, or an image that failed or was skipped.

    ``fingerprint``: the map in small (:mod:`gradcam_cli.drift.fingerprint`; images only); ``provenance``: how it
    was made (:mod:`gradcam_cli.drift.provenance`; set by the :class:`~gradcam_cli.pipeline.session.Session`)."""

    input: str
    status: str
    model: str
    layer: str
    method: str | None = None
    target: Prediction | None = None
    predictions: list[Prediction] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    fingerprint: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    answer: Answer | None = None
    """A prompted image's row (docs/vlm.md): its question and answer, written after the manifest's columns."""
    clip: ClipInfo | None = None
    """A video model's row (docs/video.md): which clip of the video, its frames' shares of the map and its score,
    written after the manifest's columns as ``clip``."""
    volume: VolumeInfo | None = None
    """A scan's row (docs/volumes.md): its grid, spacing and the map's peak, written after the manifest's columns
    as ``volume``."""

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON-ready data, in manifest column order (predictions as {index, name, probability},
        with a detection's ``box`` and a segmenter's class ``share`` where they have one; a probability that is not
        finite becomes null, so the JSON stays valid)."""
        row = asdict(self)
        for prediction in [row["target"], *row["predictions"]]:
            if prediction is not None:
                probability = prediction["probability"]
                prediction["probability"] = round(probability, 6) if math.isfinite(probability) else None
                prediction.update(prediction.pop("details") or {})
                for extra in ("box", "share", "score"):
                    if prediction[extra] is None:
                        del prediction[extra]
                if "box" in prediction:
                    prediction["box"] = list(prediction["box"])
                if "share" in prediction:
                    prediction["share"] = round(prediction["share"], 6)
        clip_column = {"clip": self.clip.to_dict()} if self.clip is not None else {}
        if self.volume is not None:
            clip_column["volume"] = self.volume.to_dict()
        if self.answer is None:
            return {**{key: row[key] for key in MANIFEST_FIELDS}, **clip_column}
        row["target"] = answer_target(self.target) if self.target is not None else None
        return {**{key: row[key] for key in MANIFEST_FIELDS}, **self.answer.to_dict(), **clip_column}

    @property
    def shown_predictions(self) -> list[Prediction]:
        """What the gallery shows as the input's predictions: an answer's question and answer (with the answer's
        probability), else :attr:`predictions`."""
        if self.answer is None:
            return self.predictions
        return [self.answer.shown()]

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Record:
        """A record from a manifest row (:meth:`to_dict`'s form); a null probability becomes NaN."""
        answer = Answer.from_row(row)
        target = _prediction(row.get("target")) if answer is None else _answer_prediction(row.get("target"))
        predictions = [p for p in map(_prediction, row.get("predictions") or []) if p is not None]
        return cls(
            str(row["input"]),
            str(row["status"]),
            str(row.get("model") or ""),
            str(row.get("layer") or ""),
            row.get("method") or None,
            target,
            predictions,
            [str(path) for path in row.get("outputs") or []],
            row.get("error") or None,
            float(row.get("seconds") or 0.0),
            row.get("fingerprint") if isinstance(row.get("fingerprint"), dict) else None,
            row.get("provenance") if isinstance(row.get("provenance"), dict) else None,
            answer,
            ClipInfo.from_row(row),
            VolumeInfo.from_row(row),
        )


@dataclass
class ClipInfo:
    """Which clip of a video a row explains and how its map falls in time: ``index`` (0-based), its video frames
    ``start`` to ``end`` (exclusive) and their times in seconds, ``shares`` (each of those frames' share of the
    map, summing to 1: the temporal importance curve) and ``score`` (the probability of the class it explains)."""

    index: int
    start: int
    end: int
    seconds: tuple[float, float]
    shares: list[float]
    score: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "seconds": [round(self.seconds[0], 4), round(self.seconds[1], 4)],
            "shares": [round(share, 6) for share in self.shares],
            "score": round(self.score, 6) if math.isfinite(self.score) else None,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ClipInfo | None:
        """The clip of a manifest row, ``None`` when it is no clip's row (or its ``clip`` is malformed)."""
        value = row.get("clip")
        if not isinstance(value, dict) or not all(isinstance(value.get(key), int) for key in ("index", "start", "end")):
            return None
        seconds, shares, score = value.get("seconds"), value.get("shares"), value.get("score")
        times = seconds if isinstance(seconds, list) and len(seconds) == 2 else [0.0, 0.0]
        return cls(
            value["index"],
            value["start"],
            value["end"],
            (float(times[0]), float(times[1])),
            [float(share) for share in shares] if isinstance(shares, list) else [],
            float(score) if isinstance(score, int | float) else math.nan,
        )


@dataclass
class VolumeInfo:
    """Where a scan's map lies: the scan's voxel ``grid`` (I, J, K) and ``spacing`` (mm), the map's ``peak`` voxel
    (the first in C order on ties) and its RAS position ``peak_mm``, the ``windows`` it was stitched from, and the
    ``intensity_window`` its montage drew the scan in (the intensities drawn black and white; ``None``: not
    recorded, an older row's)."""

    grid: tuple[int, ...]
    spacing: tuple[float, ...]
    peak: tuple[int, ...]
    peak_mm: tuple[float, ...]
    windows: int
    intensity_window: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        shown = {
            "grid": list(self.grid),
            "spacing": [round(side, 6) for side in self.spacing],
            "peak": list(self.peak),
            "peak_mm": [round(value, 4) for value in self.peak_mm],
            "windows": self.windows,
        }
        if self.intensity_window is not None:
            shown["intensity_window"] = [round(value, 6) for value in self.intensity_window]
        return shown

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> VolumeInfo | None:
        """The volume of a manifest row, ``None`` when it is no scan's row (or its ``volume`` is malformed)."""
        value = row.get("volume")
        keys = ("grid", "spacing", "peak", "peak_mm")
        if not isinstance(value, dict) or not all(isinstance(value.get(key), list) for key in keys):
            return None
        windows = value.get("windows")
        return cls(
            tuple(int(side) for side in value["grid"]),
            tuple(float(side) for side in value["spacing"]),
            tuple(int(side) for side in value["peak"]),
            tuple(float(side) for side in value["peak_mm"]),
            windows if isinstance(windows, int) else 0,
            intensity_window(value),
        )


def intensity_window(volume: Any) -> tuple[float, float] | None:
    """A manifest row's ``volume``'s ``intensity_window`` (low, high), ``None`` where it has none (or a malformed
    one)."""
    shown = volume.get("intensity_window") if isinstance(volume, dict) else None
    if not isinstance(shown, list) or len(shown) != 2:
        return None
    if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in shown):
        return None
    return float(shown[0]), float(shown[1])


ANSWER_FIELDS = ("prompt", "answer", "generated", "tokens", "note")
"""The columns an answer's row has after the manifest's (``tokens`` on its image's first row, ``note`` on an empty
answer's row)."""


@dataclass
class Answer:
    """A prompted image's question and answer, as its rows carry them: ``tokens`` (each token's text, id and
    log-probability) on the image's first row only; ``note`` why nothing was mapped (an empty answer)."""

    prompt: str
    text: str
    generated: bool
    tokens: list[dict[str, Any]] | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {"prompt": self.prompt, "answer": self.text, "generated": self.generated}
        if self.tokens is not None:
            row["tokens"] = self.tokens
        if self.note is not None:
            row["note"] = self.note
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Answer | None:
        """The answer of a manifest row, ``None`` when it is no answer's row."""
        if not isinstance(row.get("prompt"), str) or "answer" not in row:
            return None
        tokens = row.get("tokens")
        note = row.get("note")
        return cls(
            row["prompt"],
            str(row.get("answer") or ""),
            bool(row.get("generated")),
            [dict(token) for token in tokens if isinstance(token, dict)] if isinstance(tokens, list) else None,
            str(note) if isinstance(note, str) else None,
        )

    @property
    def logprob(self) -> float | None:
        """The answer's log-probability (the sum of its tokens'), where this row lists them."""
        if not self.tokens:
            return None
        return float(sum(token["logprob"] for token in self.tokens))

    def shown(self) -> Prediction:
        """The question and its answer as one prediction, with the answer's probability."""
        logprob = self.logprob
        question = f"{self.prompt} \N{RIGHTWARDS ARROW} {self.text or '(empty answer)'}"
        return Prediction(-1, question, math.exp(logprob) if logprob is not None else math.nan)


def answer_prediction(label: str, token: int | None, logprob: float) -> Prediction:
    """An answer map's target as a prediction: its label, the answer token it explains (``None``: the whole answer
    or a word, a contrast), its log-probability and the probability that is (none for a contrast's positive
    difference)."""
    probability = math.exp(logprob) if logprob <= 0 else math.nan
    details = {"token": token, "logprob": round(logprob, 6)}
    return Prediction(token if token is not None else -1, label, probability, details=details)


def answer_target(target: Prediction) -> dict[str, Any]:
    """An answer row's ``target``: ``{name, token, logprob, probability}``."""
    details = target.details or {}
    probability = target.probability
    return {
        "name": target.name,
        "token": details.get("token"),
        "logprob": details.get("logprob"),
        "probability": round(probability, 6) if math.isfinite(probability) else None,
    }


def _answer_prediction(value: Any) -> Prediction | None:
    if not isinstance(value, dict) or not isinstance(value.get("logprob"), int | float):
        return None
    token = value.get("token")
    return answer_prediction(str(value.get("name", "")), token if isinstance(token, int) else None, value["logprob"])


def in_original_pixels(rows: list[Record], shown: tuple[int, int], original: tuple[int, int] | None) -> list[Record]:
    """``rows`` of an image explained at ``shown`` (height, width) with their boxes, areas and keypoints in the
    pixels of the ``original`` it was shrunk from (``--max-side``; ``None``: not shrunk), as copies."""
    if original is None or original == shown:
        return rows
    scale = original[0] / shown[0], original[1] / shown[1]
    return [
        replace(
            row,
            target=rescaled(row.target, *scale) if row.target is not None else None,
            predictions=[rescaled(p, *scale) for p in row.predictions],
        )
        for row in rows
    ]


def _prediction(value: Any) -> Prediction | None:
    if not isinstance(value, dict) or not isinstance(value.get("index"), int):
        return None
    probability = value.get("probability")
    box = value.get("box")
    share = value.get("share")
    return Prediction(
        value["index"],
        str(value.get("name", "")),
        math.nan if probability is None else probability,
        box=(float(box[0]), float(box[1]), float(box[2]), float(box[3]))
        if isinstance(box, list) and len(box) == 4
        else None,
        share=float(share) if isinstance(share, int | float) else None,
        score=str(value["score"]) if isinstance(value.get("score"), str) else None,
        details={key: item for key, item in value.items() if key not in _OWN_KEYS} or None,
    )


_OWN_KEYS = frozenset(("index", "name", "probability", "box", "share", "score"))
"""A prediction's keys in a row that are not a task's :attr:`~gradcam_cli.cam.results.Prediction.details`."""
