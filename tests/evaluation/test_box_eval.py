"""``gradcam eval`` per detection: deletion and insertion of each explained detection's score (re-found by IoU and
class in every perturbed image, 0 once it vanishes), pointing and energy in its own box, against a plain
reimplementation (a loop over the steps, one image per pass, torchvision's ``box_iou``); the ranking's cluster
bootstrap; the command line end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision.transforms.functional as TF
from square_model import square_image
from task_models import DETECTION_CLASSES, SquareDetector
from torchvision.ops import box_iou
from typer.testing import CliRunner

from gradcam_cli import EvalOptions, Explainer, load_model
from gradcam_cli.cam.maps import to_image_maps
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.evaluation.choose import evaluate
from gradcam_cli.evaluation.intervals import paired_interval
from gradcam_cli.evaluation.rank import rank
from gradcam_cli.evaluation.report import DetectionFigures
from gradcam_cli.evaluation.rows import image_from_row, image_row
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.models.tasks import DETECT, detection_spec

DETECTOR = f"{Path(__file__).resolve().parents[1] / 'task_models.py'}:build_detector"
STEPS = 6


def square_detector() -> LoadedModel:
    module = SquareDetector().eval()
    return LoadedModel(module, "square-detector", "none", DETECTION_CLASSES, detection_spec(module, None), DETECT)


@pytest.fixture
def two_squares(tmp_path: Path) -> Path:
    """One image with a red and a green square on grey, and one with a blue square."""
    folder = tmp_path / "squares"
    folder.mkdir()
    two = square_image((160, 120), (20, 16, 60, 56), "red")
    two.paste((20, 230, 20), (96, 60, 140, 104))
    two.save(folder / "two.png")
    square_image((128, 96), (70, 30, 110, 70), "blue").save(folder / "blue.png")
    return folder


# --- the reference -----------------------------------------------------------------------------------------------


def refound(model: torch.nn.Module, image: torch.Tensor, box: torch.Tensor, label: int) -> float:
    """The score of the detection of class ``label`` whose box overlaps ``box`` most, IoU at least 0.5, in the
    detector's output for ``image`` alone; 0 when there is none."""
    with torch.no_grad():
        found = model(image[None])[0]
    same = found["labels"] == label
    if not bool(same.any()):
        return 0.0
    ious = box_iou(box[None], found["boxes"][same])[0]
    best = int(ious.argmax())
    return float(found["scores"][same][best]) if float(ious[best]) >= 0.5 else 0.0


def reference_curves(
    model: torch.nn.Module, image: torch.Tensor, saliency: torch.Tensor, box: torch.Tensor, label: int, steps: int
) -> tuple[list[float], list[float]]:
    """Deletion (towards zero) and insertion (from the 11x11, sigma 5 blur) in the map's order, one step at a time."""
    height, width = saliency.shape
    order = torch.sort(saliency.flatten(), descending=True, stable=True).indices
    blurred = TF.gaussian_blur(image, [11, 11], [5.0, 5.0])
    deletion, insertion = [], []
    for k in range(steps + 1):
        chosen = torch.zeros(height * width, dtype=torch.bool)
        chosen[order[: round(k * height * width / steps)]] = True
        chosen = chosen.view(height, width)
        deletion.append(refound(model, torch.where(chosen, torch.zeros_like(image), image), box, label))
        insertion.append(refound(model, torch.where(chosen, image, blurred), box, label))
    return deletion, insertion


def reference_pointing(saliency: torch.Tensor, box: tuple[float, ...], tolerance: float) -> tuple[bool, float]:
    """The map's first maximum within ``tolerance`` pixels of the box (pixel centres), and its mass inside it."""
    row, col = divmod(int(saliency.flatten().argmax()), saliency.shape[1])
    x, y = col + 0.5, row + 0.5
    x1, y1, x2, y2 = box
    distance = math.hypot(max(x1 - x, 0.0, x - x2), max(y1 - y, 0.0, y - y2))
    ys, xs = torch.meshgrid(torch.arange(saliency.shape[0]) + 0.5, torch.arange(saliency.shape[1]) + 0.5, indexing="ij")
    inside = (xs >= x1) & (xs <= x2) & (ys >= y1) & (ys <= y2)
    mass = saliency.clamp_min(0)
    return distance <= tolerance, float(mass[inside].sum() / mass.sum())


