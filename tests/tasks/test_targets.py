"""--target: the grammar; every kind's map against Grad-CAM computed independently (the layer's output captured by a
forward hook of the test's own, the same score differentiated with ``torch.autograd.grad``); where each map must
peak; and the command line, errors included. The CLIP models of transformers and open_clip are tiny configurations
built here (test_target_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cam_reference import pearson
from PIL import Image
from square_model import square_image
from typer.testing import CliRunner

from gradcam_cli import Explainer, load_model
from gradcam_cli.cli import app
from gradcam_cli.cli.diff import app as diff_app
from gradcam_cli.cli.eval import app as eval_app
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.io.images import load_image, to_input_tensor
from gradcam_cli.targets import TargetSpec

HERE = Path(__file__).parents[1]
EMBED = f"{HERE / 'embedding_model.py'}:build"
EMBED_DICT = f"{HERE / 'embedding_model.py'}:build_dict"
SQUARE = f"{HERE / 'square_model.py'}:build"
RED, BLUE = (20, 20, 80, 80), (200, 140, 280, 220)
"""The red and the blue square of the ``scene``, (x1, y1, x2, y2)."""


def run(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def scene(tmp_path) -> Path:
    """A grey 320x240 image with a red and a blue square; ``ref.png``, a red square alone; ``refs/``, two of them;
    ``colours.txt``."""
    image = square_image(size=(320, 240), box=RED, colour="red")
    image.paste((20, 20, 230), BLUE)
    image.save(tmp_path / "scene.png")
    square_image(size=(200, 200), box=(60, 60, 140, 140), colour="red").save(tmp_path / "ref.png")
    (tmp_path / "refs").mkdir()
    square_image(size=(160, 160), box=(10, 10, 90, 90), colour="red").save(tmp_path / "refs" / "a.png")
    square_image(size=(160, 160), box=(70, 40, 150, 120), colour="green").save(tmp_path / "refs" / "b.png")
    (tmp_path / "colours.txt").write_text("red\ngreen\nblue\n", encoding="utf-8")
    return tmp_path / "scene.png"


def reference_gradcam(module, layer, inputs, score, signed=False):
    """Grad-CAM of ``score(output)`` at ``layer``: its output captured by a hook of this test, the gradient by
    ``torch.autograd.grad`` (w_k = mean g^k, L = ReLU(sum_k w_k A^k); ``signed``: without the ReLU)."""
    captured = []
    handle = layer.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        with torch.enable_grad():
            inputs = inputs.clone().requires_grad_(True)
            value = score(module(inputs)).sum()
            (gradient,) = torch.autograd.grad(value, captured[-1])
    finally:
        handle.remove()
    activations = captured[-1].detach()
    cam = (gradient.mean(dim=(2, 3), keepdim=True) * activations).sum(dim=1)
    return cam if signed else cam.clamp(min=0)


def peak(saliency: torch.Tensor) -> tuple[int, int]:
    """(x, y) of a map's maximum."""
    y, x = divmod(int(saliency.argmax()), saliency.shape[1])
    return x, y


def inside(point: tuple[int, int], box: tuple[int, int, int, int]) -> bool:
    return box[0] <= point[0] < box[2] and box[1] <= point[1] < box[3]


# ------------------------------------------------------------------------------------------------------ grammar


