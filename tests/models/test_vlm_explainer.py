"""A prompted image through the one Explainer (issue 36): the answer task's score, the method registry's checks, a
method's map checked as an image's is (a NaN map fails its image, naming the method), and ``gradcam eval``'s one
entry (``evaluator_for``) giving the answer's evaluator. Tiny LLaVA (tests/vlm_models.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
import vlm_models
from PIL import Image
from vlm_models import answerer, load_vlm

from gradcam_cli.cam.explainer import Explainer
from gradcam_cli.cam.methods import METHODS
from gradcam_cli.cam.methods.registry import CamMethod, MapError, register_method
from gradcam_cli.cam.prompted import explain_prompt
from gradcam_cli.cam.tasks.answer import ANSWER, AnswerScore
from gradcam_cli.errors import EXIT_IMAGE_FAILED, UsageError
from gradcam_cli.evaluation.answers import AnswerEvaluator, answer_curves
from gradcam_cli.evaluation.choose import evaluator_for
from gradcam_cli.io.discovery import InputImage
from gradcam_cli.options import EvalOptions

PROMPT = "what is the cat ?"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return vlm_models.llava(tmp_path_factory.mktemp("llava"))


@pytest.fixture(scope="module")
def vlm(folder):
    return load_vlm(f"hf:{folder}", torch.device("cpu"))


def photo(left=(220, 30, 30)) -> Image.Image:
    image = Image.new("RGB", (96, 48), (30, 30, 220))
    image.paste(Image.new("RGB", (48, 48), left), (0, 0))
    return image


def nan_map(activations, gradients, *, eigen_smooth=False):
    """Grad-CAM's sum with one NaN."""
    summed = (activations * gradients).sum(1)
    summed[..., 0] = float("nan")
    return summed


@pytest.fixture
def nan_method():
    method = register_method(CamMethod("nan-answer", nan_map, uses_gradients=True))
    try:
        yield method.name
    finally:
        METHODS.unregister(method.name)


@pytest.mark.quick
def test_the_answer_is_the_score_of_the_one_explainer(vlm):
    """The answer task's adapter and score; its layer the family's; its methods the registry's, refused there."""
    explainer = answerer(vlm, methods=("layercam",))
    assert type(explainer) is Explainer and explainer.adapter is ANSWER
    assert isinstance(explainer.score, AnswerScore)
    assert explainer.chosen.layers == (vlm.layout.default_layer,)
    assert answerer(vlm, methods=("all",)).chosen.methods == tuple(
        name for name, method in METHODS.items() if method.needs is None and method.uses_layer
    )
    with pytest.raises(UsageError, match=r"^--method scorecam is for .*; a vision-language model takes gradcam, "):
        answerer(vlm, methods=("scorecam",))
    with pytest.raises(UsageError, match=r"^--prompt explains one --layer at a time$"):
        Explainer(vlm, ["model.multi_modal_projector", "model.multi_modal_projector.linear_1"])
    with pytest.raises(UsageError, match=r"answers a prompt about an image: explain it with explain_prompt"):
        explainer.explain(photo())


def test_a_methods_nan_map_fails_its_image_naming_the_method(vlm, folder, tmp_path, nan_method):
    """As an image's (check_maps): the method's NaN map is an error naming it; on the command line that image's row
    is an error naming the image, with no overlay written, exit 1."""
    explainer = answerer(vlm, methods=(nan_method,))
    layer = vlm.layout.default_layer
    with pytest.raises(MapError, match=rf"--method {nan_method} returned NaN values at layer .*, not a map"):
        explain_prompt(explainer, photo(), PROMPT, answer="a cat")

    from typer.testing import CliRunner

    from gradcam_cli.cli import app

    images = tmp_path / "in"
    images.mkdir()
    photo().save(images / "a.png")
    args = [str(images), "-m", f"hf:{folder}", "--prompt", PROMPT, "--answer", "a cat", "--method", nan_method]
    result = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "out"), "--json"])
    assert result.exit_code == EXIT_IMAGE_FAILED, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {images / 'a.png'}: --method {nan_method} returned NaN values at layer {layer}, not a map"
    ]
    assert not list((tmp_path / "out").glob("*.png"))


def test_gradcam_eval_of_an_answer_goes_through_evaluator_for(vlm, tmp_path):
    """The answer task's evaluator: its report's curves are answer_curves' of the answer's map, its target's
    probability the answer's per-token probability exp(log p / n)."""
    explainer = answerer(vlm, methods=("gradcam", "layercam"))
    evaluator = evaluator_for(explainer, EvalOptions(steps=4))
    assert isinstance(evaluator, AnswerEvaluator)
    path = tmp_path / "photo.png"
    photo().save(path)
    report = evaluator.run([InputImage(path, Path("photo"), prompt=PROMPT)])
    result = explain_prompt(explainer, photo(), PROMPT)
    (scores,) = report.images
    assert scores.error is None and list(scores.methods) == ["gradcam", "layercam"]
    assert report.methods == ["gradcam", "layercam"] and report.layers == [vlm.layout.default_layer]
    ids = [token.id for token in result.tokens]
    assert scores.target is not None
    assert scores.target.probability == pytest.approx(math.exp(result.logprob / len(ids)), rel=1e-4)
    for explained in result.maps:
        curves = answer_curves(explainer.score, photo(), PROMPT, ids, explained.saliency, 4)
        assert scores.methods[explained.method].deletion == pytest.approx(curves.deletion, abs=1e-5)
        assert scores.methods[explained.method].insertion == pytest.approx(curves.insertion, abs=1e-5)
