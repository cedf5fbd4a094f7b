"""Detectors and segmenters in the library: the task taken from the model, what is differentiated (checked against an
independent ``torch.autograd.grad``), where the maps land on padded, non-square inputs, the matching rule, the
classifier scores, and ``--weights none`` building torchvision's detectors and segmenters without a network call."""

from __future__ import annotations

import socket

import pytest
import torch
from square_model import square_image
from task_models import DETECTION_CLASSES, SquareDetector, SquareSegmenter

from gradcam_cli import Explainer, load_model
from gradcam_cli.cam.detection import box_iou, match
from gradcam_cli.cam.maps import upsample, upsample_region
from gradcam_cli.cam.tasks import TASKS, nothing_of, register_task
from gradcam_cli.cam.tasks.classify import ClassifyTask
from gradcam_cli.errors import UsageError
from gradcam_cli.evaluation import metrics
from gradcam_cli.io.images import InputSpec, to_input_tensor
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.models.tasks import CLASSIFY, DETECT, SEGMENT, detection_spec

DETECTOR = "tests/task_models.py:build_detector"
RED_RIGHT = ((300, 200), (250, 60, 290, 100))  # a wide image, the square by the right edge
RED_LOW = ((200, 300), (60, 240, 100, 290))  # a tall one, the square by the bottom edge


def detector() -> LoadedModel:
    module = SquareDetector()
    spec = detection_spec(module, None)
    assert spec is not None
    return LoadedModel(module, "square-detector", "none", DETECTION_CLASSES, spec, DETECT)


def segmenter() -> LoadedModel:
    classes = list(DETECTION_CLASSES)
    return LoadedModel(SquareSegmenter(), "square-segmenter", "none", classes, InputSpec(size=64), SEGMENT)


