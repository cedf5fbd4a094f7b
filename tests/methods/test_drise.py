"""D-RISE (``--method drise``, gradcam_cli/cam/drise.py): held to the paper's formula written out here, one mask at a
time with loops over the detections (the masks drawn again by method_reference.py's ``rise_masks``), on the hand-built
square detector, a torchvision Faster R-CNN with random weights and the tiny YOLO the tests train; one set of masked
passes serves every detection (passes counted); refused for other tasks in one line; seeded; through the CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from cam_reference import pearson
from method_reference import Detection, drise_maps, drise_reference, minmax, rise_masks
from square_model import square_image
from task_models import DETECTION_CLASSES, SquareDetector
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.drise import DetectionVectors, mask_weights
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE, UsageError
from gradcam_cli.io.images import to_input_tensor
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.models.tasks import DETECT, detection_spec
from gradcam_cli.options import PerturbationOptions

ROOT = Path(__file__).parents[2]
REQUIRED = 0.999


# --- the paper's formula, written out ----------------------------------------------------------------------------


def top_score_vector(label: int, score: float, classes: int) -> list[float]:
    """A torchvision detection's class vector: its score at its label, the rest spread over the other classes."""
    return [score if c == label else (1 - score) / (classes - 1) for c in range(classes)]


def torchvision_detections(output: dict[str, torch.Tensor], classes: int) -> list[Detection]:
    return [
        (box, top_score_vector(int(label), float(score), classes), 1.0)
        for box, label, score in zip(output["boxes"].tolist(), output["labels"], output["scores"], strict=True)
    ]


def explained_of(found: list[Detection], scores: list[float], threshold: float, most: int) -> list[Detection]:
    order = sorted(range(len(found)), key=lambda i: -scores[i])
    return [found[i] for i in order if scores[i] >= threshold][:most]


def check_against_reference(
    model, x, options: PerturbationOptions, run, explained: list[Detection], **keywords
) -> dict[int, torch.Tensor]:
    """gradcam's D-RISE maps of ``x`` held to :func:`drise_reference`'s; returns them (by rank)."""
    mine = drise_maps(model, x, options, **keywords)
    masks = rise_masks(
        options.rise_masks, options.rise_grid, options.rise_probability, tuple(x.shape[-2:]), options.seed
    )
    expected = drise_reference(run, x, explained, masks, options.rise_probability)
    assert len(explained) >= 2 and sorted(mine) == list(range(len(explained) + 1))
    for rank, reference in enumerate(expected, 1):
        assert float(reference.max()) > 0
        assert pearson(mine[rank], minmax(reference)) >= REQUIRED, rank
    assert pearson(mine[0], minmax(sum(expected))) >= REQUIRED  # the combined map: the sum of the detections'
    return mine


# --- models ------------------------------------------------------------------------------------------------------


def square_detector() -> LoadedModel:
    module = SquareDetector().eval()
    spec = detection_spec(module, None)
    return LoadedModel(module, "square-detector", "none", DETECTION_CLASSES, spec, DETECT)


def random_faster_rcnn(name: str = "fasterrcnn_resnet50_fpn", size: int = 128) -> LoadedModel:
    """A Faster R-CNN with random weights (seeded), its own cut-off lowered so that every proposal is a detection
    (the mobile one's random features vanish: its detections all score alike, and only their boxes differ)."""
    torch.manual_seed(0)
    loaded = load_model(name, "none", input_size=size)
    loaded.module.eval().roi_heads.score_thresh = 0.0
    return loaded


# --- tests -------------------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_drise_is_registered_for_detectors_only_and_refused_for_others_in_one_line() -> None:
    method = METHODS["drise"]
    assert method.tasks == ("detect",) and not method.uses_layer and not method.uses_gradients
    doc = method.compute.__doc__ or ""
    assert "CVPR 2021" in doc and "IoU" in doc and "cos" in doc
    with pytest.raises(UsageError) as caught:
        Explainer(load_model("tests/square_model.py:build", "none"), methods=["drise"])
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--method drise is for detectors; a classifier takes ")


