"""The DETR family (``--model hf:DIR`` of a DETR or RT-DETR folder, tests/detr_models.py): each detection a decoder
query, its rows the image processor's own post-processing; its Grad-CAM against autograd of the query's class logit
at the backbone's last stage (a forward hook on the transformers model itself); ``--method attention`` against the
model's own ``output_attentions`` cross-attention (refused for RT-DETR); D-RISE against the paper's formula; the
command line and box-level ``gradcam eval`` end to end."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from cam_reference import pearson
from detr_models import CLASSES, save_conditional_detr, save_deformable_detr, save_detr, save_rt_detr
from method_reference import Detection, drise_maps, drise_reference, minmax, rise_masks
from PIL import Image
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cli import app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.io.images import to_input_tensor
from gradcam_cli.models.loading import LoadedModel
from gradcam_cli.options import PerturbationOptions
from gradcam_cli.serve.model import ModelService

REQUIRED = 0.999
MOST = 3


@pytest.fixture(scope="module")
def detr_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_detr(tmp_path_factory.mktemp("detr") / "detr")


@pytest.fixture(scope="module")
def conditional_detr_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_conditional_detr(tmp_path_factory.mktemp("conditional_detr") / "conditional_detr")


@pytest.fixture(scope="module")
def deformable_detr_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_deformable_detr(tmp_path_factory.mktemp("deformable_detr") / "deformable_detr")


@pytest.fixture(scope="module")
def rt_detr_v2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_rt_detr(tmp_path_factory.mktemp("rt_detr_v2") / "rt_detr_v2", version=2)


@pytest.fixture(scope="module")
def rt_detr_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_rt_detr(tmp_path_factory.mktemp("rt_detr") / "rt_detr")


def scene() -> Image.Image:
    """A red and a blue square on grey, wider than high (DETR keeps the aspect, RT-DETR squeezes it)."""
    image = Image.new("RGB", (120, 80), (128, 128, 128))
    image.paste((220, 30, 30), (10, 10, 50, 50))
    image.paste((30, 30, 220), (70, 30, 110, 70))
    return image


def reference_pass(model: LoadedModel, x: torch.Tensor, eager: bool = False) -> tuple[Any, torch.Tensor]:
    """The transformers model run on ``x`` with its backbone's last stage hooked: its output and that stage's
    activations (in the graph)."""
    detr: Any = model.module.detr  # type: ignore[union-attr]
    stage = detr.get_submodule(model.default_layers[0].removeprefix("detr."))
    kept: list[torch.Tensor] = []
    handle = stage.register_forward_hook(lambda _m, _i, out: kept.append(out))
    before = detr.config._attn_implementation
    detr.config._attn_implementation = "eager" if eager else before
    try:
        output = detr(pixel_values=x.clone().requires_grad_(True), output_attentions=eager)
    finally:
        handle.remove()
        detr.config._attn_implementation = before
    return output, kept[0]


def top_queries(logits: torch.Tensor, softmax: bool, most: int) -> list[tuple[int, int]]:
    """(query, class) of the best ``most`` detections: DETR's best class but "no object" per query, or the best
    sigmoid (query, class) pairs."""
    if softmax:
        scores, labels = logits.softmax(-1)[:, :-1].max(-1)
        order = scores.argsort(descending=True)[:most]
        return [(int(q), int(labels[q])) for q in order]
    classes = logits.shape[1]
    index = logits.sigmoid().flatten().topk(most).indices
    return [(int(i) // classes, int(i) % classes) for i in index]


def gradcam_reference(activations: torch.Tensor, logit: torch.Tensor) -> torch.Tensor:
    """Grad-CAM: ReLU(sum_k mean(dS/dA_k) A_k), from torch.autograd.grad."""
    (gradient,) = torch.autograd.grad(logit, activations, retain_graph=True)
    weights = gradient.mean(dim=(2, 3), keepdim=True)
    return torch.relu((weights * activations).sum(dim=1))[0].detach()


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("detr", marks=pytest.mark.quick),
        "rt_detr",
        pytest.param("rt_detr_v2", marks=pytest.mark.slow),
        pytest.param("conditional_detr", marks=pytest.mark.slow),
        pytest.param("deformable_detr", marks=pytest.mark.slow),
    ],
)
def test_each_querys_gradcam_equals_autograd_of_its_class_logit_and_rows_are_the_processors(request, kind) -> None:
    from transformers import AutoImageProcessor

    folder = request.getfixturevalue(f"{kind}_folder")
    model = load_model(f"hf:{folder}")
    assert model.task == "detr" and model.categories == CLASSES
    assert model.default_layers == ("detr.model.backbone.model.encoder.stages.3",)
    picture = scene()
    x = to_input_tensor(picture, model.input_spec)[None]
    assert tuple(x.shape[-2:]) == ((128, 128) if kind.startswith("rt_detr") else (128, 192))
    explainer = Explainer(model, None, ["gradcam"], score_threshold=0.0, max_detections=MOST)
    targets, cams = explainer.compute_targets(x)
    output, activations = reference_pass(model, x)
    chosen = top_queries(output.logits[0].detach(), kind == "detr", MOST)
    lit = 0
    for k, (query, label) in enumerate(chosen):
        expected = gradcam_reference(activations, output.logits[0, query, label])
        if float(expected.max()) == 0:  # every weighted channel sum negative: ReLU leaves nothing, here as there
            assert float(cams["gradcam"][k][0][0].abs().max()) == 0, k
            continue
        lit += 1
        assert pearson(cams["gradcam"][k][0][0], expected) >= REQUIRED, k
    assert lit >= 1
    combined = gradcam_reference(activations, sum(output.logits[0, q, c] for q, c in chosen))
    assert pearson(cams["gradcam"][MOST][0][0], combined) >= REQUIRED
    # the rows: the image processor's own post-processing, boxes scaled to the original image
    processor = AutoImageProcessor.from_pretrained(folder)
    shown = processor.post_process_object_detection(output, threshold=0.0, target_sizes=[(80, 120)])[0]
    order = shown["scores"].argsort(descending=True)[:MOST]
    result = targets.results(cams, [(80, 120)], model.class_name)[0]
    assert [p.index for p in result.predictions] == shown["labels"][order].tolist()
    assert [p.probability for p in result.predictions] == pytest.approx(shown["scores"][order].tolist(), abs=1e-5)
    for prediction, box in zip(result.predictions, shown["boxes"][order].tolist(), strict=True):
        assert prediction.box == pytest.approx(box, abs=0.06)  # rows are rounded to 0.1 pixel


@pytest.mark.parametrize(
    "kind", [pytest.param("detr", marks=pytest.mark.quick), pytest.param("conditional_detr", marks=pytest.mark.slow)]
)
def test_attention_is_each_querys_last_layer_cross_attention_as_the_model_returns_it(request, kind) -> None:
    model = load_model(f"hf:{request.getfixturevalue(f'{kind}_folder')}")
    x = to_input_tensor(scene(), model.input_spec)[None]
    explainer = Explainer(model, None, ["attention", "gradcam"], score_threshold=0.0, max_detections=MOST)
    _, cams = explainer.compute_targets(x)
    output, activations = reference_pass(model, x, eager=True)
    height, width = activations.shape[-2:]
    last = output.cross_attentions[-1][0].mean(dim=0).detach()  # (queries, tokens), heads averaged
    chosen = top_queries(output.logits[0].detach(), kind == "detr", MOST)
    for k, (query, _) in enumerate(chosen):
        assert torch.allclose(cams["attention"][k][0][0], last[query].view(height, width), atol=1e-6), k
    together = sum(last[q].view(height, width) for q, _ in chosen)
    assert torch.allclose(cams["attention"][MOST][0][0], together, atol=1e-6)
    assert not torch.allclose(cams["attention"][0][0][0], cams["attention"][1][0][0])  # a map per query


@pytest.mark.quick
def test_rt_detrs_deformable_attention_is_refused_in_one_line_and_left_out_of_all(rt_detr_folder, tmp_path) -> None:
    path = tmp_path / "scene.png"
    scene().save(path)
    model = f"hf:{rt_detr_folder}"
    refused = CliRunner().invoke(app, [str(path), "--model", model, "--method", "attention", "-o", str(tmp_path)])
    assert refused.exit_code == EXIT_USAGE
    assert refused.output.startswith("error: --method attention is for classifiers; a detector takes gradcam, ")
    assert len(refused.output.splitlines()) == 1 and "drise" in refused.output
    explainer = Explainer(load_model(model), None, "all")
    assert "attention" not in explainer.chosen.methods and "drise" in explainer.chosen.methods
    assert "attention" not in ModelService(explainer.model).methods  # nor does gradcam serve offer it


def detections(output: Any, softmax: bool, size: tuple[int, int]) -> list[tuple[list[float], list[float]]]:
    """Every detection of a pass as D-RISE compares them: (box in input pixels, class probabilities)."""
    logits, boxes = output.logits[0].detach(), output.pred_boxes[0].detach()
    vectors = logits.softmax(-1)[:, :-1] if softmax else logits.sigmoid()
    height, width = size
    found = []
    for q, label in top_queries(logits, softmax, logits.shape[0]):
        cx, cy, w, h = boxes[q].tolist()
        corners = [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height]
        found.append((corners, vectors[q].tolist()))
        del label
    return found


@pytest.mark.slow
def test_drise_on_detr_matches_the_papers_formula(detr_folder) -> None:
    model = load_model(f"hf:{detr_folder}")
    x = to_input_tensor(scene(), model.input_spec)[None]
    options = PerturbationOptions(rise_masks=16, rise_grid=4, rise_probability=0.5, seed=1)
    mine = drise_maps(model, x, options, score_threshold=0.0, max_detections=2)
    size = (int(x.shape[-2]), int(x.shape[-1]))
    detr: Any = model.module.detr  # type: ignore[union-attr]

    def run(inputs: torch.Tensor) -> list[Detection]:
        with torch.no_grad():
            return [(box, vector, 1.0) for box, vector in detections(detr(pixel_values=inputs), True, size)]

    explained = run(x)[:2]
    totals = drise_reference(run, x, explained, rise_masks(16, 4, 0.5, size, 1), 0.5)
    for rank, total in enumerate(totals, 1):
        assert pearson(mine[rank], minmax(total)) >= REQUIRED, rank
    assert pearson(mine[0], minmax(sum(totals))) >= REQUIRED


@pytest.mark.slow
def test_the_cli_writes_a_row_and_overlay_per_query_and_gradcam_eval_scores_each_box(detr_folder, tmp_path) -> None:
    images = tmp_path / "in"
    images.mkdir()
    scene().save(images / "scene.png")
    out = tmp_path / "out"
    model = ["--model", f"hf:{detr_folder}", "--score-threshold", "0", "--max-detections", "2"]
    result = CliRunner().invoke(
        app, [str(images / "scene.png"), *model, "--method", "gradcam,attention", "-o", str(out), "--json"]
    )
    assert result.exit_code == EXIT_OK, result.output
    stage = "detr.model.backbone.model.encoder.stages.3"
    assert f"using layer {stage} (last stage of the backbone, the feature map the transformer reads;" in result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]  # a row per method and detection
    assert sorted(row["method"] for row in rows) == ["attention", "attention", "gradcam", "gradcam"]
    assert all(len(row["target"]["box"]) == 4 and row["target"]["name"] in CLASSES for row in rows)
    assert rows[0]["target"]["box"] != rows[2]["target"]["box"]  # two queries, two boxes
    written = sorted(p.name for p in out.iterdir() if p.suffix == ".png")
    assert [name for name in written if name.endswith("_boxes.png")] == [
        "scene_attention_boxes.png",
        "scene_gradcam_boxes.png",
    ]
    assert sum("_box1_" in name or "_box2_" in name for name in written) == 4, written
    evaluated = CliRunner().invoke(eval_app, [str(images), *model, "--method", "gradcam", "--steps", "4", "--json"])
    assert evaluated.exit_code == EXIT_OK, evaluated.output
    summary = json.loads(evaluated.stdout)["methods"]["gradcam"]["detections"]
    assert summary["count"] == 2
    offered = ModelService(load_model(f"hf:{detr_folder}")).methods  # gradcam serve's methods: the query attention
    assert {"gradcam", "attention", "drise"} <= set(offered) and "rollout" not in offered
