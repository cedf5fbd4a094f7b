"""Evaluating saliency maps over many images: faithfulness, ground-truth boxes and the randomisation sanity check.

The protocol (the formulas themselves are in :mod:`gradcam_cli.metrics`):

- Every image is resized as for explaining (no crop) and its *target* is the model's top class (or a fixed one).
  Each method's map is computed once at the network input's resolution, for the perturbation metrics, and at the
  original image's resolution, for the boxes.
- **Deletion** (Petsiuk et al. 2018): pixels of the network input are replaced by the *baseline*, zero in the
  normalised input space (the dataset's mean colour), most salient first. **Insertion**: starting from the input
  blurred with an 11x11 Gaussian kernel of sigma 5 (as in RISE), the original pixels are put back, most salient
  first. Both curves have ``steps + 1`` points: at point ``k`` the top ``round(k / steps * H * W)`` pixels are
  perturbed, so the x axis is the fraction of pixels, 0 to 1. The y axis is the softmax probability of the target
  class; the AUC is the trapezoidal area under it (x in [0, 1]). Lower deletion and higher insertion AUC are better.
- **Average Drop / Increase in Confidence** (Chattopadhay et al. 2018): the map is multiplied into the normalised
  input (``x * map``, so unexplained regions fade to the mean colour, the deletion baseline), and the target's
  probability O on that is compared with Y on the image.
- The perturbed images of one image (all methods, both curves, the masked image) go through the model in batches of
  ``batch_size``.
- **Boxes**: pointing game and energy-based pointing game on the original-resolution map, per box class. When a
  box's class is one of the model's class names the map of that class is used, otherwise the target's.
- **Sanity** (Adebayo et al. 2018): copies of the model with the top 1, 2, ..., N parameterised modules
  re-initialised (cascading from the output down; ``reset_parameters()``, seeded) explain the same target; the
  Spearman rank correlation with the trained model's map is averaged over images. A method whose maps still
  correlate above :data:`SANITY_THRESHOLD` at some stage of the cascade is flagged: a map that explains the model
  changes as soon as the output layer is re-initialised.
"""

from __future__ import annotations

import copy
import csv
import math
import os
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePath
from typing import Any

import torch
from torch import nn

from . import metrics
from .discovery import InputImage, discover
from .engine import _first_tensor, model_state_preserved
from .errors import GradcamError, UsageError
from .explain import Explainer, Prediction
from .images import load_image, to_input_tensor
from .maps import to_image_maps

BLUR_KERNEL = 11
BLUR_SIGMA = 5.0
SANITY_THRESHOLD = 0.9
"""Mean Spearman correlation above which a method's maps 'barely change' when the model is randomised."""
OUTSIDE_THRESHOLD = 0.5
"""Images with less than this share of the map's energy inside the boxes are listed as 'evidence outside'."""


# ----------------------------------------------------------------------------------------------- ground truth


@dataclass(frozen=True)
class GroundTruthBox:
    """One object box: the image it belongs to (as written in the file), its corners, its class, where it came from."""

    image: str
    box: metrics.Box
    label: str | None
    source: str


def read_boxes(path: str | Path) -> list[GroundTruthBox]:
    """Boxes from a CSV file (``image,x1,y1,x2,y2[,class]``) or a folder of Pascal VOC XML files.

    CSV corners are pixel coordinates with exclusive ends (``0,0,10,10`` covers pixels 0..9); a first line that is
    not a box is taken as a header; blank lines and lines starting with ``#`` are skipped. VOC's 1-based inclusive
    ``xmin..xmax`` become ``xmin - 1 .. xmax``. A malformed line raises :class:`UsageError` naming it.
    """
    path = Path(path)
    if path.is_dir():
        boxes = _read_voc(path)
    elif path.is_file():
        boxes = _read_csv(path)
    else:
        raise UsageError(f"boxes file {path} does not exist")
    if not boxes:
        raise UsageError(f"no boxes in {path}")
    return boxes