@pytest.mark.parametrize(
    ("text", "shown", "kinds"),
    [
        ("class:tiger cat", "class:tiger cat", {"class"}),
        ("CLASS: 3", "class:3", {"class"}),
        ("similar:refs/", "similar:refs/", {"similar"}),
        ("text:a photo of a dog", "text:a photo of a dog", {"text"}),
        ("contrast:husky,wolf", "contrast:husky,wolf", {""}),
        ("contrast:text:a dog, with a ball,text:a cat", "contrast:text:a dog, with a ball,text:a cat", {"text"}),
        ("output:2:neg", "output:2:neg", {"output"}),
        ("output:0", "output:0", {"output"}),
        ("Region:masks/liver.nii.gz", "region:masks/liver.nii.gz", {"region"}),
    ],
)
def test_grammar(text, shown, kinds):
    spec = TargetSpec.parse(text)
    assert str(spec) == shown
    assert spec.kinds() == kinds
    assert TargetSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("simlar:x.png", "Did you mean: similar"),
        ("tiger cat", "begins with its kind"),
        ("text:", "needs a value"),
        ("contrast:a,b,c", "one comma"),
        ("contrast:a,", "needs both"),
        ("output:x", "output's index"),
        ("output:1:sideways", "pos or neg"),
        ("contrast:contrast:a,b", "another kind"),
        ("contrast:region:m.nii.gz,class:1", "another kind"),
        ("region:", "region:MASK.nii.gz"),
    ],
)
def test_grammar_errors(text, message):
    with pytest.raises(ValueError, match=message):
        TargetSpec.parse(text)


# ------------------------------------------------------------------------------------------- maps and references


def embedding_of(module, path: Path) -> torch.Tensor:
    with torch.no_grad():
        return F.normalize(module(to_input_tensor(load_image(path), load_model(EMBED, "none").input_spec)[None]), dim=1)


def test_similarity_map_is_gradcam_of_the_cosine_and_peaks_on_the_shared_object(scene):
    model = load_model(EMBED, "none")
    explainer = Explainer(model, targets=[f"similar:{scene.parent / 'ref.png'}"])
    inputs = to_input_tensor(load_image(scene), model.input_spec)[None]
    reference = embedding_of(model.module, scene.parent / "ref.png")[0]
    expected = reference_gradcam(
        model.module, model.module.features, inputs, lambda out: F.normalize(out, dim=1) @ reference
    )
    _, cams = explainer.compute_targets(inputs)
    assert pearson(cams["gradcam"][0][0], expected) >= 0.999
    result = explainer.explain(scene)
    assert result.explanations[0].target.score == "cosine"
    assert result.explanations[0].target.name.startswith("similar:")
    assert inside(peak(result.explanations[0].saliency), RED)


@pytest.mark.slow
def test_a_folder_is_the_mean_of_its_embeddings(scene):
    model = load_model(EMBED, "none")
    folder = scene.parent / "refs"
    explainer = Explainer(model, targets=[f"similar:{folder}"])
    inputs = to_input_tensor(load_image(scene), model.input_spec)[None]
    concept = F.normalize(embedding_of(model.module, folder / "a.png") + embedding_of(model.module, folder / "b.png"))
    targets, _ = explainer.compute_targets(inputs)
    with torch.no_grad():
        expected = F.normalize(model.module(inputs), dim=1) @ concept[0]
    torch.testing.assert_close(targets.original(0), expected)


@pytest.mark.slow
def test_embedding_chooses_one_output_of_several(scene):
    model = load_model(EMBED_DICT, "none", task="classify")
    explainer = Explainer(model, targets=[f"similar:{scene.parent / 'ref.png'}"], embedding="embedding")
    inputs = to_input_tensor(load_image(scene), model.input_spec)[None]
    reference = F.normalize(
        model.module(to_input_tensor(load_image(scene.parent / "ref.png"), model.input_spec)[None])[
            "embedding"
        ].detach()
    )[0]
    expected = reference_gradcam(
        model.module, model.module.features, inputs, lambda out: F.normalize(out["embedding"], dim=1) @ reference
    )
    assert pearson(explainer.compute_targets(inputs)[1]["gradcam"][0][0], expected) >= 0.999