def gradcam_of(activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """Grad-CAM written out: ReLU(sum_k mean(g_k) A_k), (N, C, h, w) -> (N, h, w)."""
    return torch.relu((gradients.mean(dim=(2, 3), keepdim=True) * activations).sum(dim=1))


# --- the task ----------------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_the_task_comes_from_the_model_and_task_overrides_it():
    assert load_model(DETECTOR, "none").task == DETECT  # by its torchvision transform
    assert load_model("tests/task_models.py:build_segmenter", "none").task == SEGMENT  # by its output
    assert load_model("tests/square_model.py:build", "none").task == CLASSIFY
    assert load_model("lraspp_mobilenet_v3_large", "none").task == SEGMENT  # by torchvision's namespace
    assert load_model("tests/task_models.py:build_segmenter", "none", task="classify").task == CLASSIFY
    assert Explainer(SquareSegmenter(), methods="gradcam").model.task == SEGMENT  # a bare module: its dry pass


def test_a_model_whose_task_cannot_be_recognised_is_one_clear_line():
    with pytest.raises(UsageError) as caught:
        load_model("tests/task_models.py:build_puzzle", "none")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("cannot tell what task tests/task_models.py:build_puzzle does")
    assert "returns a tuple of Tensor" in message and message.endswith("pass --task classify|detect|segment")


def test_detectors_default_to_the_backbones_last_stage():
    assert list(Explainer(detector()).chosen.layers) == ["backbone.body"]
    assert list(Explainer(segmenter()).chosen.layers) == ["backbone"]


# --- detection ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "box"), [RED_RIGHT, RED_LOW], ids=["wide", "tall"])
@pytest.mark.parametrize("method", ["gradcam", "scorecam", "eigengradcam"])
def test_a_detections_map_peaks_on_its_square_in_a_padded_non_square_input(size, box, method):
    model = detector()
    image = square_image(size, box)
    explainer = Explainer(model, methods=method)
    inputs = to_input_tensor(image, model.input_spec).unsqueeze(0)
    targets, _ = explainer.compute_targets(inputs)
    assert targets.region != (1.0, 1.0)  # the transform padded the batch: the case under test
    result = explainer.explain(image)
    (found,) = result.predictions
    assert (found.index, found.name) == (1, "red") and found.probability > 0.99
    assert float(box_iou(torch.tensor(box, dtype=torch.float), torch.tensor([found.box]))[0]) > 0.7
    for explanation in result.explanations:  # the detection's map (rank 1) and the combined one (rank 0)
        assert explanation.saliency.shape == (size[1], size[0])
        assert metrics.pointing_hit(explanation.saliency, [box], tolerance=0)


def test_detection_maps_match_an_independent_autograd_computation():
    model = detector()
    image = square_image((300, 200), (30, 40, 90, 100), "green")
    image.paste((230, 20, 20), (200, 120, 260, 180))
    inputs = to_input_tensor(image, model.input_spec).unsqueeze(0)
    targets, cams = Explainer(model, methods=["gradcam"]).compute_targets(inputs)
    reference = SquareDetector()  # fresh, with gradients on its parameters: nothing of the engine
    kept = {}
    reference.backbone.body.register_forward_hook(lambda _m, _i, output: kept.setdefault("a", output))
    (detections,) = reference(inputs)
    assert sorted(detections["labels"].tolist()) == [1, 2]
    scores = detections["scores"]
    for k, score in enumerate([scores[0], scores[1], scores.sum()]):  # each detection, then the combined target
        (gradients,) = torch.autograd.grad(score, kept["a"], retain_graph=True)
        expected = gradcam_of(kept["a"].detach(), gradients)
        torch.testing.assert_close(cams["gradcam"][k][0], expected, rtol=1e-5, atol=1e-7)
    assert targets.count == 3


def test_an_image_without_detections_gets_only_an_empty_combined_map():
    result = Explainer(detector(), methods=["gradcam", "layercam"]).explain(square_image((120, 90), (0, 0, 0, 0)))
    assert result.predictions == []
    assert [(e.method, e.rank, e.target.name) for e in result.explanations] == [
        ("gradcam", 0, "all detections"),
        ("layercam", 0, "all detections"),
    ]
    assert all(float(e.saliency.abs().max()) == 0.0 for e in result.explanations)


def test_threshold_max_detections_and_target_class_choose_the_detections():
    image = square_image((300, 200), (30, 40, 90, 100), "green")
    image.paste((230, 20, 20), (200, 120, 260, 180))
    assert [p.name for p in Explainer(detector(), max_detections=1).explain(image).predictions] in (["red"], ["green"])
    assert [p.name for p in Explainer(detector(), target="green").explain(image).predictions] == ["green"]
    assert Explainer(detector(), score_threshold=1.0).explain(image).predictions == []


def test_batched_images_are_explained_as_one_at_a_time():
    model = detector()
    images = [square_image((300, 200), (250, 60, 290, 100)), square_image((300, 200), (20, 20, 70, 70), "blue")]
    batch = torch.stack([to_input_tensor(image, model.input_spec) for image in images])
    explainer = Explainer(model)
    together = explainer.explain_batch(batch, [(200, 300)] * 2)
    for image, both in zip(images, together, strict=True):
        alone = explainer.explain(image)
        assert [p.box for p in alone.predictions] == [p.box for p in both.predictions]
        torch.testing.assert_close(alone.explanations[0].saliency, both.explanations[0].saliency)


def test_the_matching_rule_wants_the_same_class_and_an_iou_of_at_least_a_half():
    found = {
        "boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [1.0, 1.0, 11.0, 11.0], [50.0, 50.0, 60.0, 60.0]]),
        "labels": torch.tensor([2, 1, 1]),
        "scores": torch.tensor([0.9, 0.8, 0.7]),
    }
    assert match(torch.tensor([0.0, 0.0, 10.0, 10.0]), 1, found) == 1  # class 1's best overlap, not class 2's box
    assert match(torch.tensor([0.0, 0.0, 10.0, 10.0]), 2, found) == 0
    assert match(torch.tensor([55.0, 55.0, 65.0, 65.0]), 1, found) is None  # IoU 25 / 175: too little
    assert match(torch.tensor([0.0, 0.0, 10.0, 10.0]), 3, found) is None


def test_a_padded_maps_image_part_alone_is_stretched_over_the_image():
    coarse = torch.rand(2, 8, 12)
    padded = upsample(coarse, (80, 120))  # the map over the padded batch
    torch.testing.assert_close(upsample_region(coarse, (60, 90), (0.75, 0.75)), padded[:, :60, :90])
    torch.testing.assert_close(upsample_region(coarse, (33, 47)), upsample(coarse, (33, 47)))


# --- segmentation ------------------------------------------------------------------------------------------------


def test_a_segmenters_class_map_matches_autograd_and_its_region_is_the_square():
    model = segmenter()
    image = square_image((300, 200), (200, 120, 260, 180))
    inputs = to_input_tensor(image, model.input_spec).unsqueeze(0)
    explainer = Explainer(model, methods=["gradcam", "hirescam"])
    _, cams = explainer.compute_targets(inputs)
    reference = SquareSegmenter()
    kept = {}
    reference.backbone.register_forward_hook(lambda _m, _i, output: kept.setdefault("a", output))
    logits = reference(inputs)["out"]
    score = (logits[0, 1] * (logits.argmax(dim=1)[0] == 1)).sum()  # pytorch-grad-cam's SemanticSegmentationTarget
    (gradients,) = torch.autograd.grad(score, kept["a"])
    torch.testing.assert_close(cams["gradcam"][0][0], gradcam_of(kept["a"].detach(), gradients), rtol=1e-5, atol=1e-7)
    result = explainer.explain(image)
    explanation = result.explanations[0]
    assert (explanation.target.name, result.predictions[0].name) == ("red", "__background__")
    assert explanation.target.share == pytest.approx(3600 / 60000, rel=0.1)
    assert metrics.pointing_hit(explanation.saliency, [(200, 120, 260, 180)], tolerance=0)
    inside = metrics.box_mask((200, 300), [(201, 121, 259, 179)])
    assert explanation.region is not None and bool(explanation.region[inside].all())
    assert int(explanation.region.sum()) < 1.2 * 3600


def test_a_segmenter_explains_its_classes_by_area_and_never_the_background_unless_asked():
    image = square_image((300, 200), (200, 120, 260, 180))
    image.paste((20, 230, 20), (10, 10, 110, 110))
    result = Explainer(segmenter(), top_k=3).explain(image)
    assert [e.target.name for e in result.explanations] == ["green", "red"]
    asked = Explainer(segmenter(), target=0).explain(image)
    assert [e.target.name for e in asked.explanations] == ["__background__"]


# --- classifier scores -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["logit", "softmax", "sigmoid"])
def test_a_classifiers_score_is_what_it_says(square_model, kind):
    image = square_image((120, 90), (60, 30, 100, 70))
    inputs = to_input_tensor(image, square_model.input_spec).unsqueeze(0)
    explainer = Explainer(square_model, "features", "hirescam", score=kind)
    probabilities, _, cams = explainer.compute(inputs, target=0)
    module = square_model.module
    kept = {}
    module.features.register_forward_hook(lambda _m, _i, output: kept.setdefault("a", output))
    logits = module(inputs)
    score = {"logit": logits, "softmax": logits.softmax(dim=1), "sigmoid": logits.sigmoid()}[kind][0, 0]
    (gradients,) = torch.autograd.grad(score, kept["a"])
    expected = torch.relu((gradients * kept["a"].detach()).sum(dim=1))
    torch.testing.assert_close(cams["hirescam"][0][0], expected, rtol=1e-5, atol=1e-9)
    shown = logits.detach().sigmoid() if kind == "sigmoid" else logits.detach().softmax(dim=1)
    torch.testing.assert_close(probabilities, shown)


def test_scores_and_smoothing_other_tasks_cannot_use_are_refused():
    with pytest.raises(UsageError, match=r"^--score softmax is for classifiers; a detector has its own score$"):
        Explainer(detector(), score="softmax")
    with pytest.raises(UsageError, match=r"^--aug-smooth is for classifiers"):
        Explainer(segmenter(), aug_smooth=True)
    with pytest.raises(UsageError, match="compute_targets"):
        Explainer(detector()).compute(torch.zeros(1, 3, 96, 96))


# --- torchvision without the network -----------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch):
    """Any download attempt (torch.hub's, or any socket) fails the test."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a network call was made")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    monkeypatch.setattr("torchvision.models._api.load_state_dict_from_url", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_weights_none_downloads_nothing_not_even_the_backbone(offline):
    loaded = load_model("fasterrcnn_resnet50_fpn", "none", input_size=64)
    assert (loaded.task, loaded.categories[1]) == (DETECT, "person")
    assert (loaded.input_spec.size, loaded.input_spec.max_side) == (64, 107)
    assert loaded.module.transform.min_size == (64,) and loaded.module.transform.max_size == 107
    assert load_model("deeplabv3_resnet50", "none").input_spec.size == 520


TORCHVISION_TASK_MODELS = [
    ("fasterrcnn_resnet50_fpn", "backbone.body.layer4"),
    ("fasterrcnn_resnet50_fpn_v2", "backbone.body.layer4"),
    ("fasterrcnn_mobilenet_v3_large_fpn", "backbone.body.16"),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", "backbone.body.16"),
    ("retinanet_resnet50_fpn", "backbone.body.layer4"),
    ("retinanet_resnet50_fpn_v2", "backbone.body.layer4"),
    ("fcos_resnet50_fpn", "backbone.body.layer4"),
    ("ssd300_vgg16", "backbone.features"),
    ("ssdlite320_mobilenet_v3_large", "backbone.features.0"),
    ("maskrcnn_resnet50_fpn", "backbone.body.layer4"),
    ("maskrcnn_resnet50_fpn_v2", "backbone.body.layer4"),
    ("keypointrcnn_resnet50_fpn", "backbone.body.layer4"),
    ("fcn_resnet50", "backbone.layer4"),
    ("fcn_resnet101", "backbone.layer4"),
    ("deeplabv3_resnet50", "backbone.layer4"),
    ("deeplabv3_resnet101", "backbone.layer4"),
    ("deeplabv3_mobilenet_v3_large", "backbone.16"),
    ("lraspp_mobilenet_v3_large", "backbone.16"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "layer"), TORCHVISION_TASK_MODELS, ids=[n for n, _ in TORCHVISION_TASK_MODELS])
def test_every_torchvision_detector_and_segmenter_builds_offline_and_gives_a_map(offline, name, layer):
    fixed = name.startswith("ssd")  # --input-size is refused for a fixed size
    loaded = load_model(name, "none", input_size=None if fixed else 64)
    module = loaded.module
    for owner in (getattr(module, "roi_heads", None), module):  # random weights score below torchvision's 0.05
        if owner is not None and hasattr(owner, "score_thresh"):
            owner.score_thresh = 0.0
            owner.detections_per_img = 5  # and the mask and keypoint heads need not run on 100 of them
    detector = {"score_threshold": 0.0, "max_detections": 1} if loaded.task == DETECT else {}
    explainer = Explainer(loaded, methods="layercam", **detector)
    assert list(explainer.chosen.layers) == [layer]
    result = explainer.explain(square_image((96, 72), (40, 20, 70, 50)))
    saliency = result.explanations[0].saliency
    assert saliency.shape == (72, 96) and torch.isfinite(saliency).all()
    # LayerCAM sums positive gradients times non-negative activations: empty only if no gradient reached the layer
    assert float(saliency.max()) == 1.0, "the map is empty: the score did not reach the layer"


class _ScopedTask(ClassifyTask):
    """A classifier's adapter that looks for the default layer in ``features.0`` first."""

    name = "scoped"
    layer_scopes = ("features.0",)


@pytest.mark.quick
def test_the_adapter_the_profile_names_chooses_the_default_layer(square_model):
    """One key on the profile: the adapter's name; the adapter, not a task enum on the model, decides the layer."""
    register_task(_ScopedTask())
    try:
        scoped = Explainer(square_model, methods="gradcam", task="scoped")
        assert (scoped.model.task, type(scoped.adapter).__name__) == ("scoped", "_ScopedTask")
        assert scoped.chosen.layers == ("features.0",)
        assert Explainer(square_model, methods="gradcam").chosen.layers == ("features",)  # the classifier's own
        assert square_model.task == CLASSIFY  # the caller's model is left as it is
    finally:
        TASKS.unregister("scoped")
    detector, classifier = LoadedModel.of_module(SquareDetector()), LoadedModel.of_module(square_model.module)
    assert (detector.task, detector.profile.detector, classifier.task, classifier.profile.detector) == (
        DETECT,
        True,
        CLASSIFY,
        False,
    )
    assert (nothing_of("detect"), nothing_of("segment"), nothing_of("classify")) == (
        "no detection",
        "only the background",
        "no target",
    )