def _read_csv(path: Path) -> list[GroundTruthBox]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read boxes file {path}: {getattr(error, 'strerror', None) or error}") from error
    boxes = []
    first = True
    for number, row in enumerate(csv.reader(text.splitlines()), 1):
        cells = [cell.strip() for cell in row]
        if not any(cells) or cells[0].startswith("#"):
            continue
        where = f"{path} line {number}"
        if first and len(cells) >= 5 and not _is_number(cells[1]):
            first = False
            continue  # a header
        first = False
        if len(cells) not in (5, 6) or not cells[0]:
            raise UsageError(f"{where}: expected image,x1,y1,x2,y2[,class], got {len(cells)} field(s)")
        label = cells[5] if len(cells) == 6 and cells[5] else None
        boxes.append(GroundTruthBox(cells[0], _corners(cells[1:5], where), label, where))
    return boxes


def _read_voc(folder: Path) -> list[GroundTruthBox]:
    files = sorted(folder.glob("*.xml"))
    if not files:
        raise UsageError(f"no .xml files in {folder}; --boxes takes a CSV file or a folder of Pascal VOC XML files")
    boxes = []
    for file in files:
        try:
            root = ElementTree.parse(file).getroot()
        except ElementTree.ParseError as error:
            raise UsageError(f"{file} line {error.position[0]}: not valid XML ({error})") from error
        except OSError as error:
            raise UsageError(f"cannot read {file}: {error.strerror or error}") from error
        filename = (root.findtext("filename") or "").strip()
        if not filename:
            raise UsageError(f"{file}: no <filename> element (is it a Pascal VOC annotation?)")
        for number, obj in enumerate(root.iter("object"), 1):
            where = f"{file} object {number}"
            box = obj.find("bndbox")
            if box is None:
                raise UsageError(f"{where}: no <bndbox>")
            cells = [(box.findtext(tag) or "").strip() for tag in ("xmin", "ymin", "xmax", "ymax")]
            x1, y1, x2, y2 = _corners(cells, where)
            label = (obj.findtext("name") or "").strip() or None
            boxes.append(GroundTruthBox(filename, (x1 - 1, y1 - 1, x2, y2), label, where))
    return boxes


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _corners(cells: Sequence[str], where: str) -> metrics.Box:
    values = []
    for name, cell in zip(("x1", "y1", "x2", "y2"), cells, strict=True):
        if not _is_number(cell):
            raise UsageError(f"{where}: {name} {cell!r} is not a number")
        values.append(float(cell))
    x1, y1, x2, y2 = values
    if not (x1 < x2 and y1 < y2):
        raise UsageError(f"{where}: a box needs x1 < x2 and y1 < y2, got {x1:g},{y1:g},{x2:g},{y2:g}")
    return x1, y1, x2, y2


def match_boxes(
    boxes: Sequence[GroundTruthBox], images: Sequence[InputImage]
) -> tuple[dict[Path, list[GroundTruthBox]], list[GroundTruthBox]]:
    """Assign boxes to input images: ``({image path: boxes}, boxes naming no input image)``.

    A box's image matches an input whose path ends with it: a bare file name, or a relative path of any depth
    (``JPEGImages/0001.jpg``); an absolute path must be the input's. A name that fits several inputs is an error.
    """
    by_name: dict[str, list[InputImage]] = {}
    for image in images:
        by_name.setdefault(image.path.name, []).append(image)
    matched: dict[Path, list[GroundTruthBox]] = {}
    unmatched = []
    for entry in boxes:
        wanted = PurePath(os.path.normpath(entry.image.replace("\\", "/")))
        candidates = [
            image
            for image in by_name.get(wanted.name, [])
            if _path_ends_with(Path(os.path.normpath(image.path.absolute())), wanted)
        ]
        if len(candidates) > 1:
            names = ", ".join(str(c.path) for c in candidates[:3])
            raise UsageError(f"{entry.source}: {entry.image!r} matches several inputs ({names}); give a longer path")
        if candidates:
            matched.setdefault(candidates[0].path, []).append(entry)
        else:
            unmatched.append(entry)
    return matched, unmatched


