"""Ultralytics RT-DETR checkpoints (``--model yolo:PATH`` of an ``RTDETRDetectionModel``, tests/rtdetr_model.py): loaded
with ``weights_only`` as a DETR-family detector, each detection a decoder query chosen as ultralytics' own
post-processing chooses it (its rows against the model's own ``(boxes, score, class)`` output, scaled as its
predictor scales them), its Grad-CAM against ``torch.autograd.grad`` of the query's class logit at the backbone's
last layer (a forward hook on the ultralytics model itself), D-RISE against the paper's formula, ``--method
attention`` refused, the command line's rows and files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from cam_reference import pearson
from method_reference import Detection, drise_maps, drise_reference, minmax, rise_masks
from PIL import Image
from rtdetr_model import BACKBONE_LAST, CLASSES, SIZE, save_rtdetr, tiny_rtdetr_config
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cli import app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE, UsageError
from gradcam_cli.io.images import to_input_tensor
from gradcam_cli.models.yolo import offline_ultralytics
from gradcam_cli.options import ModelOptions, PerturbationOptions

try:  # ultralytics as gradcam imports it: offline, and PIL.Image.open left as it was (it patches it on import)
    offline_ultralytics()
except UsageError:
    pytest.skip("ultralytics is not installed: pip install -e '.[yolo]'", allow_module_level=True)

REQUIRED = 0.999
MOST = 3
IMAGE = (120, 80)
"""The scene's (W, H): wider than high, stretched to the model's square."""


@pytest.fixture(scope="module")
def rtdetr_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_rtdetr(tmp_path_factory.mktemp("rtdetr") / "tiny-rtdetr.pt")


def scene() -> Image.Image:
    image = Image.new("RGB", IMAGE, (128, 128, 128))
    image.paste((220, 30, 30), (10, 10, 50, 50))
    image.paste((30, 30, 220), (70, 30, 110, 70))
    return image


def ultralytics_model(checkpoint: Path) -> Any:
    """The checkpoint's model as ultralytics' predictor runs it: loaded by its own loader, fused, in eval mode."""
    from ultralytics.nn.tasks import torch_safe_load

    net = torch_safe_load(str(checkpoint), safe_only=True)[0]["model"].float().eval()
    return net.fuse(verbose=False)


def stretched(image: Image.Image) -> torch.Tensor:
    """The predictor's input: the image stretched to the square (``LetterBox(scale_fill=True)``: cv2's bilinear
    resize), pixels in [0, 1]."""
    pixels = cv2.resize(np.asarray(image), (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div(255)[None]


def top_pairs(logits: torch.Tensor, most: int) -> list[tuple[int, int]]:
    """(query, class) of the best ``most`` sigmoid scores of (Q, classes) logits."""
    classes = logits.shape[1]
    return [(int(i) // classes, int(i) % classes) for i in logits.sigmoid().flatten().topk(most).indices]


@pytest.mark.quick
def test_an_rtdetr_checkpoint_loads_under_yolo_as_a_detr_family_detector(rtdetr_checkpoint, tmp_path) -> None:
    model = load_model(f"yolo:{rtdetr_checkpoint}")
    assert model.task == "detr" and model.categories == CLASSES and model.default_layers == (BACKBONE_LAST,)
    assert model.input_spec.fixed_size == (SIZE, SIZE) and model.input_spec.mean == (0.0, 0.0, 0.0)
    resized = load_model(ModelOptions(f"yolo:{rtdetr_checkpoint}", input_size=96))
    assert resized.input_spec.fixed_size == (96, 96)
    with pytest.raises(UsageError, match=r"^--input-size 100 does not fit .* stride 32; use 96 or 128$"):
        load_model(ModelOptions(f"yolo:{rtdetr_checkpoint}", input_size=100))
    with pytest.raises(UsageError, match=r"^--task segment does not fit yolo:.*, an RT-DETR \(explained as a detector"):
        load_model(ModelOptions(f"yolo:{rtdetr_checkpoint}", task="segment"))
    (tmp_path / "tiny-rtdetr.yaml").write_text(yaml.safe_dump(tiny_rtdetr_config()), encoding="utf-8")
    built = load_model(ModelOptions(f"yolo:{tmp_path / 'tiny-rtdetr.yaml'}", "none", input_size=64))
    assert built.task == "detr" and type(built.module.net).__name__ == "RTDETRDetectionModel"  # type: ignore[union-attr]
    result = Explainer(built, None, ["gradcam"], score_threshold=0.0, max_detections=2).explain(scene())
    assert len(result.predictions) == 2 and result.explanations[0].saliency.shape == (IMAGE[1], IMAGE[0])


def test_each_querys_gradcam_equals_autograd_of_its_class_logit_and_rows_are_ultralytics_own(rtdetr_checkpoint) -> None:
    model = load_model(f"yolo:{rtdetr_checkpoint}")
    picture = scene()
    x = to_input_tensor(picture, model.input_spec)[None]
    reference_input = stretched(picture)
    assert torch.allclose(x, reference_input, atol=1 / 255 + 1e-6)  # the predictor's stretch, give or take rounding
    explainer = Explainer(model, None, ["gradcam"], score_threshold=0.0, max_detections=MOST)
    targets, cams = explainer.compute_targets(x)
    net = ultralytics_model(rtdetr_checkpoint)
    kept: list[torch.Tensor] = []
    handle = net.model[int(BACKBONE_LAST.split(".")[1])].register_forward_hook(lambda _m, _i, out: kept.append(out))
    try:
        rows, raw = net(x.clone().requires_grad_(True))
    finally:
        handle.remove()
    logits = raw[1][-1][0]  # the evaluation layer's (queries, classes) logits
    chosen = top_pairs(logits.detach(), MOST)
    lit = 0
    for k, (query, label) in enumerate(chosen):
        (gradient,) = torch.autograd.grad(logits[query, label], kept[0], retain_graph=True)
        expected = torch.relu((gradient.mean(dim=(2, 3), keepdim=True) * kept[0]).sum(dim=1))[0].detach()
        if float(expected.max()) == 0:  # every weighted channel sum negative: ReLU leaves nothing, here as there
            assert float(cams["gradcam"][k][0][0].abs().max()) == 0, k
            continue
        lit += 1
        assert pearson(cams["gradcam"][k][0][0], expected) >= REQUIRED, k
    assert lit >= 1
    # the rows: ultralytics' own (cx, cy, w, h, score, class) output, scaled to the image as its predictor scales it
    own = rows[0][:MOST].detach()
    result = targets.results(cams, [(IMAGE[1], IMAGE[0])], model.class_name)[0]
    assert [p.index for p in result.predictions] == own[:, 5].long().tolist()
    assert [p.name for p in result.predictions] == [CLASSES[int(c)] for c in own[:, 5]]
    assert [p.probability for p in result.predictions] == pytest.approx(own[:, 4].tolist(), abs=1e-5)
    cx, cy, w, h = own[:, :4].T
    boxes = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=1) * torch.tensor([*IMAGE, *IMAGE])
    for prediction, box in zip(result.predictions, boxes.tolist(), strict=True):
        assert prediction.box == pytest.approx(box, abs=0.06)  # rows are rounded to 0.1 pixel


@pytest.mark.slow
def test_drise_on_an_rtdetr_matches_the_papers_formula(rtdetr_checkpoint) -> None:
    model = load_model(f"yolo:{rtdetr_checkpoint}")
    x = to_input_tensor(scene(), model.input_spec)[None]
    options = PerturbationOptions(rise_masks=16, rise_grid=4, rise_probability=0.5, seed=1)
    mine = drise_maps(model, x, options, score_threshold=0.0, max_detections=2)
    net = ultralytics_model(rtdetr_checkpoint)

    def detections(inputs: torch.Tensor) -> list[Detection]:
        """Every (query, class) pair of a pass: (box in input pixels, the query's class probabilities, 1)."""
        with torch.no_grad():
            _, raw = net(inputs)
        boxes, logits = raw[0][-1][0], raw[1][-1][0]
        found = []
        for query, _ in top_pairs(logits, logits.shape[0]):
            cx, cy, w, h = (boxes[query] * SIZE).tolist()
            found.append(([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], logits[query].sigmoid().tolist(), 1.0))
        return found

    explained = detections(x)[:2]
    totals = drise_reference(detections, x, explained, rise_masks(16, 4, 0.5, (SIZE, SIZE), 1), 0.5)
    for rank, total in enumerate(totals, 1):
        assert pearson(mine[rank], minmax(total)) >= REQUIRED, rank
    assert pearson(mine[0], minmax(sum(totals))) >= REQUIRED


def test_the_cli_writes_a_row_and_overlay_per_query_and_refuses_attention_in_one_line(rtdetr_checkpoint, tmp_path):
    path = tmp_path / "scene.png"
    scene().save(path)
    out = tmp_path / "out"
    model = ["--model", f"yolo:{rtdetr_checkpoint}", "--max-detections", "2"]
    methods = "gradcam,gradcam++,layercam,drise"
    arguments = [str(path), *model, "--method", methods, "--rise-masks", "8", "-o", str(out), "--json"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == EXIT_OK, result.output
    assert f"using layer {BACKBONE_LAST} (last stage of the backbone, the feature map the transformer reads;" in (
        result.stderr
    )
    rows = [json.loads(line) for line in result.stdout.splitlines()]  # a row per method and detection
    assert sorted(row["method"] for row in rows) == sorted(methods.split(",") * 2)
    assert {row["provenance"]["score_threshold"] for row in rows} == {0.25}  # ultralytics' own conf
    assert all(len(row["target"]["box"]) == 4 and row["target"]["name"] in CLASSES for row in rows)
    written = sorted(p.name for p in out.iterdir() if p.suffix == ".png")
    assert "scene_gradcam_boxes.png" in written and "scene_drise_boxes.png" in written
    assert sum("_box1_" in name or "_box2_" in name for name in written) == 8, written
    refused = CliRunner().invoke(app, [str(path), *model, "--method", "attention", "-o", str(tmp_path)])
    assert refused.exit_code == EXIT_USAGE
    assert refused.output.startswith("error: --method attention is for classifiers; a detector takes gradcam, ")
    assert len(refused.output.splitlines()) == 1
    explainer = Explainer(load_model(f"yolo:{rtdetr_checkpoint}"), None, "all")
    assert "attention" not in explainer.chosen.methods and "drise" in explainer.chosen.methods


@pytest.mark.slow
def test_gradcam_eval_scores_each_box_of_an_rtdetr(rtdetr_checkpoint, tmp_path) -> None:
    from gradcam_cli.cli.eval import app as eval_app

    images = tmp_path / "in"
    images.mkdir()
    scene().save(images / "scene.png")
    model = ["--model", f"yolo:{rtdetr_checkpoint}", "--max-detections", "2"]
    evaluated = CliRunner().invoke(eval_app, [str(images), *model, "--method", "gradcam", "--steps", "4", "--json"])
    assert evaluated.exit_code == EXIT_OK, evaluated.output
    summary = json.loads(evaluated.stdout)["methods"]["gradcam"]["detections"]
    assert summary["count"] == 2