@pytest.mark.quick
def test_contrast_changes_sign_where_the_evidence_differs(scene, square_model):
    inputs = to_input_tensor(load_image(scene), square_model.input_spec)[None]
    explainer = Explainer(square_model, targets=["contrast:red,blue", "contrast:class:blue,class:red"])
    _, cams = explainer.compute_targets(inputs)
    signed = reference_gradcam(
        square_model.module, square_model.module.features, inputs, lambda out: out[:, 0] - out[:, 2], signed=True
    )[0]
    scale_y, scale_x = signed.shape[0] / 240, signed.shape[1] / 320
    red = signed[int(50 * scale_y), int(50 * scale_x)]
    blue = signed[int(180 * scale_y), int(240 * scale_x)]
    assert red > 0 > blue  # red's evidence counts for the contrast, blue's against it
    assert pearson(cams["gradcam"][0][0], signed.clamp(min=0)) >= 0.999
    assert pearson(cams["gradcam"][1][0], (-signed).clamp(min=0)) >= 0.999
    result = explainer.explain(scene)
    assert inside(peak(result.explanations[0].saliency), RED)
    assert inside(peak(result.explanations[1].saliency), BLUE)
    assert result.explanations[0].target.name == "red - blue"


@pytest.mark.slow
def test_output_targets_and_a_single_logit_head(scene, square_model):
    inputs = to_input_tensor(load_image(scene), square_model.input_spec)[None]
    cams = Explainer(square_model, targets=["output:2"]).compute_targets(inputs)[1]
    expected = reference_gradcam(square_model.module, square_model.module.features, inputs, lambda out: out[:, 2])
    assert pearson(cams["gradcam"][0][0], expected) >= 0.999
    binary = square_model.module  # one logit: red for, blue against
    binary.fc = torch.nn.Linear(3, 1)
    with torch.no_grad():
        binary.fc.weight.copy_(torch.tensor([[4.0, 0.0, -4.0]]))
    explainer = Explainer(binary, targets=["output:0", "output:0:neg"])
    cams = explainer.compute_targets(inputs)[1]["gradcam"]
    for k, sign in enumerate((1, -1)):
        expected = reference_gradcam(binary, binary.features, inputs, lambda out, sign=sign: sign * out[:, 0])
        assert pearson(cams[k][0], expected) >= 0.999
    result = explainer.explain(scene)
    assert inside(peak(result.explanations[0].saliency), RED)
    assert inside(peak(result.explanations[1].saliency), BLUE)


@pytest.mark.slow
def test_finercam_is_gradcam_of_the_class_minus_its_weighted_rivals(scene, square_model):
    inputs = to_input_tensor(load_image(scene), square_model.input_spec)[None]
    explainer = Explainer(square_model, methods="finercam", targets=["class:red"])

    def finer(out):
        rivals = out[:, 1:]
        return out[:, 0] - (rivals.detach().softmax(dim=1) * rivals).sum(dim=1)

    expected = reference_gradcam(square_model.module, square_model.module.features, inputs, finer)
    assert pearson(explainer.compute_targets(inputs)[1]["finercam"][0][0], expected) >= 0.999
    # without --target, each image's top class against its rivals, as --target-class would choose it
    plain = Explainer(square_model, methods="finercam").compute_targets(inputs)[1]["finercam"][0][0]
    assert plain.shape == expected.shape[1:] or plain.shape == expected.shape


@pytest.mark.slow
@pytest.mark.parametrize("method", ["scorecam", "ablationcam", "gradcam++", "layercam"])
def test_every_method_that_takes_a_score_explains_a_similarity(scene, method):
    model = load_model(EMBED, "none")
    explainer = Explainer(model, methods=method, targets=[f"similar:{scene.parent / 'ref.png'}"])
    assert inside(peak(explainer.explain(scene).explanations[0].saliency), RED)


# ------------------------------------------------------------------------------------------------- command line


@pytest.mark.slow
def test_cli_similarity_json_manifest_diff_and_gallery(scene, tmp_path):
    out, manifest = tmp_path / "out", tmp_path / "m.jsonl"
    ref = scene.parent / "ref.png"
    args = (scene, "--model", EMBED, "--weights", "none", "--target", f"similar:{ref}", "--json")
    result = run(*args, "-o", out, "--manifest", manifest, "--report")
    assert result.exit_code == EXIT_OK, result.output
    row = json.loads(result.stdout.splitlines()[0])
    assert row["target"]["name"] == "similar:ref.png" and row["target"]["score"] == "cosine"
    assert -1.0 <= row["target"]["probability"] <= 1.0
    assert json.loads(manifest.read_text().splitlines()[0])["target"] == row["target"]
    assert (out / "index.html").is_file() and "similar" in (out / "index.html").read_text()
    assert run(*args, "-o", tmp_path / "again", "--manifest", tmp_path / "n.jsonl").exit_code == EXIT_OK
    assert CliRunner().invoke(diff_app, [str(manifest), str(tmp_path / "n.jsonl")]).exit_code == EXIT_OK


