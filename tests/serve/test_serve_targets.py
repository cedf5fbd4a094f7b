"""``gradcam serve`` with ``--target`` (issue 23's grammar on the page): maps of typed targets equal the library's,
``similar:`` reads only served images, a bad target is a one-line 4xx and the server keeps serving, and the
command's (or a run record's) targets are the page's defaults."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from gradcam_cli import Explainer
from gradcam_cli.cli.serve import app as serve_app
from gradcam_cli.cli.serve import record_targets
from gradcam_cli.errors import EXIT_OK, EXIT_USAGE
from gradcam_cli.io.discovery import discover
from gradcam_cli.models.loading import load_model
from gradcam_cli.serve import ModelService, create_app
from gradcam_cli.targets import TargetSpec

HERE = Path(__file__).parents[1]
EMBED = f"{HERE / 'embedding_model.py'}:build"
LOCAL = "http://127.0.0.1:8765"


@pytest.fixture
def served(tmp_path) -> Path:
    """``served/scene.png`` (grey, a red and a blue square), ``served/ref.png`` (a red square); ``outside.png``, a
    readable image that is not served."""
    folder = tmp_path / "served"
    folder.mkdir()
    scene = Image.new("RGB", (64, 48), (128, 128, 128))
    scene.paste((255, 0, 0), (4, 4, 24, 24))
    scene.paste((20, 20, 230), (36, 20, 60, 44))
    scene.save(folder / "scene.png")
    ref = Image.new("RGB", (40, 40), (128, 128, 128))
    ref.paste((255, 0, 0), (10, 10, 30, 30))
    ref.save(folder / "ref.png")
    ref.save(tmp_path / "outside.png")
    return folder


def npy(client: TestClient, answer: dict) -> np.ndarray:
    return np.load(io.BytesIO(client.get(f"/api/maps/{answer['id']}/map.npy").content))


def one_line_error(answer, *words: str) -> None:
    assert 400 <= answer.status_code < 500, answer.text
    message = answer.json()["error"]
    assert "\n" not in message and all(word in message for word in words), message


def test_similar_map_equals_the_library_and_reads_only_served_images(served, tmp_path):
    model = load_model(EMBED, "none", task="classify")
    model = model.with_profile(embeds=True)  # as timm's num_classes=0 or a Hugging Face embedder: no classes at all
    app = create_app(ModelService(model), discover([str(served)]), work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as client:
        info = client.get("/api/info").json()["model"]
        assert (info["kind"], info["targets"]) == ("embed", [])
        ids = {Path(i["name"]).name: i["id"] for i in client.get("/api/images").json()["images"]}
        scene = ids["scene.png"]
        one_line_error(client.get(f"/api/map?image={scene}"), "similar:")  # no classes: a target is needed

        answer = client.get(f"/api/map?image={scene}&target=similar:ref.png").json()
        assert answer["spec"] == "similar:ref.png" and answer["predictions"] == []  # no top-k list
        assert answer["target"]["name"] == "similar:ref.png"
        expected = Explainer(model, targets=[f"similar:{served / 'ref.png'}"]).explain(served / "scene.png")
        saliency = expected.explanations[0].saliency.numpy()
        assert np.abs(npy(client, answer) - saliency).max() < 1e-4
        assert answer["target"]["probability"] == pytest.approx(expected.explanations[0].target.probability)
        by_id = client.get(f"/api/map?image={scene}&target=similar:{ids['ref.png']}").json()
        assert by_id["id"] == answer["id"]  # the same reference, named by its id

        for outside in (tmp_path / "outside.png", "../outside.png", "/etc/passwd", "%2e%2e/outside.png"):
            one_line_error(client.get(f"/api/map?image={scene}&target=similar:{outside}"), "not a served image")
        one_line_error(client.get(f"/api/map?image={scene}&target=contrast:similar:ref.png,similar:{tmp_path}"))
        one_line_error(client.get(f"/api/map?image={scene}&target=simlar:ref.png"), "Did you mean: similar")
        one_line_error(client.get(f"/api/map?image={scene}&target=class:red"), "no class head")
        again = client.get(f"/api/map?image={scene}&target=similar:ref.png")  # the server keeps serving
        assert again.status_code == 200 and again.json()["id"] == answer["id"]


@pytest.mark.quick
def test_contrast_and_output_on_a_classifier_equal_the_library(square_model, tmp_path):
    app = create_app(ModelService(square_model), work_dir=tmp_path / "work")
    image = Image.new("RGB", (64, 48), (128, 128, 128))
    image.paste((255, 0, 0), (4, 4, 24, 24))
    image.paste((20, 20, 230), (36, 20, 60, 44))
    data = io.BytesIO()
    image.save(data, "PNG")
    with TestClient(app, base_url=LOCAL) as client:
        image_id = client.post("/api/upload?name=s.png", content=data.getvalue()).json()["id"]
        top = client.get(f"/api/map?image={image_id}").json()
        assert top["spec"] is None and top["predictions"]
        for spec in ("contrast:red,blue", "output:2:neg"):
            answer = client.get(f"/api/map?image={image_id}&target={spec}").json()
            assert answer["forward"] is False and answer["spec"] == spec  # replayed: no forward pass
            expected = Explainer(square_model, targets=[spec]).explain(image).explanations[0]
            assert answer["target"]["name"] == expected.target.name
            assert np.abs(npy(client, answer) - expected.saliency.numpy()).max() < 1e-4
        one_line_error(client.get(f"/api/map?image={image_id}&target=contrast:red,purpel"), "purpel")
        one_line_error(client.get(f"/api/map?image={image_id}&target=text:a dog"), "no text tower")
        assert client.get(f"/api/map?image={image_id}&target=red").json()["target"]["name"] == "red"


def test_command_targets_are_the_defaults(served, monkeypatch):
    ref = served / "ref.png"
    answers = []

    def serve(app, sock, started):  # what the command serves, asked while it would be serving
        with TestClient(app, base_url=LOCAL) as client:
            answers.append(client.get("/api/info").json()["model"]["targets"])
            answers.append(client.get("/api/map?image=i0").json())  # no target: the first default
            answers.append(client.get(f"/api/map?image=i0&target=similar:{ref}").json())  # a default, as given

    monkeypatch.setattr("gradcam_cli.serve.server.serve", serve)
    args = [str(served / "scene.png"), "-m", EMBED, "--weights", "none", "--port", "0", "-q"]
    result = CliRunner().invoke(serve_app, [*args, "--target", f"similar:{ref}", "--target", "output:3"])
    assert result.exit_code == EXIT_OK, result.output
    targets, first, typed = answers
    assert targets == [f"similar:{ref}", "output:3"]
    assert first["spec"] == f"similar:{ref}" and first["target"]["name"] == "similar:ref.png"
    assert typed["id"] == first["id"]
    mistake = CliRunner().invoke(serve_app, [*args, "--target", "ouput:3"])
    assert mistake.exit_code == EXIT_USAGE and "Did you mean: output" in mistake.output
    assert mistake.output.count("\n") == 1 and len(answers) == 3


def test_a_run_records_targets():
    record = {"targets": "similar:refs/ | contrast:red,blue", "embedding": "embedding"}
    assert record_targets(record) == [TargetSpec.parse("similar:refs/"), TargetSpec.parse("contrast:red,blue")]
    assert record_targets({}) == [] and record_targets({"targets": "bad"}) == []


def colour_clip():
    """A CLIP-style model built here: the colour embedding as its image tower, a text tower that embeds a prompt
    naming a colour as that colour's axis (and the embedding's constant), prompts ranked by softmax."""
    import torch
    from embedding_model import build
    from torch import nn

    from gradcam_cli.io.images import InputSpec
    from gradcam_cli.models.loading import LoadedModel
    from gradcam_cli.models.text_tower import TextTower

    colours = ["red", "green", "blue"]

    def tokenize(prompts: list[str]) -> dict[str, torch.Tensor]:
        return {"ids": torch.tensor([next(i for i, c in enumerate(colours) if c in p) for p in prompts])}

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([nn.functional.one_hot(ids, 3).float(), torch.full((len(ids), 1), 0.1)], dim=1)

    prompts = [f"a {colour} square" for colour in colours]
    text = TextTower(nn.Identity(), tokenize, embed, logit_scale=10.0)
    spec = InputSpec(mean=(0, 0, 0), std=(1, 1, 1))
    return LoadedModel(build(), "colour-clip", "none", prompts, spec, embeds=True, text=text)


def test_a_clip_models_prompts_are_ranked_and_clicked_as_classes(served, tmp_path):
    model = colour_clip()
    app = create_app(ModelService(model), discover([str(served)]), work_dir=tmp_path / "work")
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/api/info").json()["model"]["kind"] == "clip"
        scene = next(i["id"] for i in client.get("/api/images").json()["images"] if i["name"].endswith("scene.png"))
        top = client.get(f"/api/map?image={scene}").json()
        assert {p["name"] for p in top["predictions"]} == {"a red square", "a green square", "a blue square"}
        blue = next(p for p in top["predictions"] if p["name"] == "a blue square")
        clicked = client.get(f"/api/map?image={scene}&target={blue['index']}").json()  # a click on a prompt
        expected = Explainer(model).explain(served / "scene.png", target=blue["index"]).explanations[0]
        assert clicked["target"]["name"] == "a blue square" and clicked["spec"] is None
        assert np.abs(npy(client, clicked) - expected.saliency.numpy()).max() < 1e-4
        typed = client.get(f"/api/map?image={scene}&target=text:a blue square").json()
        library = Explainer(model, targets=["text:a blue square"]).explain(served / "scene.png").explanations[0]
        assert typed["target"]["name"] == "text:a blue square"
        assert np.abs(npy(client, typed) - library.saliency.numpy()).max() < 1e-4