def check_against_reference(
    model: LoadedModel,
    path: Path,
    methods: list[str],
    tolerance: float = 1e-5,
    vanishing: bool = True,
    **explainer: object,
) -> None:
    """``gradcam eval``'s figures of every explained detection against the reference's, within ``tolerance`` (a
    batched pass against one image alone: float32 rounding in a large detector); ``vanishing``: some detection must
    vanish on the way (a DETR's every query is a detection, whose box may never move away)."""
    options = EvalOptions(steps=STEPS, batch_size=5)
    explaining = Explainer(model, None, methods, **explainer)  # type: ignore[arg-type]
    report = evaluate(explaining, [path], options)
    assert not report.failed, report.failed
    picture = load_image(path)
    inputs = to_input_tensor(picture, model.input_spec)[None]
    targets, cams = explaining.compute_targets(inputs)
    found, picked = targets.detections[0], targets.picked[0]  # type: ignore[attr-defined]
    assert picked, "the test needs a detection"
    vanished = 0
    for method in methods:
        figures = report.ok[0].methods[method].detections
        assert [d.rank for d in figures] == list(range(1, len(picked) + 1))
        for k, d in enumerate(figures):
            box, label = found["boxes"][picked[k]].detach(), int(found["labels"][picked[k]])
            saliency = to_image_maps([c[:1] for c in cams[method][k]], inputs.shape[-2:], targets.region)[0]
            with explaining.adapter.pass_settings(explaining.score):  # a YOLO model's NMS confidence: the threshold
                deletion, insertion = reference_curves(model.module, inputs[0], saliency, box, label, STEPS)
            assert d.deletion == pytest.approx(deletion, abs=tolerance), (method, k)
            assert d.insertion == pytest.approx(insertion, abs=tolerance), (method, k)
            assert d.target.index == label and d.target.probability == pytest.approx(deletion[0], abs=tolerance)
            original = to_image_maps([c[:1] for c in cams[method][k]], (picture.height, picture.width), targets.region)
            assert d.target.box is not None
            hit, energy = reference_pointing(original[0], d.target.box, options.tolerance)
            assert (d.hit, d.energy) == (hit, pytest.approx(energy, abs=1e-4)), (method, k)
            vanished += 0.0 in deletion
    assert vanished or not vanishing  # some detection vanished on the way: scored 0, as the reference's re-finding says


# --- tests -------------------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_per_detection_curves_pointing_and_energy_match_a_plain_reimplementation(two_squares: Path) -> None:
    check_against_reference(square_detector(), two_squares / "two.png", ["gradcam", "randomcam"])


def test_a_detection_that_vanishes_scores_zero_and_a_faithful_map_beats_randomcam(two_squares: Path) -> None:
    model = square_detector()
    options = EvalOptions(steps=STEPS)
    report = evaluate(Explainer(model, None, ["gradcam", "randomcam"]), [two_squares], options)
    by_image = {Path(image.image).name: image for image in report.ok}
    red, green = by_image["two.png"].methods["gradcam"].detections
    assert [red.target.name, green.target.name] == ["red", "green"]
    for d in (red, green):  # the map's top sixth holds the square: removing it leaves no detection of its colour
        assert d.deletion[1:] == [0.0] * STEPS and d.hit and d.energy > 0.8
    summary = {m: report.summary(m)["detections"] for m in ("gradcam", "randomcam")}
    assert summary["gradcam"]["count"] == summary["randomcam"]["count"] == 3
    assert summary["gradcam"]["deletion_auc"] < summary["randomcam"]["deletion_auc"]
    assert summary["gradcam"]["pointing"] == 100.0 and summary["randomcam"]["pointing"] < 100.0
    worst = summary["randomcam"]["worst"]
    gaps = [row["insertion_auc"] - row["deletion_auc"] for row in worst]
    assert gaps == sorted(gaps) and len(worst) == 3
    rows = report.to_dict()["per_image"][0]["methods"]["gradcam"]["detections"]
    assert {"rank", "explained", "deletion_auc", "insertion_auc", "hit", "energy", "deletion_curve"} <= set(rows[0])