@pytest.mark.slow
def test_cli_contrast_and_output_lines(scene, tmp_path):
    labels = scene.parent / "colours.txt"
    result = run(
        scene,
        "--model",
        SQUARE,
        "--weights",
        "none",
        "--labels",
        labels,
        "--target",
        "contrast:red,blue",
        "--target",
        "output:1:neg",
        "-o",
        tmp_path / "out",
    )
    assert result.exit_code == EXIT_OK, result.output
    assert "gradcam for red - blue (difference" in result.stdout
    assert "gradcam for output:1:neg (output" in result.stdout
    assert len(list((tmp_path / "out").glob("scene_gradcam_*.png"))) == 2


@pytest.mark.quick
@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        (SQUARE, ["--target", "text:a dog"], "has no text tower"),
        pytest.param(EMBED, ["--target", "class:red"], "has no class names", marks=pytest.mark.slow),
        (SQUARE, ["--target", "simlar:x.png"], "Did you mean: similar"),
        pytest.param(SQUARE, ["--target", "class:red", "--top-k", "2"], "--top-k", marks=pytest.mark.slow),
        (SQUARE, ["--target", "class:rde"], "Did you mean: red"),
        (SQUARE, ["--target", "class:red", "--skip-existing"], "needs --manifest"),
        pytest.param(
            SQUARE, ["--target", "class:red", "--target-class", "red"], "--target-class", marks=pytest.mark.slow
        ),
        pytest.param(EMBED, ["--target", "similar:missing.png"], "does not exist", marks=pytest.mark.slow),
        (EMBED, ["--target", "similar:REF", "--method", "finercam"], "has none"),
        pytest.param(SQUARE, ["--target", "output:7"], "has no output 7", marks=pytest.mark.slow),
        pytest.param(
            EMBED_DICT,
            ["--target", "similar:REF", "--embedding", "embeding"],
            "Did you mean: embedding",
            marks=pytest.mark.slow,
        ),
        pytest.param(EMBED_DICT, ["--target", "similar:REF"], "--embedding", marks=pytest.mark.slow),
    ],
    ids=lambda value: Path(value).name.replace(".py:", "-") if isinstance(value, str) and ".py:" in value else None,
)
def test_cli_mistakes_are_one_line(scene, tmp_path, model, args, message):
    args = [arg.replace("REF", str(scene.parent / "ref.png")) for arg in args]
    labels = ["--labels", scene.parent / "colours.txt"] if model == SQUARE else []
    result = run(scene, "--model", model, "--weights", "none", *labels, *args, "-o", tmp_path / "out")
    assert result.exit_code == EXIT_USAGE, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


@pytest.mark.slow
def test_batch_reads_the_reference_once_and_eval_scores_the_similarity(scene, tmp_path, monkeypatch):
    from gradcam_cli.cam import embeddings

    folder = tmp_path / "batch"
    folder.mkdir()
    for name in ("a", "b", "c"):
        load_image(scene).save(folder / f"{name}.png")
    reads = []
    monkeypatch.setattr(embeddings, "load_image", lambda path: reads.append(path) or load_image(path))
    ref = scene.parent / "ref.png"
    result = run(
        folder,
        "-m",
        EMBED,
        "--weights",
        "none",
        "--target",
        f"similar:{ref}",
        "--batch-size",
        "2",
        "-o",
        tmp_path / "out",
        "--json",
    )
    assert result.exit_code == EXIT_OK, result.output
    assert reads == [ref]  # once per run, not per image or batch
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 3 and len({row["target"]["probability"] for row in rows}) == 1
    result = CliRunner().invoke(
        eval_app, [str(scene), "-m", EMBED, "--weights", "none", "--target", f"similar:{ref}", "--steps", "4", "--json"]
    )
    assert result.exit_code == EXIT_OK, result.output
    report = json.loads(result.stdout)
    image = report["per_image"][0]
    assert image["target"]["name"] == "similar:ref.png"
    curve = image["methods"]["gradcam"]["deletion_curve"]
    assert curve[0] == pytest.approx(rows[0]["target"]["probability"], abs=1e-5)  # the cosine, deleted step by step
    assert curve[-1] < curve[0]