def _path_ends_with(path: PurePath, tail: PurePath) -> bool:
    if tail.is_absolute():
        return path == tail
    return len(tail.parts) <= len(path.parts) and path.parts[-len(tail.parts) :] == tail.parts


# ------------------------------------------------------------------------------------------------- results


@dataclass
class EvalOptions:
    """How to evaluate: curve resolution, batching, target, pointing tolerance and the sanity check."""

    steps: int = 50
    batch_size: int = 16
    target: int | None = None
    tolerance: float = metrics.POINTING_TOLERANCE
    sanity: bool = False
    sanity_layers: int = 3
    seed: int = 0


@dataclass
class BoxScore:
    """Pointing game and energy for one class of boxes in one image."""

    label: str | None
    target: Prediction
    hit: bool
    energy: float


@dataclass
class MethodScores:
    """One method's figures on one image."""

    deletion: list[float]
    insertion: list[float]
    masked_probability: float
    boxes: list[BoxScore] = field(default_factory=list)
    sanity: list[float] = field(default_factory=list)

    @property
    def deletion_auc(self) -> float:
        return metrics.auc(self.deletion)

    @property
    def insertion_auc(self) -> float:
        return metrics.auc(self.insertion)


@dataclass
class ImageScores:
    """Everything measured on one image (``error`` set and nothing else when it failed)."""

    image: str
    target: Prediction | None = None
    methods: dict[str, MethodScores] = field(default_factory=dict)
    error: str | None = None