@pytest.mark.quick
def test_the_similarity_is_iou_times_cosine_times_objectness_and_the_best_detection_weighs() -> None:
    explained = DetectionVectors(torch.tensor([[0.0, 0.0, 10.0, 10.0]]), torch.tensor([[1.0, 0.0]]))
    boxes = torch.tensor([[0.0, 0.0, 10.0, 5.0], [0.0, 0.0, 10.0, 10.0], [50.0, 50.0, 60.0, 60.0]])
    classes = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    weights = mask_weights(explained, DetectionVectors(boxes, classes))
    assert float(weights[0]) == pytest.approx(1 / math.sqrt(2))  # IoU 1, cosine 1/sqrt(2) beats IoU 1/2, cosine 1
    halved = mask_weights(explained, DetectionVectors(boxes, classes, torch.tensor([1.0, 0.5, 1.0])))
    assert float(halved[0]) == pytest.approx(0.5)  # objectness halves the second: the first's 1/2 ties it
    assert mask_weights(explained, DetectionVectors(torch.zeros(0, 4), torch.zeros(0, 2))).tolist() == [0.0]


@pytest.mark.quick
def test_quick_drise_matches_the_papers_formula_on_the_square_detector() -> None:
    model = square_detector()
    image = square_image((96, 80), (10, 10, 40, 40))
    image.paste((30, 30, 220), (50, 40, 85, 75))  # a blue square too: two detections
    x = to_input_tensor(image, model.input_spec)[None]
    options = PerturbationOptions(rise_masks=60, rise_grid=5, rise_probability=0.5, seed=3)
    classes = len(DETECTION_CLASSES)

    def run(masked: torch.Tensor) -> list[Detection]:
        with torch.no_grad():
            return torchvision_detections(model.module(masked)[0], classes)

    with torch.no_grad():
        found = model.module(x)[0]
    explained = explained_of(torchvision_detections(found, classes), found["scores"].tolist(), 0.5, 10)
    check_against_reference(model, x, options, run, explained)


@pytest.mark.slow
def test_drise_matches_the_papers_formula_on_a_random_faster_rcnn() -> None:
    model = random_faster_rcnn()
    x = to_input_tensor(square_image((128, 96), (20, 20, 70, 70)), model.input_spec)[None]
    options = PerturbationOptions(rise_masks=24, rise_grid=4, rise_probability=0.5, seed=1)
    classes = len(model.categories or [])
    assert classes == 91

    def run(masked: torch.Tensor) -> list[Detection]:
        with torch.no_grad():
            return torchvision_detections(model.module(masked)[0], classes)

    with torch.no_grad():
        found = model.module(x)[0]
    explained = explained_of(torchvision_detections(found, classes), found["scores"].tolist(), 0.0, 3)
    check_against_reference(model, x, options, run, explained, score_threshold=0.0, max_detections=3)


@pytest.mark.slow
def test_drise_matches_the_papers_formula_on_the_tiny_yolo(checkpoint) -> None:
    from yolo_model import square_scene

    from gradcam_cli.models.yolo import offline_ultralytics
    from gradcam_cli.models.yolo_net import confidence
    from gradcam_cli.options import ModelOptions

    offline_ultralytics()
    model = load_model(ModelOptions(f"yolo:{checkpoint}"))
    model.module.eval()
    x = to_input_tensor(square_scene([(0, 8, 8, 32, 32), (1, 36, 30, 60, 54)]), model.input_spec)[None]
    options = PerturbationOptions(rise_masks=80, rise_grid=4, rise_probability=0.5, seed=2)
    threshold = float(model.module.default_conf)

    def detections(found: dict[str, torch.Tensor]) -> list[Detection]:
        vectors = torch.sigmoid(found["class_logits"][:, found["anchors"].reshape(-1)]).T
        return [(box, vector.tolist(), 1.0) for box, vector in zip(found["boxes"].tolist(), vectors, strict=True)]

    def run(masked: torch.Tensor) -> list[Detection]:
        with torch.no_grad(), confidence(threshold):
            return detections(model.module(masked)[0])

    with torch.no_grad(), confidence(threshold):
        found = model.module(x)[0]
    explained = explained_of(detections(found), found["scores"].tolist(), threshold, 10)
    mine = check_against_reference(model, x, options, run, explained)
    # a known answer: each square's map is brightest on its own square
    for rank, (x1, y1, x2, y2) in enumerate(box for box, _, _ in explained):
        saliency = mine[rank + 1]
        inside = saliency[round(y1) : round(y2), round(x1) : round(x2)].mean()
        assert inside > 1.5 * saliency.mean(), rank