@pytest.mark.quick
def test_the_cluster_bootstrap_weighs_images_by_their_detections() -> None:
    d = torch.tensor([0.1, 0.4, -0.2, 0.3, 0.0, 0.25])
    ones = torch.ones(6)
    assert paired_interval(d, 3, weights=ones) == pytest.approx(paired_interval(d, 3), abs=1e-12)
    weights = torch.tensor([1.0, 3.0, 1.0, 2.0, 1.0, 1.0])
    low, high = paired_interval(d, 3, weights=weights)
    expanded = float((d * weights).sum() / weights.sum())  # the mean over detections
    assert low <= expanded <= high and (low, high) != paired_interval(d, 3)


@pytest.mark.quick
def test_rank_ranks_the_per_detection_metrics_over_detections(two_squares: Path) -> None:
    model = square_detector()
    report = evaluate(Explainer(model, None, ["gradcam", "randomcam"]), [two_squares], EvalOptions(steps=STEPS))
    rows = {(row.metric, row.method): row for row in rank(report, resamples=200)}
    figures: dict[str, list[DetectionFigures]] = {
        m: [d for image in report.ok for d in image.methods[m].detections] for m in report.methods
    }
    for method in report.methods:  # the mean over the 3 detections, not over the 2 images' means
        row = rows[("box_deletion_auc", method)]
        assert row.mean == pytest.approx(sum(d.deletion_auc for d in figures[method]) / 3)
        assert row.images == 2
    assert rows[("box_deletion_auc", "gradcam")].rank == 1 and rows[("box_pointing", "gradcam")].rank == 1


def test_gradcam_eval_on_a_detector_end_to_end(two_squares: Path, tmp_path: Path) -> None:
    labels = tmp_path / "classes.txt"
    labels.write_text("\n".join(DETECTION_CLASSES) + "\n", encoding="utf-8")
    base = [str(two_squares), "--model", DETECTOR, "--labels", str(labels), "--steps", str(STEPS)]
    text = CliRunner().invoke(eval_app, [*base, "--method", "gradcam,randomcam"])
    assert text.exit_code == EXIT_OK, text.output
    lines = text.stdout.splitlines()
    assert lines[0].endswith(f"2 image(s), {STEPS} steps")
    header = next(line for line in lines if line.startswith("method"))
    assert header.split()[1:] == ["box", "deletion", "box", "insertion", "box", "pointing", "%", "box", "energy"]
    table = lines[lines.index("per detection:") + 1 :]
    assert table[0].split()[:3] == ["image", "#", "class"]
    assert sum(" gradcam " in line for line in table[1:7]) == 3  # a row per detection and method
    assert "worst detections (randomcam; insertion minus deletion AUC, lowest first):" in lines
    as_json = CliRunner().invoke(eval_app, [*base, "--json", "--boxes", str(_boxes(tmp_path))])
    assert as_json.exit_code == EXIT_OK, as_json.output
    report = json.loads(as_json.stdout)
    summary = report["methods"]["gradcam"]
    assert summary["detections"]["count"] == 3 and summary["detections"]["pointing"] == 100.0
    assert summary["pointing"]["overall"]["count"] == 2  # the ground-truth boxes, each against its detection's map
    assert "1 image(s) have no boxes" in as_json.stderr
    ranked = CliRunner().invoke(eval_app, [*base, "--rank", "--method", "gradcam", "--json"])
    assert ranked.exit_code == EXIT_OK, ranked.output
    metrics = {json.loads(line)["metric"] for line in ranked.stdout.splitlines()}
    assert {"box_deletion_auc", "box_insertion_auc", "box_pointing", "box_energy"} <= metrics
    given = CliRunner().invoke(eval_app, [*base, "--rank", "--road"])  # the user's own --road: refused, not dropped
    assert given.exit_code == EXIT_USAGE and "plan:" not in given.stderr  # refused before the plan
    assert given.stderr.strip().splitlines()[-1].startswith("error: --road is for classifiers; ")