@dataclass
class EvalReport:
    """All images' scores plus what is needed to summarise them."""

    model: str
    layers: list[str]
    methods: list[str]
    options: EvalOptions
    sanity_modules: list[str]
    images: list[ImageScores]
    unmatched_boxes: int = 0

    @property
    def ok(self) -> list[ImageScores]:
        return [image for image in self.images if image.error is None]

    @property
    def failed(self) -> list[ImageScores]:
        return [image for image in self.images if image.error is not None]

    @property
    def has_boxes(self) -> bool:
        return any(s.boxes for image in self.ok for s in image.methods.values())

    def summary(self, method: str) -> dict[str, Any]:
        """Figures over all images for one method (means, percentages, per-class tables, the worst images)."""
        scores = [(image, image.methods[method]) for image in self.ok]
        out: dict[str, Any] = {"images": len(scores)}
        if not scores:
            return out
        full = [image.target.probability for image, _ in scores if image.target]
        masked = [s.masked_probability for _, s in scores]
        out.update(
            deletion_auc=_mean([s.deletion_auc for _, s in scores]),
            insertion_auc=_mean([s.insertion_auc for _, s in scores]),
            average_drop=metrics.average_drop(full, masked),
            increase_in_confidence=metrics.increase_in_confidence(full, masked),
            deletion_curve=[_mean(column) for column in zip(*(s.deletion for _, s in scores), strict=True)],
            insertion_curve=[_mean(column) for column in zip(*(s.insertion for _, s in scores), strict=True)],
        )
        rows = [(image, box) for image, s in scores for box in s.boxes]
        if rows:
            out["pointing"] = _pointing_table([box for _, box in rows])
            outside = [(image, box) for image, box in rows if not box.energy >= OUTSIDE_THRESHOLD]
            outside.sort(key=lambda row: -1.0 if math.isnan(row[1].energy) else row[1].energy)
            out["outside"] = [
                {
                    "image": image.image,
                    "class": box.label,
                    "energy": box.energy,
                    "hit": box.hit,
                    "explained": box.target.name,
                    "probability": box.target.probability,
                }
                for image, box in outside
            ]
        if self.sanity_modules:
            stages = [_mean(column) for column in zip(*(s.sanity for _, s in scores), strict=True)]
            out["sanity"] = {
                "modules": self.sanity_modules,
                "spearman": stages,
                "threshold": SANITY_THRESHOLD,
                "flagged": any(rho > SANITY_THRESHOLD for rho in stages),
            }
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON-ready data (NaN becomes None)."""
        data = {
            "model": self.model,
            "layers": self.layers,
            "steps": self.options.steps,
            "target": self.options.target,
            "tolerance": self.options.tolerance,
            "deletion_baseline": "zero in normalised input space (the mean colour)",
            "insertion_baseline": f"Gaussian blur, kernel {BLUR_KERNEL}, sigma {BLUR_SIGMA}",
            "images": len(self.images),
            "failed": [{"image": image.image, "error": image.error} for image in self.failed],
            "unmatched_boxes": self.unmatched_boxes,
            "methods": {method: self.summary(method) for method in self.methods},
            "per_image": [_image_dict(image) for image in self.ok],
        }
        return _json_safe(data)


def _pointing_table(boxes: Sequence[BoxScore]) -> dict[str, Any]:
    def cell(group: Sequence[BoxScore]) -> dict[str, Any]:
        energies = [b.energy for b in group if not math.isnan(b.energy)]
        hits = sum(b.hit for b in group)
        return {
            "count": len(group),
            "hits": hits,
            "accuracy": 100.0 * hits / len(group),
            "energy": _mean(energies) if energies else math.nan,
        }

    labels = sorted({b.label for b in boxes if b.label is not None})
    per_class = {label: cell([b for b in boxes if b.label == label]) for label in labels}
    return {"overall": cell(boxes), "per_class": per_class}


def _image_dict(image: ImageScores) -> dict[str, Any]:
    assert image.target is not None
    return {
        "image": image.image,
        "target": _prediction_dict(image.target),
        "methods": {
            name: {
                "deletion_auc": s.deletion_auc,
                "insertion_auc": s.insertion_auc,
                "masked_probability": s.masked_probability,
                "deletion_curve": s.deletion,
                "insertion_curve": s.insertion,
                "boxes": [
                    {"class": b.label, "explained": _prediction_dict(b.target), "hit": b.hit, "energy": b.energy}
                    for b in s.boxes
                ],
                **({"sanity_spearman": s.sanity} if s.sanity else {}),
            }
            for name, s in image.methods.items()
        },
    }


def _prediction_dict(p: Prediction) -> dict[str, Any]:
    return {"index": p.index, "name": p.name, "probability": p.probability}


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def _mean(values: Sequence[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


# ------------------------------------------------------------------------------------------------ running


def parameterised_modules(model: nn.Module) -> list[str]:
    """Names of the modules that own parameters, in registration order (for most models, the forward order)."""
    return [name for name, module in model.named_modules() if name and any(True for _ in module.parameters(False))]


def reinitialise(module: nn.Module, seed: int) -> None:
    """Re-initialise ``module``'s own parameters reproducibly: ``reset_parameters()`` where it exists (BatchNorm
    also forgets its running statistics), otherwise N(0, 0.02^2) weights and zero 1-D parameters."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
            return
        with torch.no_grad():
            for param in module.parameters(recurse=False):
                if param.dim() > 1:
                    param.normal_(0.0, 0.02)
                else:
                    param.zero_()