def count_passes(model: LoadedModel, methods: list[str], most: int, options: PerturbationOptions) -> tuple[int, int]:
    """(forward calls, images run) while explaining one image with ``most`` detections at most."""
    calls, images = 0, 0

    def count(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        nonlocal calls, images
        calls += 1
        images += len(inputs[0])

    explainer = Explainer(model, None, methods, perturbation=options, score_threshold=0.0, max_detections=most)
    x = to_input_tensor(square_image((96, 96), (20, 20, 60, 60)), model.input_spec)[None]
    handle = model.module.register_forward_pre_hook(count)
    try:
        result = explainer.explain_batch(x)[0]
    finally:
        handle.remove()
    assert len(result.predictions) == most
    return calls, images


@pytest.mark.slow
def test_one_set_of_passes_scores_every_detection_one_or_ten() -> None:
    model = random_faster_rcnn("fasterrcnn_mobilenet_v3_large_320_fpn", 96)
    options = PerturbationOptions(rise_masks=6, rise_grid=4, seed=0)  # few masks: RISE runs them once per detection
    one, ten = (count_passes(model, ["drise"], most, options) for most in (1, 10))
    assert one == ten == (1 + math.ceil(6 / 32), 1 + 6)  # the explained pass, then one batch of 6 masked inputs
    rise_one, rise_ten = (count_passes(model, ["rise"], most, options)[1] for most in (1, 10))
    assert rise_ten > rise_one  # RISE reruns the masks per target: what D-RISE saves


@pytest.mark.quick
def test_drise_is_seeded() -> None:
    model = square_detector()
    x = to_input_tensor(square_image((96, 80), (10, 10, 40, 40)), model.input_spec)[None]

    def run(seed: int) -> torch.Tensor:
        return drise_maps(model, x, PerturbationOptions(rise_masks=30, rise_grid=4, seed=seed))[1]

    first, again, other = run(1), run(1), run(2)
    assert torch.equal(first, again) and not torch.allclose(first, other)


def test_the_cli_explains_each_detection_with_drise_and_refuses_a_classifier_in_one_line(tmp_path) -> None:
    image = tmp_path / "square.png"
    square_image((96, 80), (10, 10, 40, 40)).save(image)
    out = tmp_path / "out"
    common = [str(image), "--method", "drise", "--rise-masks", "20", "-o", str(out), "--workers", "0", "-q"]
    detector = f"{ROOT}/tests/task_models.py:build_detector"
    result = CliRunner().invoke(app, [*common, "--model", detector, "--weights", "none"])
    assert result.exit_code == EXIT_OK, result.output
    written = sorted(p.name for p in out.iterdir() if p.suffix == ".png")
    assert written == ["square_drise_box1_1-1.png", "square_drise_boxes.png"], written
    refused = CliRunner().invoke(app, [*common, "--model", f"{ROOT}/tests/square_model.py:build"])
    assert refused.exit_code == EXIT_USAGE
    assert refused.output.strip().startswith("error: --method drise is for detectors; a classifier takes ")
    assert len(refused.output.strip().splitlines()) == 1