def _boxes(tmp_path: Path) -> Path:
    boxes = tmp_path / "boxes.csv"
    boxes.write_text("image,x1,y1,x2,y2,class\ntwo.png,20,16,60,56,red\ntwo.png,96,60,140,104,green\n", "utf-8")
    return boxes


@pytest.mark.slow
def test_per_detection_curves_match_the_reference_on_a_random_faster_rcnn(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = load_model("fasterrcnn_resnet50_fpn", "none", input_size=128)
    detector: Any = model.module.eval()
    detector.roi_heads.score_thresh = 0.0  # random weights: every proposal is a detection
    detector.rpn._pre_nms_top_n = detector.rpn._post_nms_top_n = {"training": 100, "testing": 50}  # a small config
    detector.roi_heads.detections_per_img = 10
    path = tmp_path / "photo.png"
    square_image((160, 128), (40, 30, 110, 100), "green").save(path)
    check_against_reference(model, path, ["gradcam"], 1e-4, max_detections=2, score_threshold=0.0)


@pytest.mark.quick
def test_a_detections_rows_read_back_as_written(two_squares: Path) -> None:
    """``--rank --report``'s rows file keeps each detection's figures (``--skip-existing`` resumes from them)."""
    report = evaluate(Explainer(square_detector(), None, ["gradcam"]), [two_squares / "two.png"], EvalOptions(steps=3))
    image = report.ok[0]
    again = image_from_row(json.loads(json.dumps(image_row(image))))
    assert again.methods["gradcam"].detections == image.methods["gradcam"].detections  # NaN elsewhere: not ==
    assert len(again.methods["gradcam"].detections) == 2 and again.target == image.target


@pytest.mark.slow
def test_per_detection_curves_match_the_reference_on_the_tiny_yolo(checkpoint: Path, tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from yolo_model import square_scene

    from gradcam_cli.options import ModelOptions

    path = tmp_path / "scene.png"
    square_scene([(0, 8, 8, 32, 32), (1, 36, 30, 60, 54)]).save(path)
    check_against_reference(load_model(ModelOptions(f"yolo:{checkpoint}")), path, ["gradcam"])


@pytest.mark.quick
def test_the_docs_detector_example_prints_what_docs_evaluation_md_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import shlex

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = text[text.index("### Detections") :]
    block = section[section.index("```console\n") + len("```console\n") :]
    command, *shown = block[: block.index("```")].rstrip("\n").splitlines()
    monkeypatch.chdir(root)
    result = CliRunner().invoke(eval_app, shlex.split(command)[3:])  # past "$ gradcam eval"
    assert result.exit_code == EXIT_OK, result.output
    printed = [*result.stderr.splitlines()[:-1], *result.stdout.splitlines()]
    assert printed == shown[:-1]
    assert re.fullmatch(r"evaluated 1 image\(s\), 0 failed, in .+", result.stderr.splitlines()[-1])


@pytest.mark.slow
def test_per_detection_curves_match_the_reference_on_a_tiny_detr(tmp_path: Path) -> None:
    from detr_models import save_detr

    folder = save_detr(tmp_path / "detr")
    path = tmp_path / "photo.png"
    image = square_image((160, 120), (20, 16, 60, 56), "red")
    image.paste((20, 20, 230), (90, 50, 140, 100))
    image.save(path)
    model = load_model(f"hf:{folder}")
    check_against_reference(model, path, ["gradcam"], 1e-4, False, max_detections=2, score_threshold=0.0)