class Evaluator:
    """Run the evaluation protocol (see the module docstring) with one :class:`Explainer` over many images."""

    def __init__(self, explainer: Explainer, options: EvalOptions | None = None) -> None:
        self.explainer = explainer
        self.options = options or EvalOptions()
        if self.options.steps < 2:
            raise UsageError("--steps must be at least 2")
        if self.options.batch_size < 1:
            raise UsageError("--batch-size must be at least 1")
        self.sanity_modules: list[str] = []
        self.randomised: list[Explainer] = []
        if self.options.sanity:
            self._build_randomised()

    def _build_randomised(self) -> None:
        """One explainer per cascade stage: stage k has the top k parameterised modules re-initialised."""
        if self.options.sanity_layers < 1:
            raise UsageError("--sanity-layers must be at least 1")
        loaded = self.explainer.model
        names = parameterised_modules(loaded.module)[::-1][: self.options.sanity_layers]
        if not names:
            raise UsageError("--sanity: the model has no parameters to re-initialise")
        self.sanity_modules = names
        for stage in range(1, len(names) + 1):
            module = copy.deepcopy(loaded.module).cpu()
            for depth, name in enumerate(names[:stage]):
                reinitialise(module.get_submodule(name), self.options.seed + depth)
            module.to(self.explainer.device)
            self.randomised.append(
                Explainer(
                    replace(loaded, module=module),
                    self.explainer.layer_names,
                    self.explainer.methods,
                    aug_smooth=self.explainer.aug_smooth,
                    eigen_smooth=self.explainer.eigen_smooth,
                    score_batch_size=self.explainer.score_batch_size,
                )
            )

    def run(
        self,
        images: Sequence[InputImage | str | Path],
        boxes: Sequence[GroundTruthBox] | None = None,
        on_image: Callable[[], Any] | None = None,
    ) -> EvalReport:
        """Evaluate every image; ``on_image`` is called once per image (for progress bars)."""
        inputs = list(images)
        if not all(isinstance(image, InputImage) for image in inputs):
            inputs = discover([getattr(image, "path", image) for image in inputs])
        matched, unmatched = match_boxes(boxes, inputs) if boxes else ({}, [])
        if boxes and not matched:
            raise UsageError(f"none of the {len(boxes)} boxes names one of the input images (e.g. {boxes[0].image!r})")
        results = []
        for image in inputs:
            results.append(self.evaluate_image(image.path, matched.get(image.path, [])))
            if on_image:
                on_image()
        return EvalReport(
            model=self.explainer.model.name,
            layers=list(self.explainer.layer_names),
            methods=list(self.explainer.methods),
            options=self.options,
            sanity_modules=self.sanity_modules,
            images=results,
            unmatched_boxes=len(unmatched),
        )

    def evaluate_image(self, path: Path, boxes: Sequence[GroundTruthBox] = ()) -> ImageScores:
        """All figures for one image; a failure to read or run it is returned as ``error``, not raised."""
        try:
            return self._evaluate(path, boxes)
        except UsageError:
            raise
        except GradcamError as error:
            return ImageScores(str(path), error=str(error))
        except Exception as error:
            return ImageScores(str(path), error=f"{path}: {type(error).__name__}: {error}")

    def _evaluate(self, path: Path, boxes: Sequence[GroundTruthBox]) -> ImageScores:
        explainer = self.explainer
        picture = load_image(path)
        inputs = to_input_tensor(picture, explainer.model.input_spec).unsqueeze(0).to(explainer.device)
        probabilities, targets, cams = explainer.compute(inputs, self.options.target)
        target_index = int(targets[0, 0])
        target = explainer.prediction(target_index, float(probabilities[0, target_index]))
        input_size = tuple(inputs.shape[-2:])
        maps = {method: to_image_maps(cams[method][0], input_size)[0] for method in explainer.methods}
        scores = self._perturbation_scores(inputs[0], target, maps)
        if boxes:
            self._score_boxes(scores, inputs, (picture.height, picture.width), boxes, target, cams)
        for randomised in self.randomised:
            _, _, random_cams = randomised.compute(inputs, target_index)
            for method in explainer.methods:
                random_map = to_image_maps(random_cams[method][0], input_size)[0]
                scores[method].sanity.append(metrics.spearman(maps[method], random_map))
        return ImageScores(str(path), target, scores)

    def _perturbation_scores(
        self, image: torch.Tensor, target: Prediction, maps: dict[str, torch.Tensor]
    ) -> dict[str, MethodScores]:
        """Deletion and insertion curves and the masked-image probability for every method, batched."""
        import torchvision.transforms.functional as TF

        steps = self.options.steps
        height, width = image.shape[-2:]
        counts = metrics.step_counts(height * width, steps)
        baseline = torch.zeros_like(image)
        blurred = TF.gaussian_blur(image, [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA])
        ranks = {method: metrics.importance_ranks(saliency) for method, saliency in maps.items()}

        def build(job: tuple) -> torch.Tensor:
            if job[0] == "baseline":
                return baseline
            if job[0] == "blurred":
                return blurred
            method, kind, k = job
            if kind == "masked":
                return image * maps[method]
            perturbed = ranks[method] < counts[k]
            if kind == "deletion":
                return torch.where(perturbed, baseline, image)
            return torch.where(perturbed, image, blurred)

        jobs: list[tuple] = [("baseline",), ("blurred",)]
        for method in maps:
            jobs += [(method, kind, k) for kind in ("deletion", "insertion") for k in range(1, steps)]
            jobs.append((method, "masked", 0))
        scores = dict(zip(jobs, self._probabilities(jobs, build, target.index), strict=True))
        result = {}
        for method in maps:
            deletion = [scores[(method, "deletion", k)] for k in range(1, steps)]
            insertion = [scores[(method, "insertion", k)] for k in range(1, steps)]
            result[method] = MethodScores(
                deletion=[target.probability, *deletion, scores[("baseline",)]],
                insertion=[scores[("blurred",)], *insertion, target.probability],
                masked_probability=scores[(method, "masked", 0)],
            )
        return result

    def _probabilities(self, jobs: list[tuple], build: Callable[[tuple], torch.Tensor], target: int) -> Iterator[float]:
        """The target's softmax probability for each job's image, forwarded ``batch_size`` images at a time."""
        module = self.explainer.model.module
        size = self.options.batch_size
        with model_state_preserved(module), torch.inference_mode():
            for start in range(0, len(jobs), size):
                batch = torch.stack([build(job) for job in jobs[start : start + size]])
                output = module(batch)
                logits = output if isinstance(output, torch.Tensor) else _first_tensor(output)
                yield from logits.float().softmax(dim=1)[:, target].tolist()

    def _score_boxes(
        self,
        scores: dict[str, MethodScores],
        inputs: torch.Tensor,
        size: tuple[int, int],
        boxes: Sequence[GroundTruthBox],
        target: Prediction,
        cams: dict[str, list[list[torch.Tensor]]],
    ) -> None:
        """Pointing game and energy per box class, on maps at the original image's resolution."""
        labels = list(dict.fromkeys(box.label for box in boxes))
        for label in labels:
            group = [box.box for box in boxes if box.label == label]
            explained, group_cams = target, cams
            class_index = self._class_of(label)
            if class_index is not None and class_index != target.index:
                probabilities, _, group_cams = self.explainer.compute(inputs, class_index)
                explained = self.explainer.prediction(class_index, float(probabilities[0, class_index]))
            for method, method_scores in scores.items():
                saliency = to_image_maps(group_cams[method][0], size)[0]
                method_scores.boxes.append(
                    BoxScore(
                        label,
                        explained,
                        metrics.pointing_hit(saliency, group, self.options.tolerance),
                        metrics.energy_inside(saliency, group),
                    )
                )

    def _class_of(self, label: str | None) -> int | None:
        categories = self.explainer.model.categories
        if label is None or categories is None:
            return None
        matches = [i for i, name in enumerate(categories) if name.lower() == label.lower()]
        return matches[0] if len(matches) == 1 else None


def evaluate(
    explainer: Explainer,
    images: Sequence[InputImage | str | Path],
    options: EvalOptions | None = None,
    boxes: str | Path | Sequence[GroundTruthBox] | None = None,
    on_image: Callable[[], Any] | None = None,
) -> EvalReport:
    """Evaluate ``explainer``'s maps on ``images`` (files, folders or globs); ``boxes``: a file, folder or list."""
    if isinstance(boxes, str | Path):
        boxes = read_boxes(boxes)
    return Evaluator(explainer, options).run(images, boxes, on_image)