def test_a_targets_files_follow_max_side_and_its_row_names_the_target(scene, tmp_path):
    """docs/batch.md, Large images: a --target's map and overlay are made at the shrunk size (320 x 240 at
    --max-side 64: 64 x 48); its row is the one a full-size run gives."""
    ref = scene.parent / "ref.png"
    args = (scene, "--model", EMBED, "--weights", "none", "--target", f"similar:{ref}", "--json", "--save-raw")
    result = run(*args, "-o", tmp_path / "out", "--max-side", "64")
    assert result.exit_code == EXIT_OK, result.output
    row = json.loads(result.stdout.splitlines()[0])
    overlay, raw = (Path(path) for path in row["outputs"][:2])
    assert row["fingerprint"]["size"] == [48, 64] and np.load(raw).shape == (48, 64)
    assert Image.open(overlay).size == (64, 48)
    full = json.loads(run(*args, "-o", tmp_path / "full", "--max-side", "0").stdout.splitlines()[0])
    assert row["target"]["name"] == full["target"]["name"] == "similar:ref.png"
    assert row["target"]["probability"] == pytest.approx(full["target"]["probability"], abs=0.05)


def test_diff_reports_a_changed_similar_target_as_a_target_change(scene, tmp_path):
    """Two runs of an embedding model, similar:a.png then similar:b.png: a target change (drift, exit 1), as a changed
    class is, however alike the maps; the same target on both sides is no drift."""
    refs = scene.parent / "refs"
    manifests = {}
    for name in ("a", "b"):
        manifests[name] = tmp_path / f"{name}.jsonl"
        args = (scene, "--model", EMBED, "--weights", "none", "--target", f"similar:{refs / name}.png")
        result = run(*args, "-o", tmp_path / name, "--manifest", manifests[name])
        assert result.exit_code == EXIT_OK, result.output
    changed = CliRunner().invoke(diff_app, [str(manifests["a"]), str(manifests["b"])])
    assert changed.exit_code == 1, changed.output
    assert "target similar:a.png -> similar:b.png" in changed.output
    same = CliRunner().invoke(diff_app, [str(manifests["a"]), str(manifests["a"])])
    assert same.exit_code == EXIT_OK, same.output


def test_a_dict_output_model_is_an_embedding_model_for_contrasts_and_classes(scene, tmp_path):
    """docs/targets.md: a custom model returning a dict is an embedding model once --target is given: a contrast of
    references works (its parts without a kind are references too), a class is refused for want of a class head."""
    refs = scene.parent / "refs"
    base = (scene, "--model", EMBED_DICT, "--weights", "none", "--embedding", "embedding", "--json")
    for contrast in (f"contrast:similar:{refs / 'a.png'},similar:{refs / 'b.png'}", f"contrast:{refs / 'a.png'},b.png"):
        result = run(*base, "--target", contrast.replace(",b.png", f",{refs / 'b.png'}"), "-o", tmp_path / "out")
        assert result.exit_code == EXIT_OK, result.output
        row = json.loads(result.stdout.splitlines()[0])
        assert row["target"]["name"] == "similar:a.png - similar:b.png" and row["target"]["score"] == "difference"
    for more in (["--embedding", "embedding"], []):
        args = (scene, "--model", EMBED_DICT, "--weights", "none", *more, "--target", "class:1", "-o", tmp_path / "x")
        refused = run(*args)
        assert refused.exit_code == EXIT_USAGE, refused.output
        assert "has no class head (it embeds images); use similar: targets" in refused.stderr
